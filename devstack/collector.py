"""An independent AMQP consumer for tests: binds a durable queue to the jobs exchange and records
every delivery (a ledger of what arrived, when, and how often)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection, FieldValue

from consumers_sdk import contract, failover

# How late a job may arrive and still be on time, generously: these are not speed tests.
ON_TIME_S = 5.0


@dataclass
class Delivery:
    message_id: str
    routing_key: str
    received_at: float
    body: bytes
    headers: dict[str, object]
    properties: dict[str, object]


@dataclass
class Ledger:
    """Every accepted job classified: delivered once, more than once, early, or lost."""

    once: int = 0
    duplicated: dict[str, int] = field(default_factory=dict)
    early: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        extra = sum(count - 1 for count in self.duplicated.values())
        return (
            f"ledger: delivered once={self.once} more than once={len(self.duplicated)} "
            f"(extra deliveries={extra}) early={len(self.early)} lost={len(self.lost)}"
        )


class Collector:
    """``amqp_url`` may name a cluster's nodes (comma-separated); ``quorum`` makes the collector's
    queue a quorum queue, which outlives the loss of any one node."""

    def __init__(
        self, amqp_url: str, *, binding: str = "#", queue: str | None = None, quorum: bool = False
    ) -> None:
        self._url = amqp_url
        self._binding = binding
        self._arguments: dict[str, FieldValue] = {"x-queue-type": "quorum"} if quorum else {}
        self.queue_name = queue or f"collector.{uuid.uuid4().hex[:8]}"
        self.deliveries: dict[str, list[Delivery]] = {}
        self._connection: AbstractRobustConnection | None = None
        self._changed = asyncio.Event()

    async def start(self) -> None:
        self._connection = await failover.connect_robust(
            self._url, connection_name="test-collector"
        )
        channel = await self._connection.channel()
        await channel.set_qos(prefetch_count=500)
        exchange = await channel.declare_exchange(
            contract.EXCHANGE,
            aio_pika.ExchangeType.TOPIC,
            durable=True,
            arguments=dict[str, FieldValue](contract.exchange_arguments()),
        )
        # Durable, so deliveries survive a broker restart like a real consumer's would.
        queue = await channel.declare_queue(
            self.queue_name, durable=True, arguments=self._arguments
        )
        await queue.bind(exchange, self._binding)
        await queue.consume(self._on_message)

    async def stop(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        message_id = message.message_id or ""
        self.deliveries.setdefault(message_id, []).append(
            Delivery(
                message_id=message_id,
                routing_key=message.routing_key or "",
                received_at=time.time(),
                body=message.body,
                headers=dict(message.headers),
                properties={
                    "content_type": message.content_type,
                    "delivery_mode": message.delivery_mode,
                    "priority": message.priority,
                    "expiration": message.expiration,
                    "timestamp": message.timestamp,
                },
            )
        )
        await message.ack()
        self._changed.set()

    def lateness(self, due: dict[str, float], ids: Iterable[str] | None = None) -> list[float]:
        """How late the first delivery of each job (of IDS, default all in DUE) arrived after
        its due time, sorted; jobs not delivered are left out (the ledger counts them)."""
        wanted = due.keys() if ids is None else ids
        return sorted(
            self.deliveries[job_id][0].received_at - due[job_id]
            for job_id in wanted
            if job_id in self.deliveries
        )

    async def wait_for(self, ids: Iterable[str], deadline_s: float) -> set[str]:
        """Wait until every id arrived or the deadline passed; returns the ids still missing."""
        wanted = set(ids)
        try:
            async with asyncio.timeout(deadline_s):
                while wanted - self.deliveries.keys():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            pass
        return wanted - self.deliveries.keys()

    async def wait_for_count(self, count: int, deadline_s: float) -> int:
        """Wait until ``count`` distinct ids arrived; returns how many are still missing."""
        try:
            async with asyncio.timeout(deadline_s):
                while len(self.deliveries) < count:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            pass
        return max(0, count - len(self.deliveries))

    async def settle(self, quiet_s: float = 1.0) -> None:
        """Wait until nothing has arrived for ``quiet_s`` (late duplicates show up)."""
        while True:
            self._changed.clear()
            try:
                async with asyncio.timeout(quiet_s):
                    await self._changed.wait()
            except TimeoutError:
                return

    async def reckon(
        self, accepted: dict[str, float], *, deadline_s: float = 90, quiet_s: float = 1.5
    ) -> Ledger:
        """Wait for every accepted job (or the deadline), then for late duplicates; the ledger."""
        await self.wait_for(accepted, deadline_s)
        await self.settle(quiet_s)
        return self.ledger(accepted)

    def ledger(self, accepted: dict[str, float], *, tolerance_s: float = 0.0) -> Ledger:
        """Classify accepted jobs (id -> run_at seconds) against what arrived."""
        arrivals = {job_id: [d.received_at for d in got] for job_id, got in self.deliveries.items()}
        return classify(accepted, arrivals, tolerance_s=tolerance_s)


def classify(
    accepted: dict[str, float], arrivals: dict[str, list[float]], *, tolerance_s: float = 0.0
) -> Ledger:
    """Accepted jobs (id -> due, epoch seconds) against their arrival times (id -> [times])."""
    ledger = Ledger()
    for job_id, run_at_s in accepted.items():
        got = arrivals.get(job_id, [])
        if not got:
            ledger.lost.append(job_id)
            continue
        if min(got) < run_at_s - tolerance_s:
            ledger.early.append(job_id)
        if len(got) == 1:
            ledger.once += 1
        else:
            ledger.duplicated[job_id] = len(got)
    return ledger
