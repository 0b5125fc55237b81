"""Command line: ``dispatcher serve | migrate | keys | dlq | broker | jobs | schedules | cluster |
stats``."""

from dispatcher.cli.main import main

__all__ = ["main"]
