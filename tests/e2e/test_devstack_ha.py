"""`make cluster-ha`'s command (``python -m devstack cluster-ha``) on free ports and a throwaway
root: three ZooKeeper servers in quorum, three nodes whose sessions live on that ensemble and
share every shard, and `down` leaves none of them behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack import cluster_ha
from devstack.base import service_root, wait_until
from devstack.ports import free_port
from devstack.stack import port_open

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
COMMAND_S = 600  # five services and three nodes start slowly on a loaded machine
SERVICES = ("postgres", "amqp", "management", "distribution", "zookeeper")


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


def test_cluster_ha_runs_three_nodes_on_a_zookeeper_ensemble_and_down_stops_it_all() -> None:
    root = service_root("devstack-ha")
    ensemble_ports = [free_port() for _ in range(9)]
    http_ports = [free_port() for _ in range(3)]
    options = [f"--{name}-port={free_port()}" for name in SERVICES]
    options += [
        f"--root={root}",
        f"--http-ports={','.join(map(str, http_ports))}",
        f"--ensemble-ports={','.join(map(str, ensemble_ports))}",
    ]
    try:
        devstack("cluster-ha", options)
        ensemble = cluster_ha.saved(root)
        assert ensemble is not None
        assert sorted(m.mode() for m in ensemble.members) == ["follower", "follower", "leader"]

        def shared() -> bool:
            views = [view(port) for port in http_ports]
            owned = [shard for v in views for shard in v["owned"]]
            return len(owned) == len(set(owned)) == len({s for v in views for s in v["owned"]}) > 0

        assert wait_until(shared, 60)
        views = [view(port) for port in http_ports]
        assert all(len(v["members"]) == 3 for v in views)
        assert all(ensemble.serving(v["session_id"]) is not None for v in views)
        assert "zookeeper3 up" in " ".join(devstack("status", options).split())
    finally:
        devstack("down", options)
        shutil.rmtree(root, ignore_errors=True)
    assert not any(port_open(port) for port in [*ensemble_ports[:3], *http_ports])
