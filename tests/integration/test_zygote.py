"""Processes forked from the tests' zygote (tests/support/zygote.py) are processes of their own:
the module, arguments and environment asked for, a session of their own, output in their log, an
exit status as a parent sees it; and one that is killed reports the signal."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support import zygote

PROBE = "tests.support.zygote_probe"


def test_a_forked_child_runs_the_module_asked_for_and_reports_its_exit(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = zygote.zygote().fork(PROBE, ["3"], {**os.environ, "PROBE": "seen"}, log)
    assert child.wait(30) == 3
    assert log.read_text() == "['3'] seen True\n"


def test_a_killed_child_reports_the_signal_and_is_no_child_of_the_test(tmp_path: Path) -> None:
    child = zygote.zygote().fork(PROBE, ["sleep"], dict(os.environ), tmp_path / "child.log")
    assert child.poll() is None
    assert os.getsid(child.pid) == child.pid
    parent = int(Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert parent != os.getpid()  # the zygote's
    child.send_signal(signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL
    assert child.returncode == -signal.SIGKILL


def test_a_preloading_environment_or_other_code_is_not_forked() -> None:
    assert zygote.forkable({"PATH": "/usr/bin"})
    assert not zygote.forkable({"LD_PRELOAD": "libfaketime.so.1"})
    assert not zygote.forkable({"PYTHONPATH": "/another/release"})
