"""One process's wall clock moved the way a broken NTP moves a host's: libfaketime (Debian's
``faketime`` package, installed by ``make test``) preloaded into it.

The offset is read from a file on every call (``FAKETIME_NO_CACHE``), so a test steps the clock of
a running process by writing it. The monotonic clock is left alone
(``FAKETIME_DONT_FAKE_MONOTONIC``): a host whose time is wrong or stepped still has a monotonic
clock that is not, and faking it would step every timer of the process, which no NTP failure
does."""

from __future__ import annotations

from pathlib import Path

LIBRARIES = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))


class FakeClock:
    """The wall clock of the processes started with ``env``: OFFSET (libfaketime's format,
    ``+20s``, ``-60s``, ``+1h``) from the true one until ``set`` says otherwise."""

    def __init__(self, directory: Path, offset: str, *, name: str = "clock") -> None:
        if not LIBRARIES:
            raise RuntimeError("libfaketime is missing: make test installs it (package faketime)")
        self._file = directory / f"faketime-{name}"
        self.set(offset)
        self.env = {
            "LD_PRELOAD": str(LIBRARIES[0]),
            "FAKETIME_TIMESTAMP_FILE": str(self._file),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def set(self, offset: str) -> None:
        """Step the clock: written whole, then moved into place (a reader never sees half)."""
        partial = self._file.with_suffix(".new")
        partial.write_text(f"{offset}\n")
        partial.replace(self._file)
