"""Adds consumers_sdk to the SDK's sdist and wheel: from the repository (../consumers_sdk) or,
when the wheel is built from the sdist, from beside this file."""

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return  # dev-mode-dirs puts the repository on the path instead of a copy
        here = Path(self.root)
        source = here / "consumers_sdk"
        if not source.is_dir():
            source = here.parent / "consumers_sdk"
        build_data["force_include"][str(source)] = "consumers_sdk"
