"""Delay dispatcher: durable delayed jobs, stored in PostgreSQL and fired to RabbitMQ when due."""

from dispatcher.node import Node
from dispatcher.settings import Settings

__version__ = "0.1.0"

__all__ = ["Node", "Settings", "__version__"]
