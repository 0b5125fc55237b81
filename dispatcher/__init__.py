"""Delay dispatcher: durable delayed jobs, stored in PostgreSQL and fired to RabbitMQ when due."""

from dispatcher.node import Node
from dispatcher.settings import Settings
from dispatcher.version import __version__

__all__ = ["Node", "Settings", "__version__"]
