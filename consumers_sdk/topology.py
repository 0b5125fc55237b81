"""Queue names and arguments, from tiny pure functions, and their idempotent declaration.

For a handler of group ``billing`` on routing key ``orders.expire``:

    billing.orders.expire                work queue, bound to dispatcher.jobs with the key;
                                         dead-letters to .dead (past the quorum delivery limit,
                                         or the job's own ttl ran out while it waited here)
    billing.orders.expire.retry.<tier>   wait queue per delay tier: TTL = tier, then dead-letters
                                         back to the work queue (default exchange, queue name)
    billing.orders.expire.dead           dead jobs: max attempts, Reject, undecodable, or the above

and, shared by every dispatcher node, ``dispatcher.events`` (consumers' outcome events) with
``dispatcher.events.dead`` (events refused or redelivered past the limit).

Every quorum queue states its delivery limit and what happens past it: RabbitMQ 4 gives a queue
declared without one a limit of 20 and then drops the message. Work, wait and events queues
dead-letter past ``POISON_DELIVERY_LIMIT``; dead-letter queues never drop (``-1`` on 4.x; 3.x
has no default limit and reads ``-1`` as "drop at the first return", so there it is left out).

Wait queues belong to one work queue (not shared by the group) so the RabbitMQ UI shows which
handler's jobs are waiting, and deleting a handler's queues leaves the others alone. Quorum
queues (the default) dead-letter at-least-once, which needs ``x-overflow: reject-publish``;
classic queues dead-letter at-most-once (no confirms inside the broker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, FieldValue

from consumers_sdk import contract, failover
from consumers_sdk.errors import TopologyMismatch

logger = logging.getLogger(__name__)

QueueType = Literal["quorum", "classic"]
Arguments = dict[str, FieldValue]
DEAD_SUFFIX = ".dead"
EVENTS_DEAD_QUEUE = f"{contract.EVENTS_QUEUE}{DEAD_SUFFIX}"
# A message that keeps killing its consumer (redelivered this often) is dead-lettered.
POISON_DELIVERY_LIMIT = 50
# The broker major version assumed when it cannot be read: 4.x is what teams deploy.
DEFAULT_MAJOR = 4


def work_queue(group: str, routing_key: str) -> str:
    return f"{group}.{routing_key}"


def tier_label(tier_s: float) -> str:
    milliseconds = round(tier_s * 1000)
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


def wait_queue(work: str, tier_s: float) -> str:
    return f"{work}.retry.{tier_label(tier_s)}"


def dead_queue(work: str) -> str:
    return f"{work}{DEAD_SUFFIX}"


def major_of(version: object) -> int | None:
    """3 of "3.10.8", 4 of "4.0.5"; None for anything else."""
    text = version.decode(errors="replace") if isinstance(version, bytes) else str(version)
    head = text.strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def broker_major(connection: AbstractConnection) -> int:
    """The major version the broker announced when the connection opened."""
    transport = getattr(connection, "transport", None)
    underlay = getattr(transport, "connection", None)
    properties = getattr(underlay, "server_properties", None) or {}
    return major_of(properties.get("version", "")) or DEFAULT_MAJOR


def _typed(queue_type: QueueType) -> Arguments:
    if queue_type == "classic":
        return {}
    # Quorum queues are the only type whose dead-lettering is at-least-once.
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def _poison_guard(queue_type: QueueType) -> Arguments:
    return {"x-delivery-limit": POISON_DELIVERY_LIMIT} if queue_type == "quorum" else {}


def work_arguments(work: str, queue_type: QueueType) -> Arguments:
    arguments = _typed(queue_type)
    arguments["x-dead-letter-exchange"] = ""
    arguments["x-dead-letter-routing-key"] = dead_queue(work)
    arguments.update(_poison_guard(queue_type))
    return arguments


def wait_arguments(work: str, tier_s: float, queue_type: QueueType) -> Arguments:
    arguments = _typed(queue_type)
    arguments["x-message-ttl"] = round(tier_s * 1000)
    arguments["x-dead-letter-exchange"] = ""
    arguments["x-dead-letter-routing-key"] = work
    arguments.update(_poison_guard(queue_type))
    return arguments


def dead_arguments(queue_type: QueueType, major: int = DEFAULT_MAJOR) -> Arguments:
    if queue_type == "classic":
        return {}
    arguments: Arguments = {"x-queue-type": "quorum"}
    if major >= 4:
        arguments["x-delivery-limit"] = -1  # never drop: 4.x would default to 20
    return arguments


def events_arguments() -> Arguments:
    arguments = _typed("quorum")
    arguments["x-dead-letter-exchange"] = ""
    arguments["x-dead-letter-routing-key"] = EVENTS_DEAD_QUEUE
    arguments.update(_poison_guard("quorum"))
    return arguments


@dataclass(frozen=True, slots=True)
class Exchange:
    name: str
    arguments: Mapping[str, FieldValue] = field(default_factory=dict)


APPLY_POLICIES = "dispatcher broker apply-policies"
# How to bring a queue an earlier release declared up to date, as its warning says.
MEND_WITH_POLICIES = (
    "a message redelivered past RabbitMQ's default limit can be dropped; run "
    f"'{APPLY_POLICIES}' to mend it in place"
)
MEND_BY_RECREATING = (
    "it lives on one node and is lost with it; see the upgrade notes to move it to a quorum "
    "queue (a queue's type never changes in place)"
)


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """One durable queue: its arguments, its bindings, and the arguments an earlier release
    declared it with (a queue that still has those is kept, with a warning saying ``mend``)."""

    name: str
    arguments: Mapping[str, FieldValue]
    bindings: tuple[tuple[Exchange, str], ...] = ()
    earlier: Mapping[str, FieldValue] | None = None
    mend: str = MEND_WITH_POLICIES


def jobs_exchange(name: str = contract.EXCHANGE) -> Exchange:
    return Exchange(name, dict(contract.exchange_arguments()))


EVENTS = Exchange(contract.EVENTS_EXCHANGE)


def handler_queues(
    *,
    work: str,
    routing_key: str,
    tiers: Sequence[float],
    queue_type: QueueType,
    major: int,
    exchange: str = contract.EXCHANGE,
) -> list[QueueSpec]:
    """A handler's dead, wait and work queues, in the order they are declared (each queue's
    dead-letter target exists before the queue that routes to it)."""
    dead = dead_arguments(queue_type, major)
    specs = [QueueSpec(dead_queue(work), dead, earlier=_without_limit(dead))]
    for tier in tiers:
        waiting = wait_arguments(work, tier, queue_type)
        specs.append(QueueSpec(wait_queue(work, tier), waiting, earlier=_without_limit(waiting)))
    bindings = ((jobs_exchange(exchange), routing_key),)
    specs.append(QueueSpec(work, work_arguments(work, queue_type), bindings))
    return specs


def _without_limit(arguments: Arguments) -> Arguments | None:
    """What an earlier release declared: the same, without a delivery limit (None: no limit)."""
    if "x-delivery-limit" not in arguments:
        return None
    return {name: value for name, value in arguments.items() if name != "x-delivery-limit"}


def events_queues(major: int) -> list[QueueSpec]:
    """``dispatcher.events.dead``, then ``dispatcher.events`` bound to every event."""
    return [
        QueueSpec(EVENTS_DEAD_QUEUE, dead_arguments("quorum", major)),
        QueueSpec(
            contract.EVENTS_QUEUE,
            events_arguments(),
            ((EVENTS, "#"),),
            earlier={"x-queue-type": "quorum"},
        ),
    ]


def parked_queues(name: str, queue_type: QueueType = "quorum") -> Build:
    """The dispatcher's queue of unroutable jobs, NAME: a quorum queue unless told otherwise (it
    must outlive the loss of a node, as every other queue does). Releases before declared it
    classic: such a queue is kept, with a warning."""

    def build(major: int) -> list[QueueSpec]:
        earlier: Arguments | None = {} if queue_type == "quorum" else None
        return [
            QueueSpec(
                name, dead_arguments(queue_type, major), earlier=earlier, mend=MEND_BY_RECREATING
            )
        ]

    return build


Build = Callable[[int], Sequence[QueueSpec]]


async def declare(
    urls: failover.Urls, build: Build, *, connection_name: str = "dispatcher-declare"
) -> dict[str, Arguments]:
    """Declare the queues ``build(broker major)`` lists, with their exchanges and bindings, over
    a plain connection of its own (a refused declaration closes its channel; a robust one would
    replay it). Returns each queue's arguments as it stands, for a robust channel to redeclare
    (identical, so idempotent) after a reconnect.

    A queue still holding what an earlier release declared is kept, with a warning: RabbitMQ
    refuses to change a queue's arguments, and the policies of ``dispatcher broker
    apply-policies`` mend it in place. Any other difference raises ``TopologyMismatch``.
    """
    connection = await failover.connect(urls, connection_name=connection_name)
    try:
        return await _Declaring(connection).all(build(broker_major(connection)))
    finally:
        await connection.close()


class _Declaring:
    def __init__(self, connection: AbstractConnection) -> None:
        self._connection = connection
        self._channel: AbstractChannel | None = None
        self._exchanges: set[str] = set()

    async def _open(self) -> AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel()
        return self._channel

    async def all(self, specs: Sequence[QueueSpec]) -> dict[str, Arguments]:
        return {spec.name: await self.queue(spec) for spec in specs}

    async def queue(self, spec: QueueSpec) -> Arguments:
        # Exchanges first: a refused declaration of one closes the channel the queue is bound on.
        bindings = [(await self._exchange(exchange), key) for exchange, key in spec.bindings]
        arguments = dict(spec.arguments)
        try:
            queue = await (await self._open()).declare_queue(
                spec.name, durable=True, arguments=arguments
            )
        except aiormq.exceptions.ChannelPreconditionFailed as refused:
            arguments = await self._earlier(spec, refused)
            queue = await (await self._open()).declare_queue(
                spec.name, durable=True, arguments=arguments
            )
        for exchange, routing_key in bindings:
            await queue.bind(exchange, routing_key)
        return arguments

    async def _earlier(
        self, spec: QueueSpec, refused: aiormq.exceptions.ChannelPreconditionFailed
    ) -> Arguments:
        if spec.earlier is not None:
            earlier = dict(spec.earlier)
            try:
                await (await self._open()).declare_queue(spec.name, durable=True, arguments=earlier)
            except aiormq.exceptions.ChannelPreconditionFailed:
                pass
            else:
                logger.warning(
                    "queue %r was declared by an earlier release, without %s: %s",
                    spec.name,
                    sorted(set(spec.arguments) - set(earlier)),
                    spec.mend,
                    extra={"action": "topology", "queue": spec.name},
                )
                return earlier
        raise TopologyMismatch(spec.name, dict(spec.arguments), str(refused))

    async def _exchange(self, exchange: Exchange) -> aio_pika.abc.AbstractExchange:
        if exchange.name not in self._exchanges:
            try:
                await (await self._open()).declare_exchange(
                    exchange.name,
                    aio_pika.ExchangeType.TOPIC,
                    durable=True,
                    arguments=dict(exchange.arguments),
                )
            except aiormq.exceptions.ChannelAccessRefused as exc:
                # A consumer's user needs no configure right on the dispatcher's exchanges (the
                # dispatcher declares them): binding to one takes read only. The refusal closed
                # the channel; ``_open`` opens another.
                logger.info("exchange %r not declared (%r); bound as it stands", exchange.name, exc)
            self._exchanges.add(exchange.name)
        return await (await self._open()).get_exchange(exchange.name, ensure=False)
