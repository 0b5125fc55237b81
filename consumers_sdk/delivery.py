"""The outcome of one delivery: run its handler, then ack it, retry it through a wait queue, or
park it in .dead, as ``outcome.py`` decides (its rules, carried out here on the broker):

- the handler returns: ack;
- it raises (or runs past ``timeout``): retried after ``backoff(attempt)``, rounded up to a delay
  tier, until ``max_attempts``; then .dead. A job's own retry policy (``contract.RetryPolicy``,
  from its headers) replaces the handler's ``max_attempts`` and ``backoff``;
- it raises ``Retry(delay=)``: retried after that delay instead of the backoff;
- it raises ``Reject``, or the delivery breaks the message contract: .dead at once.

A failed delivery moves by publishing a copy (publisher confirms, mandatory routing) to its wait
queue or to .dead and only then acking the original: a queue has one dead-letter exchange, so a
plain ``nack(requeue=False)`` could neither choose the delay tier per job (jittered backoff,
``Retry(delay=)``) nor add the error headers. The wait queue's TTL dead-letters the copy back to
the work queue (at-least-once on quorum queues), and ``x-death`` records each retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from consumers_sdk import acks as acks_mod
from consumers_sdk import contract, dedup, errors, outcome, reporter, topology, tracing
from consumers_sdk import job as job_mod
from consumers_sdk import metrics as metrics_mod

logger = logging.getLogger(__name__)


class Outcomes:
    """Settles deliveries; ``publisher`` is a channel with confirms and ``on_return_raises``,
    replaced by ``open_publisher()`` after a nack."""

    def __init__(
        self,
        publisher: AbstractChannel,
        *,
        open_publisher: Callable[[], Awaitable[AbstractChannel]] | None = None,
        acks: acks_mod.Acks,
        tiers: Sequence[float],
        deduplicator: dedup.Deduplicator | None,
        events: reporter.EventReporter | None = None,
        metrics: metrics_mod.ConsumerMetrics | None = None,
        group: str = "",
    ) -> None:
        self._publisher = publisher
        self._open_publisher = open_publisher
        self._renewing = asyncio.Lock()
        self._acks = acks
        self._tiers = tiers
        self._dedup = deduplicator
        self._events = events
        self._metrics = metrics
        self._group = group  # the metrics' label

    def _report(
        self,
        job_id: str | None,
        routing_key: str,
        attempt: int,
        event: str,
        error: str | None,
        dispatch_round: str | None,
    ) -> None:
        if self._events is not None and job_id:
            self._events.report(
                job_id=job_id,
                routing_key=routing_key,
                attempt=attempt,
                outcome=event,
                error=error,
                dispatch_round=dispatch_round,
            )

    def _report_job(self, job: job_mod.Job, event: str, error: str | None = None) -> None:
        """An event about this delivery, echoing the round the job was parsed with."""
        self._report(job.id, job.routing_key, job.attempt, event, error, job.dispatch_round)

    async def process(self, spec: outcome.HandlerSpec, message: AbstractIncomingMessage) -> None:
        try:
            job = job_mod.from_message(message, work_queue=spec.queue)
        except job_mod.Undecodable as exc:
            await self._dead(spec, message, attempts=1, error=exc, job=None)
            return
        if self._dedup is not None and await self._dedup.seen(job.id):
            self._acks.ack(message)
            return
        self._report_job(job, "started")
        decided = await self._attempt(spec, job)
        if decided.kind == "acked":
            self._acks.ack(message)
            self._report_job(job, "succeeded")
            if self._dedup is not None:
                await self._dedup.remember(job.id)
        elif decided.kind == "retried":
            await self._retry(spec, job, decided)
        else:
            assert decided.error is not None  # only "acked" has none
            await self._dead(spec, message, attempts=job.attempt, error=decided.error, job=job)

    async def _attempt(self, spec: outcome.HandlerSpec, job: job_mod.Job) -> outcome.Outcome:
        """The handler's attempt and what it comes to, in a span that continues the job's trace,
        timed for the metrics (a consumer stopping mid-attempt counts nothing)."""
        started = time.monotonic()
        with tracing.handler_span(job, queue=spec.queue) as span:
            decided = await outcome.handle(spec, job, tiers=self._tiers)
            span.ended(decided.error)
        if self._metrics is not None:
            result = "handled" if decided.kind == "acked" else "failed"
            elapsed_s = time.monotonic() - started
            self._metrics.outcome(self._group, spec.routing_key, result, elapsed_s)
        return decided

    async def _retry(
        self, spec: outcome.HandlerSpec, job: job_mod.Job, decided: outcome.Outcome
    ) -> None:
        # both set on "retried"
        assert decided.reason is not None
        assert decided.tier_s is not None
        if self._metrics is not None:
            self._metrics.moved(self._group, spec.routing_key, tier_s=decided.tier_s)
        # Each failed attempt is logged with its traceback, as a dead one is: the first sign of a
        # broken handler must not wait for its job's last attempt.
        logger.warning(
            "job %s (%s) attempt %d failed, again in %.1fs: %s",
            job.id,
            job.routing_key,
            job.attempt,
            decided.tier_s,
            decided.reason,
            exc_info=decided.error,
        )
        self._report_job(job, "failed", decided.reason)
        copy = job_mod.retry_copy(job, error=decided.reason, work_queue=spec.queue)
        await self._move(job.message, copy, topology.wait_queue(spec.queue, decided.tier_s))

    async def _dead(
        self,
        spec: outcome.HandlerSpec,
        message: AbstractIncomingMessage,
        *,
        attempts: int,
        error: BaseException,
        job: job_mod.Job | None,
    ) -> None:
        """Park the delivery in .dead; ``job`` is None when it could not be decoded, and only
        then is its event's round read from the message itself."""
        text = outcome.error_text(error)
        if self._metrics is not None:
            self._metrics.moved(self._group, spec.routing_key, tier_s=None)
        logger.warning(
            "job %s dead after %d attempts: %s",
            message.message_id,
            attempts,
            text,
            exc_info=None if isinstance(error, errors.Reject) else error,  # a Reject is meant
        )
        if job is not None:
            self._report_job(job, "dead", text)
        else:
            self._report(
                message.message_id,
                job_mod.routing_key_of(message),
                attempts,
                "dead",
                text,
                contract.read_round(message.headers or {}),
            )
        copy = job_mod.dead_copy(
            message, attempts=attempts, error=text, work_queue=spec.queue, at=datetime.now(UTC)
        )
        await self._move(message, copy, topology.dead_queue(spec.queue))

    async def _move(
        self, message: AbstractIncomingMessage, copy: aio_pika.Message, target: str
    ) -> None:
        """Publish the copy (confirmed, and routed) to ``target``, then ack the original."""
        publisher = self._publisher
        try:
            await publisher.default_exchange.publish(copy, routing_key=target)
        except Exception as exc:  # not confirmed, or no such queue: keep the original
            logger.warning("could not move job %s to %s: %r", message.message_id, target, exc)
            if isinstance(getattr(exc, "frame", None), aiormq.spec.Basic.Nack):
                await self._renew_publisher(publisher)
            await self._acks.nack(message)
            return
        self._acks.ack(message)

    async def _renew_publisher(self, nacked_on: AbstractChannel) -> None:
        """A fresh channel after a nack: RabbitMQ (3.10 at least) can go on refusing every
        publish on a channel whose first publish to a quorum queue came during its leader's
        election, while a new channel is not affected."""
        async with self._renewing:
            if self._open_publisher is None or nacked_on is not self._publisher:
                return  # renewed already by another move
            try:
                self._publisher = await self._open_publisher()
            except Exception as exc:  # the connection is going away: its reconnect renews all
                logger.warning("channel not renewed after a nack: %r", exc)
                return
            logger.info("new channel after a nack")
            with contextlib.suppress(Exception):
                await nacked_on.close()
