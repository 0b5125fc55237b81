"""A progress bar on stderr, so that stdout keeps only the results. It is drawn only when stderr
is a terminal: redrawn in place with carriage returns, which a pipe or a log file would keep as
noise, so there nothing is drawn at all."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

WIDTH = 30


def render(done: int, total: int, columns: int) -> str:
    """``[#####.....] 5/10``, the bar narrowed so that the line fits ``columns``."""
    counter = f" {done}/{total}"
    width = max(0, min(WIDTH, columns - len(counter) - 3))
    if width < 5:  # no room for a bar worth drawing: the counter alone
        return counter.strip()
    filled = width * min(done, total) // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}]{counter}"


class Bar:
    """Call it with ``(done, total)`` after each step (the signature ``dlq.requeue`` takes)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr
        self.enabled = self._stream.isatty()
        self._drawn = False  # the cursor sits at the end of a drawn bar

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        columns = shutil.get_terminal_size().columns
        self._stream.write(f"\r{render(done, total, columns)}")
        self._stream.flush()
        self._drawn = True

    def say(self, text: str) -> None:
        """A line of its own on the stream (an error, say), not glued to the bar."""
        self.end()
        print(text, file=self._stream)

    def end(self) -> None:
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = False


@contextmanager
def bar() -> Iterator[Bar]:
    """A bar whose line is ended when the work ends, however it ends."""
    drawn = Bar()
    try:
        yield drawn
    finally:
        drawn.end()
