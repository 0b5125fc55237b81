"""The Ownership interface and its single-node implementation.

An implementation tells the scheduler which shards this node owns, under which epoch, and whether
it may fire right now. Epochs live in PostgreSQL (``store.shards``): taking a shard bumps its epoch,
and every claim is checked against it, so the interface stays the same whether one node owns
everything or ZooKeeper deals the shards out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from dispatcher.store.shards import ShardStore


@dataclass(frozen=True, slots=True)
class OwnershipChange:
    gained: Mapping[int, int] = field(default_factory=dict)  # shard -> epoch
    lost: frozenset[int] = frozenset()


class Ownership(Protocol):
    """What the scheduler needs to know about shard ownership."""

    async def start(self) -> None:
        """Take the first shards (and join the cluster, where there is one)."""

    async def run(self) -> None:
        """Background work (session events, heartbeats) until cancelled."""

    async def stop(self) -> None:
        """Release every shard (graceful shutdown); safe to call twice."""

    def epochs(self) -> Mapping[int, int]:
        """The shards owned right now, with the epoch each claim must present."""

    def can_fire(self) -> bool:
        """False while ownership is in doubt (self-fencing)."""

    async def wait_can_fire(self) -> None: ...

    async def next_change(self) -> OwnershipChange:
        """The next change of owned shards, in order."""

    async def describe(self) -> dict[str, object]:
        """Cluster view for ``GET /v1/cluster``."""

    async def report(self, standing: str | None) -> None:
        """This node's standing (``dispatcher.health``; None: well): in a cluster, a node that
        stepped out gets no shards while others are well."""

    def coordinated(self) -> bool:
        """Whether the node is in touch with its coordinator (ZooKeeper's session), if any."""

    def members(self) -> frozenset[str]:
        """The nodes in the cluster now, this one included: whose claims may be in flight."""


class SingleNode:
    """This node owns every shard. Taking them bumps every epoch, fencing any earlier process."""

    def __init__(self, shard_store: ShardStore, *, node_id: str, shard_count: int) -> None:
        self._shard_store = shard_store
        self._node_id = node_id
        self._shard_count = shard_count
        self._epochs: dict[int, int] = {}
        self._changes: asyncio.Queue[OwnershipChange] = asyncio.Queue()
        self._can_fire = asyncio.Event()

    async def start(self) -> None:
        if self._epochs:
            return
        await self._shard_store.ensure(self._shard_count)
        self._epochs = await self._shard_store.bump(range(self._shard_count), self._node_id)
        self._changes.put_nowait(OwnershipChange(gained=dict(self._epochs)))
        self._can_fire.set()

    async def run(self) -> None:
        await asyncio.Event().wait()  # nothing to watch: ownership never changes

    async def stop(self) -> None:
        self._can_fire.clear()

    def epochs(self) -> Mapping[int, int]:
        return self._epochs

    def can_fire(self) -> bool:
        return self._can_fire.is_set()

    async def wait_can_fire(self) -> None:
        await self._can_fire.wait()

    async def next_change(self) -> OwnershipChange:
        return await self._changes.get()

    async def report(self, standing: str | None) -> None:
        """Nobody to hand the shards to: the node keeps them (``/readyz`` says why)."""

    def coordinated(self) -> bool:
        return True

    def members(self) -> frozenset[str]:
        return frozenset((self._node_id,))

    async def describe(self) -> dict[str, object]:
        return {
            "mode": "single-node",
            "node": self._node_id,
            "leader": self._node_id,
            "members": [self._node_id],
            "assignment": {self._node_id: sorted(self._epochs)},
            "epochs": {str(shard): epoch for shard, epoch in sorted(self._epochs.items())},
        }
