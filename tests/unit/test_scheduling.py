"""How the parallel passes hand files to workers (tests/support/scheduling.py): files sharing the
RabbitMQ cluster are one unit, units go out longest first, and the durations come from JUnit."""

from __future__ import annotations

from pathlib import Path

from tests.support import scheduling

CLUSTER_FILES = [path for path, unit in scheduling.SHARED.items() if unit == "rabbitmq-cluster"]


def test_the_files_that_share_the_cluster_are_one_unit_and_others_one_each() -> None:
    units = {scheduling.unit_of(f"{path}::test_x") for path in CLUSTER_FILES}
    assert units == {"rabbitmq-cluster"}
    assert scheduling.unit_of("tests/unit/test_heap.py::test_a[1]") == "tests/unit/test_heap.py"
    assert all(Path(scheduling.DURATIONS.parents[1], path).is_file() for path in CLUSTER_FILES)


def test_a_unit_weighs_what_its_files_took_or_its_folders_mean() -> None:
    measured = {"tests/e2e/test_a.py": 40.0}
    ids = ["tests/e2e/test_a.py::t1", "tests/e2e/test_a.py::t2", "tests/unit/test_b.py::t"]
    assert scheduling.estimate(ids, measured) == 40.0 + scheduling.FOLDER_S["unit"]
    many_units = [f"tests/unit/test_c.py::t{n}" for n in range(100)]
    one_fault = ["tests/faults/test_d.py::t"]
    assert scheduling.estimate(one_fault, {}) > scheduling.estimate(many_units, {})


def test_durations_are_read_per_file_from_junit_reports_keeping_the_longest(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "a.xml", tmp_path / "b.xml"
    case = '<testcase classname="tests.unit.test_heap" name="{}" time="{}"/>'
    first.write_text(f"<testsuite>{case.format('x', 1.5)}{case.format('y', 2.0)}</testsuite>")
    second.write_text(f"<testsuite>{case.format('x', 9.0)}</testsuite>")
    assert scheduling.measured_in([first, second]) == {"tests/unit/test_heap.py": 9.0}


def test_units_go_out_longest_first() -> None:
    units = {
        "tests/unit/test_a.py": [f"tests/unit/test_a.py::t{n}" for n in range(50)],
        "tests/e2e/test_b.py": ["tests/e2e/test_b.py::t"],
        "rabbitmq-cluster": [f"{CLUSTER_FILES[0]}::t"],
    }
    measured = {"tests/e2e/test_b.py": 70.0, CLUSTER_FILES[0]: 200.0}
    assert scheduling.longest_first(units, measured) == [
        "rabbitmq-cluster",
        "tests/e2e/test_b.py",
        "tests/unit/test_a.py",
    ]
    assert scheduling.load_durations(), "tests/durations.json is read"
