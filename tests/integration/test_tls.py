"""TLS to PostgreSQL, configured through DISPATCHER_DATABASE_URL alone: a throwaway server with
``ssl = on`` and a self-signed certificate made with openssl."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from devstack.base import service_root
from devstack.ports import reserve_port
from devstack.postgres import PostgresServer
from dispatcher import errors
from dispatcher.store.db import Database
from tests.support.nodes import client, running_node


def self_signed(folder: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (and its key beside it as server.key)."""
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(folder / "server.key"), "-out", str(folder / "server.crt"),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return folder / "server.crt"


@pytest.fixture(scope="module")
def tls_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PostgresServer, Path]]:
    """A PostgreSQL serving TLS with a certificate for 127.0.0.1, and that certificate."""
    certs = tmp_path_factory.mktemp("certs")
    self_signed(certs)
    root = service_root("postgres-tls")
    server = PostgresServer(root, reserve_port())
    server.start()
    try:
        for name in ("server.crt", "server.key"):
            target = server.data / name
            shutil.copy(certs / name, target)
            target.chmod(0o600)
            if os.geteuid() == 0:
                shutil.chown(target, "postgres", "postgres")
        # ssl_cert_file and ssl_key_file default to these names in the data folder.
        server.sql("ALTER SYSTEM SET ssl = on")
        server.sql("SELECT pg_reload_conf()")
        yield server, certs / "server.crt"
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tls_database(tls_pg: tuple[PostgresServer, Path]) -> Iterator[str]:
    server, _ = tls_pg
    name = f"tls_{uuid.uuid4().hex}"
    server.create_database(name)
    yield server.dsn(name)
    server.drop_database(name)


@pytest.fixture
async def plain_connection(tls_database: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(tls_database, ssl=False)
    yield connection
    await connection.close()


async def test_a_node_reaches_postgresql_over_verified_tls_from_the_url_alone(
    tls_pg: tuple[PostgresServer, Path],
    tls_database: str,
    amqp_url: str,
    plain_connection: asyncpg.Connection,
) -> None:
    _, certificate = tls_pg
    url = f"{tls_database}?sslmode=verify-full&sslrootcert={certificate}"
    async with running_node(database_url=url, amqp_url=amqp_url, shard_count=4) as node:
        async with client(node) as http:
            created = await http.post("/v1/jobs", json={"routing_key": "a.b", "payload": 1})
        assert created.status_code == 201
        sessions = await plain_connection.fetch(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
            " WHERE a.datname = current_database() AND s.pid <> pg_backend_pid()"
        )
    assert sessions  # the node's pool was connected while it ran
    assert all(session["ssl"] for session in sessions)
    assert await plain_connection.fetchval("SELECT count(*) FROM jobs") == 1


async def test_sslmode_require_refuses_a_server_without_tls(database_url: str) -> None:
    db = Database(f"{database_url}?sslmode=require", min_size=1, max_size=1, timeout_s=5)
    with pytest.raises(errors.StoreUnavailable):
        await db.open()


@pytest.fixture
def untrusted_certificate(tmp_path: Path) -> Path:
    return self_signed(tmp_path)


async def test_verify_full_refuses_a_certificate_it_does_not_trust(
    tls_database: str, untrusted_certificate: Path
) -> None:
    other = untrusted_certificate
    url = f"{tls_database}?sslmode=verify-full&sslrootcert={other}"
    db = Database(url, min_size=1, max_size=1, timeout_s=5)
    with pytest.raises(errors.StoreUnavailable):
        await db.open()
