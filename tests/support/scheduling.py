"""How pytest-xdist hands test files to workers (``make test``'s parallel passes).

Files as work units, as ``--dist loadfile`` does (a file's module fixtures start once), with two
changes that shorten the run:
- Files that share an expensive fixture are one unit (``SHARED``): the three-node RabbitMQ
  cluster starts once for the modules that kill its nodes, not once per module
  (tests/support/rabbit_cluster.py).
- Units go out longest first, by the seconds each file took in a measured run
  (``tests/durations.json``; a file missing from it by its folder's mean): xdist's own order,
  most tests first, left the slowest files (a few tests each) for the end, where one worker ran
  them while the others idled.

``python -m tests.support.scheduling REPORT.xml ...`` rewrites tests/durations.json from the JUnit
reports ``make test`` leaves in test-artifacts/junit/.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter, OrderedDict
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

DURATIONS = Path(__file__).parents[1] / "durations.json"

# Files that run on one worker, one after the other, to share a fixture of a wider scope.
SHARED = {
    "tests/faults/test_rabbitmq_cluster.py": "rabbitmq-cluster",
    "tests/integration/test_broker_failover.py": "rabbitmq-cluster",
    "tests/integration/test_rabbitmq_cluster_nodes.py": "rabbitmq-cluster",
}

# A file the durations do not list yet: the mean seconds of a test of its folder (make test on
# two cores).
FOLDER_S = {"faults": 29.0, "e2e": 11.0, "fuzz": 9.0, "integration": 2.0, "unit": 0.1}


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    path = file_of(nodeid)
    return SHARED.get(path, path)


def estimate(nodeids: list[str], measured: dict[str, float]) -> float:
    files = Counter(file_of(nodeid) for nodeid in nodeids)
    total = 0.0
    for path, tests in files.items():
        folder = path.split("/")[1] if path.count("/") >= 2 else ""
        total += measured.get(path, tests * FOLDER_S.get(folder, 1.0))
    return total


def longest_first(
    units: dict[str, list[str]], measured: dict[str, float] | None = None
) -> list[str]:
    """The units (name: their test ids) in the order to hand them out."""
    seconds = load_durations() if measured is None else measured
    return sorted(units, key=lambda unit: -estimate(units[unit], seconds))


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


class LongestFirst(LoadScopeScheduling):
    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.log = Producer("longestfirst") if log is None else log.longestfirst
        self._ranked = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _assign_work_unit(self, node: WorkerController) -> None:
        # The first assignment comes once the whole queue is built (``schedule``): rank it then.
        if not self._ranked:
            order = longest_first({unit: list(ids) for unit, ids in self.workqueue.items()})
            self.workqueue = OrderedDict((unit, self.workqueue[unit]) for unit in order)
            self._ranked = True
        super()._assign_work_unit(node)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LongestFirst | None:
    if config.getoption("dist") != "loadfile":
        return None  # another --dist asked for by name keeps its own scheduler
    return LongestFirst(config, log)


def file_named(classname: str) -> str:
    """tests/e2e/test_cli.py for ``tests.e2e.test_cli`` (or ``tests.e2e.test_cli.TestSome``)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (DURATIONS.parents[1] / path).is_file():
            return path
    return "/".join(parts) + ".py"


def measured_in(reports: list[Path]) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of its tests), from JUnit reports; a file
    in several reports keeps its longest."""
    merged: dict[str, float] = {}
    for report in reports:
        seconds: Counter[str] = Counter()
        for case in ET.parse(report).iter("testcase"):
            seconds[file_named(case.get("classname") or "")] += float(case.get("time") or 0)
        for path, spent in seconds.items():
            merged[path] = max(merged.get(path, 0.0), spent)
    return {path: round(spent, 1) for path, spent in sorted(merged.items())}


if __name__ == "__main__":
    DURATIONS.write_text(json.dumps(measured_in([Path(a) for a in sys.argv[1:]]), indent=1) + "\n")
