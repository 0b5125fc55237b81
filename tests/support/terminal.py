"""A command run in a real pseudo-terminal of a given size, and the screen a person would read:
what the process believes is a terminal (isatty, its width) is the kernel's, not a stub's."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import termios
import time
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Screen:
    code: int
    raw: str  # as the terminal received it: carriage returns, the pty's \r\n

    @property
    def lines(self) -> list[str]:
        """The lines as they stay on screen: a carriage return goes back to the line's start and
        what follows overwrites what was there (how a progress bar redraws itself)."""
        shown = []
        for line in self.raw.replace("\r\n", "\n").split("\n"):
            visible = ""
            for part in line.split("\r"):
                visible = part + visible[len(part) :]
            shown.append(visible)
        while shown and not shown[-1]:
            shown.pop()
        return shown

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def run(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    columns: int,
    rows: int = 50,
    timeout_s: float = 60.0,
) -> Screen:
    """Runs ``argv`` with stdin, stdout and stderr on a new pty of ``columns`` x ``rows`` and
    returns everything it wrote. Blocking: call it through ``asyncio.to_thread``."""
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    # The width comes from the terminal alone, as for a person at one.
    clean = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    try:
        process = subprocess.Popen(
            list(argv), stdin=terminal, stdout=terminal, stderr=terminal, env=clean
        )
    finally:
        os.close(terminal)
    received = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([controller], [], [], remaining)[0]:
                process.kill()
                process.wait()
                raise TimeoutError(f"{argv} still running after {timeout_s}s: {received!r}")
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every copy of the terminal's side is closed
                break
            if not chunk:
                break
            received += chunk
        code = process.wait(timeout_s)
    finally:
        os.close(controller)
    return Screen(code, received.decode())
