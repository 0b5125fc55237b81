"""A dispatcher Node running inside the test's event loop, an HTTP client for its API, and the
count of jobs it stored."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import asyncpg
import httpx
import pytest

from dispatcher.node import Node
from dispatcher.settings import Settings

# Tests of refused input change nothing, and check so: a module's share one node (its fixture
# ``refusing_node``, on ``module_database_url`` and ``module_amqp_url``), started once rather than
# once a test (a database, a vhost and a node cost about a second a test on a loaded machine, and
# there are a hundred-odd such tests). They run in the module's event loop, the node's.
ON_THE_MODULES_NODE = pytest.mark.asyncio(loop_scope="module")


@asynccontextmanager
async def running_node(
    *, mono: Callable[[], float] = time.monotonic, **settings: object
) -> AsyncIterator[Node]:
    """A node on SETTINGS, its time measured from MONO (a test may step it under the node)."""
    node = Node(Settings(**settings), mono=mono)  # type: ignore[arg-type]
    task = asyncio.create_task(node.run(serve_http=False), name="test-node")
    started = asyncio.create_task(node.started.wait())
    await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        started.cancel()
        task.result()  # raises what stopped the node
    await asyncio.wait_for(node.messaging.publisher.wait_ready(), 30)
    await asyncio.wait_for(node.messaging.live_publisher.wait_ready(), 30)
    try:
        yield node
    finally:
        node.request_stop()
        await asyncio.wait_for(task, 30)


# The node refuses writes a browser form could make: a body that is not JSON, or a body-less write
# with neither a JSON content type nor a bearer key. Test clients send JSON unless told otherwise.
WRITE = {"content-type": "application/json"}


def client(node: Node) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=node.serving.app),
        base_url="http://127.0.0.1",
        headers=WRITE,
    )


def bearer(token: str) -> dict[str, str]:
    """The header an API key is sent in."""
    return {"authorization": f"Bearer {token}"}


async def jobs_stored(database_url: str) -> int:
    """How many jobs the node's database holds (a refused request must not change it)."""
    connection = await asyncpg.connect(database_url)
    try:
        return int(await connection.fetchval("SELECT count(*) FROM jobs"))
    finally:
        await connection.close()
