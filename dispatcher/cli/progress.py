"""A progress bar on stderr, redrawn in place, so that stdout keeps only the results."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

WIDTH = 30


def draw(done: int, total: int) -> None:
    filled = WIDTH * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (WIDTH - filled)}] {done}/{total}")
    sys.stderr.flush()


@contextmanager
def drawn() -> Iterator[None]:
    """Ends the bar's line when the work ends, however it ends."""
    try:
        yield
    finally:
        sys.stderr.write("\n")
