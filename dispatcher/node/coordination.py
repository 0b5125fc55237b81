"""Which shards this node owns: the shard table alone, or ZooKeeper in a cluster."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.cluster import ownership as ownership_mod
from dispatcher.lifecycle import Phase, Task
from dispatcher.node.core import Core
from dispatcher.store.shards import ShardStore


@dataclass(frozen=True, slots=True)
class Coordination:
    shards: ShardStore
    ownership: ownership_mod.Ownership

    def tasks(self) -> list[Task]:
        return [Task("ownership", self.ownership.run, Phase.LEAVE, self.ownership.stop)]


def build_coordination(core: Core) -> Coordination:
    settings = core.settings
    shards = ShardStore(core.db)
    ownership: ownership_mod.Ownership
    if settings.zk_hosts:
        from dispatcher.cluster import zk_ownership  # kazoo is imported in cluster mode only

        ownership = zk_ownership.ZkOwnership(settings, shards, core.metrics)
    else:
        ownership = ownership_mod.SingleNode(
            shards, node_id=settings.node_id, shard_count=settings.shard_count
        )
    return Coordination(shards=shards, ownership=ownership)
