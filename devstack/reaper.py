"""Nothing a test run started outlives it, however the run ends.

Every process a run starts inherits one variable, ``DISPATCHER_RUN_MARK``, from its environment:
the run's mark, or a mark below it (``run/worker``, ``run/worker/test``). Process groups are not
enough to find them again: ``pg_ctl`` starts PostgreSQL in a session of its own, and a dead
parent's children are re-parented to init. The environment a process was started with
(``/proc/PID/environ``) stays readable whatever it did since, so a mark finds them all.

``watch(mark)`` starts a small process that waits for its starter to die (the pipe between them
closes, even after SIGKILL) and then kills every process carrying the mark or one below it.

    python -m devstack.reaper MARK      kill every process carrying MARK (or one below it)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

MARK: Final = "DISPATCHER_RUN_MARK"
# Shared by every RabbitMQ node on the machine, whoever started it first: killing it would
# unregister the nodes of other runs, whose `rabbitmqctl` calls would then fail.
SPARED: Final = frozenset({"epmd"})
PROC: Final = Path("/proc")


def current() -> str | None:
    return os.environ.get(MARK)


def below(parent: str | None, label: str) -> str:
    """A new mark under PARENT (a fresh top-level one without a parent)."""
    name = f"{label}-{uuid.uuid4().hex[:8]}"
    return f"{parent}/{name}" if parent else name


def marked(mark: str | None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """ENV (this process's environment by default) carrying MARK instead of its own. A server
    controller keeps the mark it was made under, so that a session's server restarted during
    one test still belongs to the session."""
    base = dict(os.environ if env is None else env)
    if mark is None:
        base.pop(MARK, None)
    else:
        base[MARK] = mark
    return base


def _is_under(value: str, mark: str) -> bool:
    return value == mark or value.startswith(f"{mark}/")


def _mark_of(pid: int) -> str | None:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or a kernel thread
        return None
    prefix = f"{MARK}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def _name_of(pid: int) -> str:
    try:
        return (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def carriers(mark: str) -> dict[int, str]:
    """The live processes started under MARK (or a mark below it), by pid, with their names;
    never this process, never a shared one (SPARED)."""
    found = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or (pid := int(entry.name)) == os.getpid():
            continue
        value = _mark_of(pid)
        if value is not None and _is_under(value, mark) and (name := _name_of(pid)) not in SPARED:
            found[pid] = name
    return found


def reap(mark: str) -> dict[int, str]:
    """SIGKILL every carrier of MARK and return what was found. A carrier that leads its own
    process group takes the group with it: a process may overwrite the environment it was
    started with (PostgreSQL's backends write their titles over it), its group it cannot."""
    found = carriers(mark)
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    return found


def watch(mark: str) -> subprocess.Popen[bytes]:
    """A process that reaps MARK once this one has died. Keep the returned handle: its pipe is
    what tells the watcher this process is alive."""
    env = {name: value for name, value in os.environ.items() if name != MARK}
    return subprocess.Popen(
        [sys.executable, "-m", "devstack.reaper", "--when-parent-dies", mark],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=env,
        # Its own session: a Ctrl-C or a group kill of the run must not end it before it reaps.
        start_new_session=True,
    )


@contextlib.contextmanager
def scope(mark: str) -> Iterator[str]:
    """Processes started inside carry MARK (os.environ is what subprocess hands on)."""
    before = os.environ.get(MARK)
    os.environ[MARK] = mark
    try:
        yield mark
    finally:
        if before is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = before


def main(argv: list[str]) -> None:
    if argv[:1] == ["--when-parent-dies"]:
        mark = argv[1]
        sys.stdin.buffer.read()  # returns at EOF: the starter's end of the pipe has closed
        # A second look catches what a carrier started while the first was being killed.
        reap(mark)
        reap(mark)
        return
    for pid, name in reap(argv[0]).items():
        print(f"killed {pid} {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
