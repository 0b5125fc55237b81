"""`make cluster-ha`'s command (``python -m devstack cluster-ha``) on free ports and a throwaway
root: three RabbitMQ nodes clustered, a PostgreSQL primary streaming synchronously to its standby,
three ZooKeeper servers in quorum, and three nodes that name every server of each tier, share
every shard and fire a job; `down` leaves none of them behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack import cluster_ha
from devstack.base import service_root, wait_until
from devstack.ports import reserve_port
from devstack.stack import port_open

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
COMMAND_S = 900  # eight servers and three nodes start slowly on a loaded machine
SERVICES = ("postgres", "amqp", "management", "distribution", "zookeeper")
HA_PORTS = {"ensemble-ports": 9, "rabbitmq-ha-ports": 9, "postgres-ha-ports": 2}


def devstack(command: str, options: list[str]) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "devstack", command, *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=COMMAND_S,
    )
    assert result.returncode == 0, f"{command}: {result.stdout}\n{result.stderr}"
    return result.stdout


def view(port: int) -> dict[str, Any]:
    response = httpx.get(f"http://127.0.0.1:{port}/v1/cluster", timeout=10)
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


def fired(port: int, job_id: str) -> bool:
    response = httpx.get(f"http://127.0.0.1:{port}/v1/jobs/{job_id}", timeout=10)
    return bool(response.json()["state"] in {"dispatched", "succeeded"})


def test_cluster_ha_replicates_every_tier_and_down_stops_it_all() -> None:
    root = service_root("devstack-ha")
    ha_ports = {name: [reserve_port() for _ in range(size)] for name, size in HA_PORTS.items()}
    http_ports = [reserve_port() for _ in range(3)]
    options = [f"--{name}-port={reserve_port()}" for name in SERVICES]
    options += [f"--root={root}", f"--http-ports={','.join(map(str, http_ports))}"]
    options += [f"--{name}={','.join(map(str, ports))}" for name, ports in ha_ports.items()]
    try:
        out = devstack("cluster-ha", options)
        topology = cluster_ha.Topology.saved(root)
        assert topology is not None
        ensemble = topology.ensemble(root)
        assert sorted(m.mode() for m in ensemble.members) == ["follower", "follower", "leader"]
        brokers = topology.brokers(root)
        names = {node.nodename for node in brokers.nodes}
        assert all(brokers.running_nodes(node) == names for node in brokers.nodes)
        databases = topology.databases(root)
        assert databases.sync_state() == "sync"
        # The nodes were given every server: the printed URLs name each port of each tier.
        for port in [*ha_ports["ensemble-ports"][:3], *ha_ports["postgres-ha-ports"]]:
            assert f"127.0.0.1:{port}" in out
        assert all(f":{port}/" in out for port in ha_ports["rabbitmq-ha-ports"][:3])

        def shared() -> bool:
            views = [view(port) for port in http_ports]
            owned = [shard for v in views for shard in v["owned"]]
            return len(owned) == len(set(owned)) == len({s for v in views for s in v["owned"]}) > 0

        assert wait_until(shared, 60)
        views = [view(port) for port in http_ports]
        assert all(len(v["members"]) == 3 for v in views)
        assert all(ensemble.serving(v["session_id"]) is not None for v in views)
        job = {"routing_key": "devstack.ha", "payload": {"at": time.time()}, "delay_ms": 0}
        created = httpx.post(f"http://127.0.0.1:{http_ports[0]}/v1/jobs", json=job, timeout=10)
        assert created.status_code == 201, created.text
        assert wait_until(lambda: fired(http_ports[1], created.json()["id"]), 60)
        listed = " ".join(devstack("status", options).split())
        for name in ("zookeeper3 up", "rabbitmq3 up", "postgres-standby up"):
            assert name in listed
    finally:
        devstack("down", options)
    try:
        everything = [*http_ports, *ha_ports["postgres-ha-ports"]]
        everything += [*ha_ports["ensemble-ports"][:3], *ha_ports["rabbitmq-ha-ports"][:6]]
        assert not [port for port in everything if port_open(port)]
        assert not (root / cluster_ha.HA).exists()  # it starts fresh next time
    finally:
        shutil.rmtree(root, ignore_errors=True)
