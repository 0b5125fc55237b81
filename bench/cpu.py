"""CPU time of processes and their descendants, read from /proc (user + system, in seconds)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process, with those of its children it reaped (a
    PostgreSQL backend that exited is counted in its postmaster's)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    utime, stime, cutime, cstime = (int(field) for field in fields[11:15])
    return int(fields[1]), (utime + stime + cutime + cstime) * TICK_S


def tree_seconds(roots: Iterable[int]) -> float:
    """The CPU seconds of ROOTS and every live descendant, and of the descendants they reaped."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    wanted = set(roots)
    grew = True
    while grew:
        more = {pid for pid, (parent, _) in stats.items() if parent in wanted} - wanted
        wanted |= more
        grew = bool(more)
    return sum(stats[pid][1] for pid in wanted if pid in stats)
