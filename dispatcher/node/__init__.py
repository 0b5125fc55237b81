"""The composition root. A node is a list of subsystems, each made by its own builder from the
settings and the subsystems it needs, and each giving the background tasks it runs (``root``);
``serve`` runs one as the process's purpose (``process``)."""

from __future__ import annotations

from dispatcher.node.process import GC_THRESHOLDS, serve, tune_gc
from dispatcher.node.root import Node

__all__ = ["GC_THRESHOLDS", "Node", "serve", "tune_gc"]
