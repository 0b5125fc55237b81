"""Session-wide services, isolated per test cheaply: a database cloned from a migrated template,
a RabbitMQ vhost, a ZooKeeper chroot. Services start once; they never skip.

The session's three run in containers where a Docker engine answers (tests/support/engine.py,
tests/support/containers.py), else from the system's binaries; either offers what
tests/support/services.py names. The fixtures that control servers of their own as host
processes stay on the binaries everywhere: own_postgres, pg_pair (a standby replicating from
its primary's folder), own_zookeeper, the RabbitMQ clusters and 4.x chroot nodes
(tests/support/rabbit_cluster.py), and the killed worker of tests/e2e/test_stray_processes.py.
The firewall tests (tests/faults/test_gray_failures.py) cut a node's own packets to a service's
port on 127.0.0.1, which Docker's default userland proxy serves as a local socket."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest

from devstack import base, rabbitmq4
from devstack.base import service_root
from devstack.ports import reserve_port
from devstack.postgres import PostgresServer
from devstack.postgres_standby import PrimaryWithStandby
from devstack.rabbitmq import RabbitServer
from devstack.zookeeper import ZooKeeperServer
from tests.support import engine
from tests.support.services import PostgresService, RabbitService, Service, ZooKeeperService

TEMPLATE = "dispatcher_template"
_running: list[Service] = []
S = TypeVar("S", bound=Service)


@pytest.fixture(scope="session")
def in_containers() -> bool:
    """Whether the session's PostgreSQL, RabbitMQ and ZooKeeper run in containers: where a
    Docker engine answers, unless DISPATCHER_TEST_SERVICES=binaries|containers says
    (tests/support/engine.py). tests.support.containers, and with it testcontainers, is imported
    only then."""
    return engine.use_containers()


def serve(server: S, teardown: Callable[[], None]) -> Iterator[S]:
    """SERVER started for the session, its log shown under a failing test; TEARDOWN at the end
    (or at once, if it does not start)."""
    try:
        server.start()
    except BaseException:
        teardown()
        raise
    _running.append(server)
    yield server
    _running.remove(server)
    teardown()


@pytest.fixture(scope="session")
def pg_server(in_containers: bool) -> Iterator[PostgresService]:
    if in_containers:
        from tests.support import containers

        container = containers.PostgresContainer(reserve_port())
        yield from serve(container, container.remove)
        return
    root = service_root("postgres")
    server = PostgresServer(root, reserve_port())

    def teardown() -> None:
        server.kill()  # thrown away: a clean stop only cost the end of every worker its time
        shutil.rmtree(root, ignore_errors=True)

    yield from serve(server, teardown)


@pytest.fixture(scope="session")
def pg_template(pg_server: PostgresService) -> str:
    from dispatcher.store.migrate import apply_migrations

    pg_server.create_database(TEMPLATE)
    asyncio.run(apply_migrations(pg_server.dsn(TEMPLATE)))
    return TEMPLATE


class Databases:
    """CREATE and DROP DATABASE over one kept connection: through ``psql``, each cost a process
    and a backend of its own (two a test, a thousand a run)."""

    def __init__(self, server: PostgresService) -> None:
        self._server = server
        self._connection: psycopg.Connection[tuple[object, ...]] | None = None

    def execute(self, statement: str) -> None:
        try:
            self._connected().execute(statement.encode())
        except psycopg.OperationalError:
            # The server was restarted since (a test stops or crashes it on purpose): once more
            # on a new connection. CREATE and DROP are each their own transaction.
            self.close()
            self._connected().execute(statement.encode())

    def _connected(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(self._server.dsn("postgres"), autocommit=True)
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


@pytest.fixture(scope="session")
def databases(pg_server: PostgresService) -> Iterator[Databases]:
    kept = Databases(pg_server)
    yield kept
    kept.close()


def fresh_database(server: PostgresService, template: str, databases: Databases) -> Iterator[str]:
    name = f"test_{uuid.uuid4().hex}"
    if not server.is_running():  # a previous test crashed it on purpose
        server.start()
    databases.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    yield server.dsn(name)
    if server.is_running():
        databases.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(
    pg_server: PostgresService, pg_template: str, databases: Databases
) -> Iterator[str]:
    yield from fresh_database(pg_server, pg_template, databases)


@pytest.fixture
def empty_database_url(pg_server: PostgresService, databases: Databases) -> Iterator[str]:
    """A database no migration has touched (a test migrates it, or an earlier release does)."""
    name = f"empty_{uuid.uuid4().hex}"
    databases.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.dsn(name)
    if pg_server.is_running():
        databases.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def module_database_url(
    pg_server: PostgresService, pg_template: str, databases: Databases
) -> Iterator[str]:
    """One database for a module's tests that change nothing (tests/support/nodes.py)."""
    yield from fresh_database(pg_server, pg_template, databases)


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own (database ``dispatcher``), so stopping it disturbs no other
    test."""
    root = service_root("postgres-own")
    server = PostgresServer(root, reserve_port())
    server.start()
    server.create_database("dispatcher")
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_pair() -> Iterator[PrimaryWithStandby]:
    """A primary and its synchronous standby of this test's own (database ``dispatcher``)."""
    pair = PrimaryWithStandby.fresh()
    try:
        pair.start("dispatcher")
        yield pair
    finally:
        try:
            pair.stop()
        finally:
            for server in (pair.primary, pair.standby):
                shutil.rmtree(server.root, ignore_errors=True)


def rabbit_major() -> int:
    """The session's RabbitMQ is 3.x unless DISPATCHER_TEST_RABBITMQ=4 (make test-rabbitmq4)."""
    return 4 if os.environ.get("DISPATCHER_TEST_RABBITMQ") == "4" else 3


def new_rabbit_server(tmp_path_factory: pytest.TempPathFactory) -> RabbitServer:
    """The system's RabbitMQ, or 4.x from its chroot when DISPATCHER_TEST_RABBITMQ=4."""
    ports = {"amqp_port": reserve_port(), "mgmt_port": reserve_port(), "dist_port": reserve_port()}
    nodename = f"test-{uuid.uuid4().hex[:8]}@localhost"
    if rabbit_major() == 4:
        chroot = rabbitmq4.ensure_chroot()
        return rabbitmq4.Rabbit4Server(
            chroot, rabbitmq4.node_root(chroot), **ports, nodename=nodename
        )
    return RabbitServer(tmp_path_factory.mktemp("rabbitmq"), **ports, nodename=nodename)


@pytest.fixture(scope="session")
def rabbit_server(
    tmp_path_factory: pytest.TempPathFactory, in_containers: bool
) -> Iterator[RabbitService]:
    if in_containers:
        from tests.support import containers

        container = containers.RabbitContainer(reserve_port(), reserve_port(), rabbit_major())
        yield from serve(container, container.remove)
        return
    server = new_rabbit_server(tmp_path_factory)

    def teardown() -> None:
        server.kill()  # thrown away: a clean stop took seconds at the end of every worker
        if isinstance(server, rabbitmq4.Rabbit4Server):
            # Its root is in the kept chroot: drop the data, keep the log to grep after the run.
            shutil.rmtree(server.root / "mnesia", ignore_errors=True)

    yield from serve(server, teardown)


def fresh_vhost(server: RabbitService) -> Iterator[str]:
    if not server.is_running():
        server.start()
    vhost = f"test-{uuid.uuid4().hex[:12]}"
    server.create_vhost(vhost)
    starts = server.starts
    yield server.url(vhost)
    # A vhost whose quorum queues may still be electing their leaders after a restart is left
    # alone: deleting it then can crash RabbitMQ's quorum queue supervisor for good, and with it
    # every later test on this broker (seen on 3.x under load).
    if server.is_running() and server.starts == starts:
        server.delete_vhost(vhost)


@pytest.fixture
def amqp_url(rabbit_server: RabbitService) -> Iterator[str]:
    yield from fresh_vhost(rabbit_server)


@pytest.fixture(scope="module")
def module_amqp_url(rabbit_server: RabbitService) -> Iterator[str]:
    """One vhost for a module's tests that change nothing (tests/support/nodes.py)."""
    yield from fresh_vhost(rabbit_server)


@pytest.fixture(scope="session")
def zk_server(
    tmp_path_factory: pytest.TempPathFactory, in_containers: bool
) -> Iterator[ZooKeeperService]:
    if in_containers:
        from tests.support import containers

        container = containers.ZooKeeperContainer(reserve_port())
        yield from serve(container, container.remove)
        return
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), reserve_port())
    yield from serve(server, server.kill)  # thrown away: killed, not stopped


@pytest.fixture
def own_zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this test's own, so stopping it disturbs no other test."""
    server = ZooKeeperServer(tmp_path / "zookeeper-own", reserve_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def zk_hosts(zk_server: ZooKeeperService) -> str:
    """A chroot of this test's own; the dispatcher creates its paths below it."""
    if not zk_server.is_running():
        zk_server.start()
    return f"{zk_server.hosts}/test_{uuid.uuid4().hex}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report: pytest.TestReport = yield  # type: ignore[assignment]
    # Only the test's own phase that failed, and a short tail: the failure itself must stay the
    # visible part of a long run's output.
    if report.failed and _running:
        for server in _running:
            tail = "\n".join(server.logs().splitlines()[-base.LOG_TAIL_LINES :])
            report.sections.append((f"{type(server).__name__} log tail", tail))
    return report  # type: ignore[return-value]
