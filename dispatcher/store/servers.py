"""A database URL naming several servers (a primary and its standbys, as libpq allows): the node
must reach the one that accepts writes, and after a failover the promoted one.

asyncpg tries a URL's hosts in order within one timeout, so a host that never answers (its
machine gone, nothing sending a reset) would use it all up and the next host would never be
tried. ``connect`` gives each host a timeout of its own, as libpq's ``connect_timeout`` does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import asyncpg

from consumers_sdk import sockets


def writable(dsn: str) -> str:
    """``dsn``, or with ``target_session_attrs=read-write`` when it names several hosts and no
    target: the node only writes, so it must never stay on a standby that refuses every write."""
    parts = urlsplit(dsn)
    if "," not in parts.netloc or "target_session_attrs" in parse_qs(parts.query):
        return dsn
    query = f"{parts.query}&" if parts.query else ""
    return urlunsplit(parts._replace(query=f"{query}target_session_attrs=read-write"))


def each_server(dsn: str) -> list[str]:
    """One URL per host of ``dsn``, in its order (``[dsn]`` when it names one)."""
    parts = urlsplit(dsn)
    auth, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return [dsn]
    return [urlunsplit(parts._replace(netloc=f"{auth}{at}{host}")) for host in hosts.split(",")]


async def connect(
    dsn: str | None = None,
    *,
    timeout: float = 60.0,  # noqa: ASYNC109 - the pool's hook: asyncpg passes timeout=
    dead_s: float | None = None,
    **options: Any,
) -> asyncpg.Connection:
    """A connection to the first host of ``dsn`` that answers within ``timeout`` and matches the
    URL's ``target_session_attrs`` (read-write by default: ``writable``); ``options`` go to
    ``asyncpg.connect``. As libpq, any failure moves on to the next host; the last one is raised
    when none will do. Also the pool's ``connect`` hook. DEAD_S: ``keep_alive``."""
    failure: Exception | None = None
    for url in each_server(writable(dsn or "")):
        try:
            connection: asyncpg.Connection = await asyncpg.connect(url, timeout=timeout, **options)
        except Exception as exc:
            failure = exc
            continue
        if dead_s is not None:
            keep_alive(connection, dead_s)
        return connection
    assert failure is not None  # each_server names at least one URL
    raise failure


def keep_alive(connection: asyncpg.Connection, dead_s: float) -> None:
    """``sockets.keep_alive`` on CONNECTION's socket. Without it a query on a connection whose
    packets are dropped hangs until its timeout and the pool hands the connection out again.
    (asyncpg has no option for these: its transport's socket is set.)"""
    transport = getattr(connection, "_transport", None)
    sockets.keep_alive(transport.get_extra_info("socket") if transport else None, dead_s)
