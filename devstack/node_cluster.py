"""Several dispatcher processes sharing one PostgreSQL, RabbitMQ and ZooKeeper."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port

SESSION_S = 3.0  # ZooKeeper session timeout for test clusters: failover within seconds
SHARDS = 32


class Cluster:
    def __init__(self, log_dir: Path, env: dict[str, str], *, shard_count: int) -> None:
        self._log_dir = log_dir
        self._env = {**env, "DISPATCHER_SHARD_COUNT": str(shard_count)}
        self.shard_count = shard_count
        self.nodes: dict[str, DispatcherProcess] = {}

    def start(
        self, name: str, env: dict[str, str] | None = None, *, group: int | None = None
    ) -> DispatcherProcess:
        """Start node NAME (again, if it ran before), a new one with ENV over the cluster's
        (under GROUP, if given: ``DispatcherProcess``)."""
        node = self.nodes.get(name) or DispatcherProcess(
            self._log_dir,
            port=reserve_port(),
            env={**self._env, **(env or {})},
            name=name,
            group=group,
        )
        self.nodes[name] = node
        node.start(ready_timeout=60)
        return node

    def live(self) -> list[DispatcherProcess]:
        return [node for node in self.nodes.values() if node.is_running()]

    def view(self, name: str, *, timeout: float = 5) -> dict[str, Any]:
        response = httpx.get(f"{self.nodes[name].url}/v1/cluster", timeout=timeout)
        response.raise_for_status()
        view: dict[str, Any] = response.json()
        return view

    def owners(self) -> dict[int, list[str]]:
        """shard -> the live nodes that say they own it right now."""
        owners: dict[int, list[str]] = {shard: [] for shard in range(self.shard_count)}
        for node in self.live():
            try:
                owned = self.view(node.name)["owned"]
            except httpx.HTTPError:
                continue
            for shard in owned:
                owners[int(shard)].append(node.name)
        return owners

    def converged(self, members: set[str] | None = None) -> bool:
        """Every shard owned by exactly one live node (and, if given, exactly these members)."""
        owners = self.owners()
        if any(len(names) != 1 for names in owners.values()):
            return False
        if members is None:
            return True
        return {names[0] for names in owners.values()} == members

    def wait_converged(self, members: set[str] | None = None, deadline_s: float = 60) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.converged(members):
                return
            time.sleep(0.2)
        logs = "\n".join(f"--- {n.name}\n{n.logs()}" for n in self.nodes.values())
        raise TimeoutError(f"cluster did not converge: {self.owners()}\n{logs}")

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.is_running():
                node.resume()
            node.stop()


async def start_nodes(cluster: Cluster, *names: str) -> None:
    """Start the named nodes in turn, then wait until the live ones share every shard."""
    for name in names:
        await asyncio.to_thread(cluster.start, name)
    await asyncio.to_thread(cluster.wait_converged, {node.name for node in cluster.live()})
