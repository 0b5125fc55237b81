"""A connection whose packets stop arriving is dropped within ``dead_connection_s``, not the
system's minutes: PostgreSQL's, RabbitMQ's and ZooKeeper's sockets carry TCP_USER_TIMEOUT and
keepalives, and the node's AMQP connections a heartbeat of half of it (each on real servers)."""

from __future__ import annotations

import socket

from yarl import URL

from consumers_sdk import failover
from devstack.zookeeper import ZooKeeperServer
from dispatcher.cluster import zk
from dispatcher.store.db import Database
from tests.support.nodes import running_node


async def test_every_pooled_postgresql_socket_is_kept_alive_within_the_bound(
    database_url: str,
) -> None:
    database = Database(database_url, min_size=2, max_size=2, timeout_s=5, dead_connection_s=10)
    await database.open()
    try:
        async with database.connection() as first, database.connection() as second:
            for connection in (first, second):
                sock = connection._con._transport.get_extra_info("socket")  # type: ignore[attr-defined]
                option = sock.getsockopt
                assert option(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10_000
                assert option(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert option(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
                assert option(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 1
                assert option(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 5
    finally:
        await database.close()


async def test_the_nodes_amqp_connections_beat_at_half_the_bound(
    database_url: str, amqp_url: str
) -> None:
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, dead_connection_s=8, node_id="beat"
    ) as node:
        # What the broker agreed to (Connection.Tune-Ok), on each publisher's connection.
        agreed = [
            publisher._connection.transport.connection.connection_tune.heartbeat  # type: ignore[union-attr]
            for publisher in (node.messaging.publisher, node.messaging.live_publisher)
        ]
    assert agreed == [4, 4]


def assert_kept_alive(sock: socket.socket, dead_s: int) -> None:
    option = sock.getsockopt
    assert option(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == dead_s * 1000
    assert option(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert option(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == dead_s // 2


async def test_rabbitmqs_sockets_are_kept_alive_through_the_transport_factory(
    amqp_url: str,
) -> None:
    _, writer = await failover.KeptAliveTransport(8).create(URL(amqp_url))
    try:
        assert_kept_alive(writer.get_extra_info("socket"), 8)
    finally:
        writer.close()


def test_zookeepers_sockets_are_kept_alive_by_its_handler(zk_server: ZooKeeperServer) -> None:
    handler = zk._KeptAliveHandler(8)
    sock = handler.create_connection(("127.0.0.1", zk_server.client_port), timeout=5)
    try:
        assert_kept_alive(sock, 8)
    finally:
        sock.close()
