"""Python processes of the tests forked from one that has imported the project already.

``python -m dispatcher serve`` spends about 1.3 CPU-seconds before it does anything: the
interpreter, then the imports (FastAPI and pydantic build the API's models). The end-to-end and
fault tests start some 150 dispatchers and consumers a run, on a machine the suite keeps busy. A
zygote (one per pytest process, started on first use, under that process's run mark) imports
the project once and forks a child per request. Each child is a process of its own: its own
session, its output appended to its log, the environment and arguments it was asked for, the same
entry point as ``python -m MODULE``; it is killed, paused and stopped by its pid like any other.
The exit status, which only a parent can collect, the zygote (the parent) writes beside the log.

An environment that preloads a library (``LD_PRELOAD``: libfaketime) must reach a fresh
interpreter, so such a start execs as before (``forkable``); so do the benchmarks' nodes, outside
pytest (``available``).

``python -m tests.support.zygote`` is the zygote: JSON requests on stdin, a pid per request on
stdout.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from devstack import dispatcher_process, reaper

ROOT = Path(__file__).parents[2]
PRELOADED = ("dispatcher.cli", "dispatcher.node", "consumers_sdk.__main__", "consumers_sdk")
POLL_S = 0.02


def forkable(env: Mapping[str, str]) -> bool:
    """Not a node whose process must load a library first (faketime), nor one of other code
    (another release's packages first on its path): the zygote has imported this tree's."""
    other_code = env.get("PYTHONPATH", os.environ.get("PYTHONPATH")) != os.environ.get("PYTHONPATH")
    return not env.get("LD_PRELOAD") and not other_code


class Forked:
    """A child of the zygote, with the part of ``subprocess.Popen``'s interface the tests use."""

    def __init__(self, pid: int, status_file: Path) -> None:
        self.pid = pid
        self._status_file = status_file
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(OSError, ValueError):
                self.returncode = int(self._status_file.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(POLL_S)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


class Zygote:
    def __init__(self, mark: str | None) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.zygote"],
            cwd=ROOT,
            env=reaper.marked(mark),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._lock = threading.Lock()

    def fork(self, module: str, args: list[str], env: Mapping[str, str], log: Path) -> Forked:
        """``python -m MODULE ARGS`` with ENV, output appended to LOG, in a session of its own."""
        status_file = log.with_name(f"{log.name}.{time.monotonic_ns()}.exit")
        request = {
            "module": module,
            "args": args,
            "env": dict(env),
            "cwd": str(ROOT),
            "log": str(log),
            "status": str(status_file),
        }
        with self._lock:
            assert self._process.stdin is not None
            assert self._process.stdout is not None
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
            answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the zygote exited (code {self._process.poll()})")
        return Forked(int(answer), status_file)

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()  # it exits at the end of its input
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(10)
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)
        if self._process.stdout is not None:
            self._process.stdout.close()


_zygotes: list[Zygote] = []
_marks: list[str | None] = []


def pytest_configure(config: object) -> None:
    # After tests/support/reaping.py's: the environment carries this pytest process's mark.
    _marks.append(reaper.current())
    dispatcher_process.fork_with(fork_node)  # the benchmarks start their nodes by exec


def pytest_unconfigure(config: object) -> None:
    dispatcher_process.fork_with(None)
    while _zygotes:
        _zygotes.pop().close()


def fork_node(env: Mapping[str, str], log: Path) -> Forked | None:
    """A node forked from this run's zygote; None under libfaketime (the zygote's clock is
    the true one): such a node is spawned."""
    return zygote().fork("dispatcher", ["serve"], env, log) if forkable(env) else None


def zygote() -> Zygote:
    """This pytest process's zygote, started on first use under the process's own mark (not the
    test's: it outlives the test that first asks)."""
    if not _zygotes:
        _zygotes.append(Zygote(_marks[-1]))
    return _zygotes[0]


# --- the zygote itself ---------------------------------------------------------------------------


def _child(request: dict[str, object], started: int) -> None:
    """In the forked child: become the asked-for process, never return. STARTED (a pipe's end)
    is closed once the child leads its session and writes to its log, as a process that
    ``Popen(start_new_session=True)`` returned does."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        log = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.close(started)
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
        module, args = str(request["module"]), request["args"]
        assert isinstance(args, list)
        sys.argv = [module, *map(str, args)]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # whatever the child raised goes to its log
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _serve() -> None:
    for name in PRELOADED:
        importlib.import_module(name)
    statuses: dict[int, str] = {}
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin.buffer, selectors.EVENT_READ, "request")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                os.read(wake_read, 4096)
                _reap(statuses)
                continue
            chunk = os.read(sys.stdin.fileno(), 65536)
            if not chunk:
                return  # the test process is gone or done: the children are its mark's to reap
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                started_read, started = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(started_read)
                    _child(request, started)
                os.close(started)
                os.read(started_read, 1)  # b"" once the child closed its end (or died)
                os.close(started_read)
                statuses[pid] = str(request["status"])
                sys.stdout.write(f"{pid}\n")
                sys.stdout.flush()
        _reap(statuses)


def _reap(statuses: dict[int, str]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if (path := statuses.pop(pid, None)) is not None:
            temporary = f"{path}.tmp"
            Path(temporary).write_text(str(os.waitstatus_to_exitcode(status)))
            os.replace(temporary, path)


if __name__ == "__main__":
    _serve()
