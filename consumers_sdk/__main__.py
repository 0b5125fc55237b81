"""The consumer runner: ``dispatcher-consumer package.module:consumer`` (the console script) or
``python -m consumers_sdk package.module:consumer`` runs that Consumer until SIGTERM/SIGINT, its
pace overridden by the flags. It lives in ``__main__`` so that both names run the same code."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Sequence

from consumers_sdk import logs
from consumers_sdk.consumer import Consumer, install_stop_signals, remove_stop_signals

PROG = "dispatcher-consumer"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class BadTarget(Exception):
    """TARGET names no Consumer: said in one line, exit code 2."""


def _version() -> str:
    try:
        return importlib.metadata.version("delay-dispatcher-sdk")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError("must be positive")
    return value


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """Every option of the runner; the docs' CLI reference walks it too."""
    parser = argparse.ArgumentParser(
        prog=prog,
        # Lines short enough for a 60-column terminal: argparse does not rewrap these.
        description="Run a consumers_sdk Consumer until SIGTERM or SIGINT,\n"
        "then stop taking deliveries and let the running handlers\n"
        "finish (up to its stop_timeout_s). The flags override\n"
        "the pace the Consumer was built with.",
        epilog=f"example:\n  {prog} billing.consumers:consumer \\\n"
        "      --prefetch 64 --concurrency 16 --max-per-second 200",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.add_argument(
        "--version", action="version", version=f"{prog} {_version()}", help="print the release"
    )
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """TARGET and the flags: this runner's, and Django's ``manage.py run_consumer``'s."""
    parser.add_argument(
        "target",
        metavar="TARGET",
        help="the Consumer to run, as package.module:attribute (imported from --app-dir first)",
    )
    parser.add_argument(
        "--prefetch",
        metavar="N",
        type=_positive_int,
        default=None,
        help="unacked deliveries RabbitMQ sends ahead (default: the Consumer's)",
    )
    parser.add_argument(
        "--concurrency",
        metavar="N",
        type=_positive_int,
        default=None,
        help="handlers running at once, at most --prefetch (default: the Consumer's or prefetch)",
    )
    parser.add_argument(
        "--max-per-second",
        metavar="RATE",
        type=_positive_float,
        default=None,
        help="at most this many handler starts a second (default: the Consumer's, else no limit)",
    )
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO",
        help="the lowest level logged to stderr: DEBUG, INFO, WARNING or ERROR (default: INFO)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text lines, or one JSON object a line for log shippers (default: text)",
    )
    parser.add_argument(
        "--app-dir",
        metavar="DIR",
        default=".",
        help="a folder put first on the import path, as 'python -m' does with the current one "
        "(default: the current folder)",
    )


def load(target: str) -> Consumer:
    """The Consumer that ``package.module:attribute`` names. A module missing is a BadTarget; an
    error raised while the module runs is the module's own and keeps its traceback."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise BadTarget(f"TARGET {target!r} is not package.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not f"{module_name}.".startswith(f"{exc.name}."):
            raise  # the module exists; something it imports does not
        raise BadTarget(f"no module {module_name!r} (from TARGET {target!r})") from None
    consumer = getattr(module, attribute, None)
    if consumer is None:
        raise BadTarget(f"module {module_name!r} has no attribute {attribute!r}")
    if not isinstance(consumer, Consumer):
        kind = type(consumer).__name__
        raise BadTarget(f"{target} is a {kind}, not a consumers_sdk.Consumer")
    return consumer


def prepare(args: argparse.Namespace) -> Consumer:
    """The Consumer that ``args.target`` names, paced by the flags; BadTarget or ValueError when
    there is none or a flag does not fit it."""
    sys.path.insert(0, os.path.abspath(args.app_dir))
    consumer = load(args.target)
    consumer.configure(
        prefetch=args.prefetch,
        concurrency=args.concurrency,
        max_per_second=args.max_per_second,
    )
    return consumer


def run(consumer: Consumer, args: argparse.Namespace) -> None:
    """Log to stderr at ``--log-level`` and consume until SIGTERM or SIGINT."""
    logs.configure(args.log_level, json=args.log_format == "json")
    asyncio.run(_serve(consumer, args))


async def _serve(consumer: Consumer, args: argparse.Namespace) -> None:
    # The stop signals are installed before the line that says the runner is running: a
    # supervisor that sends SIGTERM as soon as it reads the line gets a graceful stop, not a kill.
    signals = install_stop_signals(consumer.stop)
    try:
        logging.getLogger(__name__).info(
            "running %s: group %s, prefetch %d, concurrency %d, max %s/s",
            args.target,
            consumer.group,
            consumer.prefetch,
            consumer.concurrency,
            consumer.max_per_second or "unlimited",
        )
        await consumer.run(handle_signals=False)
    finally:
        remove_stop_signals(signals)


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        consumer = prepare(args)
    except (BadTarget, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    run(consumer, args)
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m consumers_sdk"))
