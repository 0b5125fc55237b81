"""The documentation site's hooks (docs/hooks/), importable by the tests as mkdocs imports them:
by file, with their folder on sys.path for their sibling modules."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).parents[2]
HOOKS = ROOT / "docs" / "hooks"


def hook(name: str) -> ModuleType:
    if str(HOOKS) not in sys.path:
        sys.path.insert(0, str(HOOKS))
    return importlib.import_module(name)
