"""``manage.py run_consumer package.module:consumer``: the ``dispatcher-consumer`` runner (its
arguments, loader and lifecycle, from ``consumers_sdk.__main__``) inside a configured Django, so
handlers can use the ORM. SIGTERM or SIGINT stops it gracefully; a bad target is a CommandError
with exit code 2, as the runner's."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from consumers_sdk import __main__ as runner


class Command(BaseCommand):
    help = (
        "Run a consumers_sdk Consumer until SIGTERM or SIGINT, then let the running handlers "
        "finish; the flags override the pace the Consumer was built with."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        runner.add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        settings = argparse.Namespace(**options)
        try:
            consumer = runner.prepare(settings)
        except (runner.BadTarget, ValueError) as exc:
            raise CommandError(str(exc), returncode=2) from None
        runner.run(consumer, settings)
