"""``import dispatcher`` stays light: a command such as ``dispatcher jobs list`` starts without
importing the node and its web framework (a second of CPU each time), and ``dispatcher.Node`` is
still there for whoever asks."""

import subprocess
import sys

import dispatcher


def test_the_command_line_imports_no_node_until_a_command_needs_one() -> None:
    heavy = "{'dispatcher.node', 'fastapi'}"
    probe = f"import sys, dispatcher.cli; print(sorted({heavy} & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]"


def test_the_package_still_exports_the_node_and_its_settings() -> None:
    from dispatcher.node import Node
    from dispatcher.settings import Settings

    assert dispatcher.Node is Node
    assert dispatcher.Settings is Settings
    assert sorted(dispatcher.__all__) == ["Node", "Settings", "__version__"]
