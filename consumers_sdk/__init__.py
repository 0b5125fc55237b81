"""What consumer teams import: the message contract (and, soon, a consumer runner and a client)."""

from consumers_sdk import contract

__all__ = ["contract"]
