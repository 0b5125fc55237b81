"""Markers and cross-cutting fixtures only; the service fixtures live in tests/fixtures.py."""

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devstack.collector import Collector
from devstack.dispatcher_process import FAST_LEASE, DispatcherProcess
from devstack.node_cluster import SESSION_S, SHARDS, Cluster
from dispatcher.store.db import Database
from tests.support.process import served

pytest_plugins = [
    "tests.support.reaping",
    "tests.support.zygote",
    "tests.support.scheduling",
    "tests.fixtures",
    "tests.support.rabbit_cluster",
]

# Tests read what their child processes print (a consumer's handler, a runner) from log files:
# unbuffered, or a line stays in the child's buffer until it exits. Set here, not left to the
# caller's environment (a fresh machine's shell does not set it).
os.environ["PYTHONUNBUFFERED"] = "1"
# A child's terminal size is the test's to give (tests/support/terminal.py): pytest-xdist's
# workers set COLUMNS and LINES, which would fit the command line's tables to 80 columns where
# a pipe gets whole lines.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


@pytest.fixture
async def collector(amqp_url: str) -> AsyncIterator[Collector]:
    """An independent consumer of every job published in this test's vhost."""
    consumer = Collector(amqp_url, binding="#")
    await consumer.start()
    yield consumer
    await consumer.stop()


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    """One single-node dispatcher process with a short lease; its log is printed at the end."""
    yield from served(tmp_path, database_url, amqp_url, env=FAST_LEASE)


@pytest.fixture
def cluster(tmp_path: Path, database_url: str, amqp_url: str, zk_hosts: str) -> Iterator[Cluster]:
    """Dispatcher processes sharing a ZooKeeper chroot; the test starts the nodes it needs."""
    env = {
        "DISPATCHER_DATABASE_URL": database_url,
        "DISPATCHER_AMQP_URL": amqp_url,
        "DISPATCHER_ZK_HOSTS": zk_hosts,
        "DISPATCHER_ZK_SESSION_TIMEOUT_S": str(SESSION_S),
        "DISPATCHER_LEASE_S": "4",
    }
    group = Cluster(tmp_path, env, shard_count=SHARDS)
    yield group
    group.stop()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    """A small pool on the test's own database, for tests of one store."""
    database = Database(database_url, min_size=1, max_size=4, timeout_s=10)
    await database.open()
    yield database
    await database.close()
