"""A three-node RabbitMQ cluster for the tests that kill its nodes: one for the files that share it
(starting one takes half a minute), every node running again before each test that uses it, a
vhost per test.

``DISPATCHER_TEST_RABBITMQ=4`` builds it from RabbitMQ 4.x nodes (``devstack.rabbitmq4``)."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from devstack import rabbitmq4
from devstack.base import service_root
from devstack.rabbitmq import RabbitServer
from devstack.rabbitmq_cluster import NodeFactory, RabbitCluster, system_node
from tests import fixtures
from tests.support.scheduling import unit_of


def node_factory() -> NodeFactory:
    """3.x nodes from the system, or 4.x nodes from the chroot when DISPATCHER_TEST_RABBITMQ=4."""
    if os.environ.get("DISPATCHER_TEST_RABBITMQ") != "4":
        return system_node
    chroot = rabbitmq4.ensure_chroot()

    def make(root: Path, amqp_port: int, mgmt_port: int, dist_port: int, name: str) -> RabbitServer:
        # A 4.x node's folder must lie inside the chroot.
        return rabbitmq4.Rabbit4Server(
            chroot, rabbitmq4.node_root(chroot), amqp_port, mgmt_port, dist_port, name
        )

    return make


# The cluster the current files use: started by the first test that asks for it, thrown away
# (killed) after the last test of the files that share it, whatever order their tests run in
# (``SHARED`` in tests/support/scheduling.py sends those files to one worker, in a row).
_started: list[tuple[RabbitCluster, Path]] = []


@pytest.fixture(scope="module")  # a wider scope than the test's: its processes outlive the test
def rabbit_cluster() -> RabbitCluster:
    if not _started:
        root = service_root("rabbitmq-cluster")
        cluster = RabbitCluster.local(root, make=node_factory())
        _started.append((cluster, root))
        # A failing test prints the nodes' log tails (tests/fixtures.py).
        fixtures._running.extend(cluster.nodes)
        cluster.start()
    return _started[0][0]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _started and (nextitem is None or unit_of(nextitem.nodeid) != unit_of(item.nodeid)):
        stop_cluster()


def stop_cluster() -> None:
    cluster, root = _started.pop()
    for node in cluster.nodes:
        fixtures._running.remove(node)
    for node in cluster.nodes:  # thrown away: nothing to stop cleanly
        node.kill()
    shutil.rmtree(root, ignore_errors=True)
    for node in cluster.nodes:  # a 4.x node's folder is in the kept chroot: drop its data
        shutil.rmtree(node.root / "mnesia", ignore_errors=True)


@pytest.fixture
def cluster_url(rabbit_cluster: RabbitCluster) -> str:
    """Every node's URL (comma-separated) for a vhost of this test's own, every node running.
    Healed before a test rather than after, so that the last test's kill is never healed; the
    vhost is left to the cluster, thrown away with it (deleting it while a node is down could
    wait on queues that node held)."""
    rabbit_cluster.heal()
    vhost = f"test-{uuid.uuid4().hex[:12]}"
    rabbit_cluster.create_vhost(vhost)
    return rabbit_cluster.url(vhost)
