"""Driving an in-process node's API from hypothesis, which runs in a worker thread: calls are run
on the test's loop; and what every answer must look like."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import httpx

from dispatcher.node import Node
from tests.support.nodes import client

T = TypeVar("T")
REFUSALS = {400, 413, 422}


def assert_answer(response: httpx.Response) -> None:
    """A 2xx, or one of the documented refusals as a JSON error naming each field at fault."""
    assert response.status_code < 500, response.text
    if response.is_success:
        return
    assert response.status_code in REFUSALS, response.text
    assert response.headers["content-type"] == "application/json", response.text
    problem = response.json()
    assert problem["error"], problem
    assert problem["message"], problem
    assert problem["fields"], problem
    for item in problem["fields"]:
        assert item["field"], problem
        assert item["message"], problem


class Probe:
    """Runs the app's calls on the test's loop while hypothesis drives from a worker thread."""

    timeout_s = 60.0  # one call, as hypothesis waits for it

    def __init__(self, node: Node, database_url: str) -> None:
        self._loop = asyncio.get_running_loop()
        self.http = client(node)
        self._database_url = database_url

    def run(self, call: Callable[[], Awaitable[T]]) -> T:
        async def wrapped() -> T:
            return await call()

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result(self.timeout_s)

    def post(self, path: str, content: bytes) -> httpx.Response:
        return self.send("POST", path, content)

    def send(self, method: str, path: str, content: bytes | None = None) -> httpx.Response:
        headers = {"content-type": "application/json"}
        return self.run(lambda: self.http.request(method, path, content=content, headers=headers))

    def stored(self, table: str = "jobs") -> int:
        return int(self.fetchval(f"SELECT count(*) FROM {table}"))

    def fetch(self, query: str, *args: object) -> list[asyncpg.Record]:
        async def fetch() -> list[asyncpg.Record]:
            connection = await asyncpg.connect(self._database_url)
            try:
                return await connection.fetch(query, *args)
            finally:
                await connection.close()

        return self.run(fetch)

    def fetchval(self, query: str, *args: object) -> object:
        [row] = self.fetch(query, *args)
        return row[0]

    async def close(self) -> None:
        await self.http.aclose()
