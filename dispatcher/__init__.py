"""Delay dispatcher: durable delayed jobs, stored in PostgreSQL and fired to RabbitMQ when due."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dispatcher.version import __version__

if TYPE_CHECKING:
    from dispatcher.node import Node
    from dispatcher.settings import Settings

__all__ = ["Node", "Settings", "__version__"]

# Imported when first asked for: the node pulls in the whole service (the web framework, the
# drivers), a second of CPU that a command such as `dispatcher jobs list` has no use for.
_LAZY = {"Node": "dispatcher.node", "Settings": "dispatcher.settings"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dispatcher' has no attribute {name!r}")
