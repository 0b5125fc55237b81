"""A connection's own round trips."""

from typing import Final

PING: Final = "SELECT 1"
