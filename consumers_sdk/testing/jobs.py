"""``make_job``: a Job as a handler receives it, built without a broker.

The job is decoded from a delivery shaped like the dispatcher's (the message contract's headers,
the payload as JSON) by the consumer's own decoder, so a payload that would not survive the trip
(a set, a datetime) fails here as it would in production.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import orjson
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from consumers_sdk import contract, validation
from consumers_sdk import job as job_mod


def make_job(
    payload: Any = None,
    *,
    headers: Mapping[str, contract.HeaderValue] | None = None,
    attempt: int = 1,
    routing_key: str = "test.job",
    job_id: str | None = None,
    run_at: datetime | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    retry_backoff: Sequence[timedelta | float] | None = None,
) -> job_mod.Job:
    """A job delivered to a handler: ``payload`` (anything JSON can hold), the producer's
    ``headers``, its ``attempt`` (1 for the first delivery, 2 for the first retry, ...).

    ``max_attempts`` and ``retry_backoff`` (seconds or timedeltas after each failed attempt) are
    the job's own retry policy, as the dispatcher publishes it: ``run_handler`` honours them over
    the handler's. ``job_id`` defaults to a new UUID, ``run_at`` to now. A reserved header name
    (``x-retry-``, ``x-death``, ...) is refused: use ``attempt`` and the policy arguments instead.
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError("attempt must be an integer of at least 1")
    problem = validation.routing_key_problem(routing_key)
    if problem is not None:
        raise ValueError(f"routing_key {problem}")
    for name in headers or {}:
        problem = contract.header_name_problem(name)
        if problem is not None:
            raise ValueError(f"headers: {problem}; give attempt=, max_attempts=, retry_backoff=")
    body = orjson.dumps(payload)
    job_id = job_id or str(uuid.uuid4())
    now = datetime.now(UTC)
    wire_headers: dict[str, contract.HeaderValue] = {
        **contract.message_headers(
            job_id=job_id,
            run_at=run_at or now,
            idempotency_key=idempotency_key,
            user_headers=dict(headers or {}),
            dispatch_round=str(uuid.uuid4()),
        ),
        **_policy(max_attempts, retry_backoff),
    }
    if attempt > 1:
        wire_headers[job_mod.HEADER_ATTEMPT] = attempt
    message = _delivery(routing_key, body, job_id, wire_headers, now)
    return job_mod.from_message(message, work_queue=routing_key)


def _policy(
    max_attempts: int | None, retry_backoff: Sequence[timedelta | float] | None
) -> dict[str, contract.HeaderValue]:
    if max_attempts is not None and (problem := validation.max_attempts_problem(max_attempts)):
        raise ValueError(f"max_attempts {problem}")
    backoff_s = None
    if retry_backoff is not None:
        backoff_s = [
            step.total_seconds() if isinstance(step, timedelta) else float(step)
            for step in retry_backoff
        ]
        if found := validation.retry_backoff_problem(backoff_s):
            raise ValueError(f"retry_backoff{found[0]} {found[1]}")
    return contract.retry_policy_headers(max_attempts=max_attempts, backoff_s=backoff_s)


def _delivery(
    routing_key: str,
    body: bytes,
    job_id: str,
    headers: dict[str, contract.HeaderValue],
    at: datetime,
) -> aio_pika.IncomingMessage:
    """The message as aio-pika builds it from the wire; it has no channel, so nothing settles it
    (``run_handler`` decides the outcome instead)."""
    properties = aio_pika.Message(
        body,
        headers=dict(headers),
        message_id=job_id,
        content_type=contract.CONTENT_TYPE,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        timestamp=at,
    ).properties
    return aio_pika.IncomingMessage(
        DeliveredMessage(
            delivery=Basic.Deliver(
                consumer_tag="testing",
                delivery_tag=1,
                exchange=contract.EXCHANGE,
                routing_key=routing_key,
            ),
            header=ContentHeader(body_size=len(body), properties=properties),
            body=body,
            channel=None,  # type: ignore[arg-type]
        )
    )
