"""``serve`` tunes the process's cyclic collector (full passes stalled firing): checked in a child
process, since the setting is process-wide."""

from __future__ import annotations

import subprocess
import sys

from dispatcher import node


def test_serving_freezes_the_built_node_and_collects_the_young_generation_less_often() -> None:
    script = (
        "import gc\n"
        "from dispatcher import node\n"
        "from dispatcher.settings import Settings\n"
        "node.Node(Settings())\n"
        "assert gc.get_freeze_count() == 0\n"
        "node.tune_gc()\n"
        "print(gc.get_freeze_count(), *gc.get_threshold())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout.split()
    frozen, *thresholds = (int(value) for value in out)
    assert frozen > 10_000  # the imported frameworks and the node's components
    assert tuple(thresholds) == node.GC_THRESHOLDS
    assert node.GC_THRESHOLDS[0] > 700  # CPython's default young threshold
