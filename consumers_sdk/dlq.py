"""Dead-letter queues: list them (management API) and move dead jobs back to their work queue
(over AMQP), dropping the copies of jobs requeued or finished since (``dlq_check``).
``dispatcher dlq list|requeue`` calls these."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
)

from consumers_sdk import broker_urls, contract, dlq_check, failover, job, management, topology
from consumers_sdk.errors import DlqError

BATCH = 100  # dead jobs moved per round of pipelined confirms


@dataclass(frozen=True, slots=True)
class DeadQueue:
    name: str
    messages: int | None  # None: the broker could not say
    work_queue: str


@dataclass(frozen=True, slots=True)
class Requeued:
    """What ``requeue`` did: ``moved`` copies back to the work queue, ``dropped`` ones by reason
    (``requeued``, ``succeeded``, ``cancelled``, ``expired``); ``checked``: asked the dispatcher."""

    moved: int
    dropped: Mapping[str, int] = field(default_factory=dict)
    checked: bool = False

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def dropped_text(self) -> str:
        """``dropped 2 dead copies of jobs requeued or finished since (requeued 1, succeeded
        1)``, or that the copies were not checked."""
        if not self.checked:
            return "dead copies not checked against the dispatcher (each was moved)"
        reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(self.dropped.items()))
        return f"dropped {self.dropped_total} dead copies of jobs requeued or finished since" + (
            f" ({reasons})" if reasons else ""
        )


def work_queue_of(dead_queue: str) -> str:
    if not dead_queue.endswith(topology.DEAD_SUFFIX):
        raise DlqError(
            f"{dead_queue!r} is not a dead-letter queue (names end in {topology.DEAD_SUFFIX})"
        )
    return dead_queue.removesuffix(topology.DEAD_SUFFIX)


async def list_queues(
    amqp_url: str, management_url: str, *, only: Callable[[str], bool] | None = None
) -> list[tuple[str, int | None]]:
    """(name, messages) of the queues of the AMQP URL's vhost (those ``only`` keeps), by name.

    Names come from the management API. Its counts are refreshed every few seconds, and RabbitMQ
    4 can turn them off (``messages: null``): a queue it gives no count for is counted with a
    passive declaration, and one that cannot be counted either is None, never 0."""
    async with management.connect(management_url) as http:
        path = f"/api/queues/{management.vhost_path(amqp_url)}"
        response = await management.request(http, "GET", path, params={"columns": "name,messages"})
    listed: dict[str, int | None] = {
        str(queue["name"]): queue.get("messages")
        for queue in response.json()
        if only is None or only(str(queue["name"]))
    }
    uncounted = [name for name, messages in listed.items() if not isinstance(messages, int)]
    if uncounted:
        listed.update(await _count(amqp_url, uncounted))
    return sorted(listed.items())


async def _count(amqp_url: str, names: list[str]) -> dict[str, int | None]:
    counts: dict[str, int | None] = dict.fromkeys(names)
    try:
        connection = await _connect(amqp_url)
    except DlqError:
        return counts
    try:
        channel = None
        for name in names:
            try:
                if channel is None or channel.is_closed:
                    channel = await connection.channel()
                queue = await channel.declare_queue(name, passive=True)
                counts[name] = queue.declaration_result.message_count or 0
            except aiormq.exceptions.AMQPError:
                channel = None  # gone since it was listed: its channel is closed
    finally:
        await connection.close()
    return counts


async def list_dead(amqp_url: str, management_url: str) -> list[DeadQueue]:
    """The dead-letter queues of the AMQP URL's vhost with their message counts."""
    return [
        DeadQueue(name, messages, work_queue_of(name))
        for name, messages in await list_queues(
            amqp_url, management_url, only=lambda name: name.endswith(topology.DEAD_SUFFIX)
        )
    ]


async def _passive(channel: AbstractChannel, name: str) -> AbstractQueue:
    try:
        return await channel.declare_queue(name, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise DlqError(f"no queue {name!r} in this vhost") from exc


async def requeue(
    amqp_url: str,
    queue: str,
    *,
    limit: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    lookup: dlq_check.JobLookup | None = None,
) -> Requeued:
    """Move up to ``limit`` dead jobs (those present when it starts) back to their work queue,
    attempts reset, routing key kept. ``progress(done, total)`` after each batch.

    With ``lookup`` (the dispatcher's API), a copy whose job was requeued or finished since is
    dropped rather than moved (``dlq_check``); without it every copy is moved, as before the
    check existed (``checked`` is False). Each job is published with confirms and mandatory
    routing before its dead copy is acked: a crash in between leaves it in both queues
    (at-least-once), never in neither.
    """
    work = work_queue_of(queue)
    if limit is not None and limit < 0:
        raise DlqError("limit must not be negative")
    if queue == topology.EVENTS_DEAD_QUEUE:
        lookup = None  # job events, not jobs: the dispatcher has nothing to say about them
    connection = await _connect(amqp_url)
    moved, dropped = 0, Counter[str]()
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        dead = await _passive(channel, queue)
        await _passive(channel, work)
        total = dead.declaration_result.message_count or 0
        total = total if limit is None else min(total, limit)
        while (done := moved + dropped.total()) < total:
            batch: list[AbstractIncomingMessage] = []
            while len(batch) < min(BATCH, total - done):
                message = await dead.get(fail=False)
                if message is None:
                    break
                batch.append(message)
            if not batch:
                break
            if lookup is not None:
                try:
                    batch = await _drop_stale(batch, lookup, dropped)
                except DlqError as exc:
                    raise DlqError(
                        f"moved {moved}, dropped {dropped.total()}, then: {exc}"
                    ) from exc
            count, failure = await _move(channel, batch, work)
            moved += count
            if progress is not None:
                progress(moved + dropped.total(), total)
            if failure is not None:
                raise DlqError(f"moved {moved}, then could not republish to {work!r}: {failure!r}")
    finally:
        await connection.close()
    return Requeued(moved, dict(dropped), checked=lookup is not None)


async def _drop_stale(
    batch: list[AbstractIncomingMessage], lookup: dlq_check.JobLookup, dropped: Counter[str]
) -> list[AbstractIncomingMessage]:
    """Ack away the copies whose job must not run again; returns the others, to move. The
    batch stays unacked (it goes back to .dead) when the dispatcher cannot answer."""
    reasons = await lookup.reasons([(m.message_id, _dead_at(m)) for m in batch])
    kept = []
    for message, reason in zip(batch, reasons, strict=True):
        if reason is None:
            kept.append(message)
        else:
            await message.ack()
            dropped[reason] += 1
    return kept


def _dead_at(message: AbstractIncomingMessage) -> datetime | None:
    value = (message.headers or {}).get(job.DEAD_AT)
    text = value.decode() if isinstance(value, bytes) else value
    try:
        return contract.parse_run_at(text) if isinstance(text, str) else None
    except ValueError:
        return None


async def requeue_job(
    amqp_url: str, queue: str, job_id: str, *, exchange: str = contract.EXCHANGE
) -> str:
    """Publish one dead job (by id) back to ``exchange`` with its original routing key and its
    attempt history in its headers, then take it off ``queue``; returns the routing key.

    The dead jobs looked at before it are held unacked until the end, then handed back in their
    order, so each is looked at once. DlqError when the job is not in the queue.
    """
    connection = await _connect(amqp_url)
    held: list[AbstractIncomingMessage] = []
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        dead = await _passive(channel, queue)
        target = await channel.get_exchange(exchange, ensure=False)
        for _ in range(dead.declaration_result.message_count or 0):
            message = await dead.get(fail=False)
            if message is None:
                break
            if message.message_id != job_id:
                held.append(message)
                continue
            routing_key, copy = job.returned_copy(message)
            try:
                await target.publish(copy, routing_key=routing_key)
            except Exception as exc:
                held.append(message)
                raise DlqError(f"could not republish {job_id} to {exchange!r}: {exc!r}") from exc
            await message.ack()
            return routing_key
        raise DlqError(f"no job {job_id} in {queue!r}")
    finally:
        for message in held:
            await message.nack(requeue=True)
        await connection.close()


async def _connect(amqp_url: str) -> AbstractConnection:
    """The first node of AMQP_URL (one URL or a cluster's) that answers."""
    try:
        return await failover.connect(amqp_url, connection_name="dispatcher-dlq")
    except (OSError, aiormq.exceptions.AMQPConnectionError) as exc:
        hosts = ", ".join(str(urlsplit(url).hostname) for url in broker_urls.parse(amqp_url))
        raise DlqError(f"RabbitMQ at {hosts}: {exc!r}") from exc


async def _move(
    channel: AbstractChannel, batch: list[AbstractIncomingMessage], work: str
) -> tuple[int, BaseException | None]:
    """Publish the batch with pipelined confirms; ack what was confirmed, hand back the rest."""
    results = await asyncio.gather(
        *(
            channel.default_exchange.publish(job.revived_copy(message), routing_key=work)
            for message in batch
        ),
        return_exceptions=True,
    )
    done, failure = 0, None
    for message, result in zip(batch, results, strict=True):
        if isinstance(result, BaseException):
            failure = result
            await message.nack(requeue=True)  # stays dead
        else:
            await message.ack()
            done += 1
    return done, failure
