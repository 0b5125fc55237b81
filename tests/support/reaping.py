"""No process a test starts outlives its test, its worker or the run (devstack/reaper.py).

Each pytest process (the xdist controller, each worker, or a run without workers) takes a mark
below the one it inherited and a watcher that reaps that mark once the process dies, however
it dies. Each test runs under a mark of its own below it, so that whatever the test and its
function-scoped fixtures started and did not stop is found after its teardown, killed and
reported as an error of that test. Fixtures of a wider scope start their processes under the
worker's mark (the server controllers keep the mark they were made under), so a session's
PostgreSQL restarted by one test still belongs to the session.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from devstack import reaper

_MARK = pytest.StashKey[str]()
_WATCHER = pytest.StashKey[subprocess.Popen[bytes]]()
# A process the test stopped may take a moment to exit (a postmaster after SIGTERM, say):
# only what is still there after this is a leftover.
EXIT_GRACE_S = 3.0


def pytest_configure(config: pytest.Config) -> None:
    label = os.environ.get("PYTEST_XDIST_WORKER", "pytest")
    mark = reaper.below(reaper.current(), label)
    os.environ[reaper.MARK] = mark
    config.stash[_MARK] = mark
    config.stash[_WATCHER] = reaper.watch(mark)


def pytest_unconfigure(config: pytest.Config) -> None:
    watcher = config.stash.get(_WATCHER, None)
    if watcher is not None and watcher.stdin is not None:
        watcher.stdin.close()  # the watcher reaps now, as it would after a crash
        watcher.wait(30)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Iterator[object]:
    if fixturedef.scope == "function":
        return (yield)
    with reaper.scope(request.config.stash[_MARK]):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with reaper.scope(reaper.below(item.config.stash[_MARK], "test")):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    outcome = yield
    mark = reaper.current()
    if mark is None:
        return outcome
    end = time.monotonic() + EXIT_GRACE_S
    while reaper.carriers(mark) and time.monotonic() < end:
        time.sleep(0.1)
    if left := reaper.reap(mark):
        listed = ", ".join(f"{pid} ({name})" for pid, name in sorted(left.items()))
        raise AssertionError(f"the test left processes running (now killed): {listed}")
    return outcome
