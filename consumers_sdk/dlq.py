"""Dead-letter queues: list them (management API) and move dead jobs back to their work queue."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import aio_pika
import httpx
from aio_pika.abc import FieldValue

DEAD_SUFFIX = ".dead"
# Headers that record a job's failed life; a requeued job starts its attempts afresh.
_HISTORY_PREFIXES = ("x-death", "x-first-death", "x-last-death", "x-retry-", "x-dead-")


@dataclass(frozen=True, slots=True)
class DeadQueue:
    name: str
    messages: int
    work_queue: str


def _vhost(amqp_url: str) -> str:
    path = urlsplit(amqp_url).path.lstrip("/")
    return path or "/"


async def list_dead(amqp_url: str, management_url: str) -> list[DeadQueue]:
    parts = urlsplit(management_url)
    auth = (parts.username or "guest", parts.password or "guest")
    base = f"{parts.scheme}://{parts.hostname}:{parts.port or 15672}"
    vhost = quote(_vhost(amqp_url).replace("%2F", "/"), safe="")
    async with httpx.AsyncClient(base_url=base, auth=auth, timeout=10) as http:
        response = await http.get(f"/api/queues/{vhost}", params={"columns": "name,messages"})
        response.raise_for_status()
    return [
        DeadQueue(q["name"], int(q.get("messages") or 0), q["name"].removesuffix(DEAD_SUFFIX))
        for q in response.json()
        if q["name"].endswith(DEAD_SUFFIX)
    ]


def _progress(done: int, total: int) -> None:
    width = 30
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    sys.stderr.flush()


async def requeue(
    amqp_url: str, queue: str, *, limit: int | None = None, progress: bool = True
) -> int:
    """Move up to ``limit`` dead jobs back to their work queue; returns how many moved."""
    if not queue.endswith(DEAD_SUFFIX):
        raise ValueError(f"{queue!r} is not a dead-letter queue (names end in {DEAD_SUFFIX})")
    work = queue.removesuffix(DEAD_SUFFIX)
    connection = await aio_pika.connect_robust(
        amqp_url, client_properties={"connection_name": "dispatcher-dlq"}
    )
    moved = 0
    try:
        channel = await connection.channel(publisher_confirms=True)
        dead = await channel.declare_queue(queue, passive=True)
        total = dead.declaration_result.message_count or 0
        if limit is not None:
            total = min(total, limit)
        while moved < total:
            message = await dead.get(fail=False)
            if message is None:
                break
            headers: dict[str, FieldValue] = {
                key: value
                for key, value in (message.headers or {}).items()
                if not key.startswith(_HISTORY_PREFIXES)
            }
            copy = aio_pika.Message(
                body=message.body,
                headers=headers,
                content_type=message.content_type,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                priority=message.priority,
                message_id=message.message_id,
                timestamp=message.timestamp,
            )
            await channel.default_exchange.publish(copy, routing_key=work)  # confirmed
            await message.ack()
            moved += 1
            if progress:
                _progress(moved, total)
        if progress:
            sys.stderr.write("\n")
    finally:
        await connection.close()
    return moved
