"""``run_handler``: one attempt of a consumer's registered handler, and what the consumer would do
with the delivery, decided by the consumer's own rules (``consumers_sdk.outcome``)."""

from __future__ import annotations

from consumers_sdk import consumer as consumer_mod
from consumers_sdk import job as job_mod
from consumers_sdk import outcome


async def run_handler(
    consumer: consumer_mod.Consumer, routing_key: str, job: job_mod.Job
) -> outcome.Outcome:
    """Run the handler ``consumer`` has for ``routing_key`` on ``job`` once, under its
    ``timeout``, and return what the consumer would do with the delivery: ack it, retry it after
    which delay (the handler's ``backoff``, ``Retry(delay=)`` or the job's own policy, rounded up
    to one of the consumer's ``retry_tiers``), or park it in ``.dead`` (``Reject``, or
    ``max_attempts`` spent).

    ``routing_key`` is the key or pattern a handler was registered with, or a key that matches
    exactly one registered pattern (``orders.*``, ``billing.#``). Nothing is published, acked or
    reported, and the consumer's deduplicator is not asked.
    """
    spec = handler_for(consumer, routing_key)
    return await outcome.handle(spec, job, tiers=consumer.retry_tiers)


def handler_for(consumer: consumer_mod.Consumer, routing_key: str) -> outcome.HandlerSpec:
    """The handler registered for ``routing_key`` (its own key or pattern first, else the one
    pattern that matches it); LookupError naming the registered keys when there is none, and
    ValueError when several patterns match."""
    handlers = consumer.handlers
    for spec in handlers:
        if spec.routing_key == routing_key:
            return spec
    matching = [spec for spec in handlers if topic_matches(spec.routing_key, routing_key)]
    if len(matching) > 1:
        keys = ", ".join(spec.routing_key for spec in matching)
        raise ValueError(f"{routing_key!r} matches several handlers ({keys}): name one")
    if not matching:
        keys = ", ".join(spec.routing_key for spec in handlers) or "none"
        raise LookupError(f"no handler for {routing_key!r}; registered: {keys}")
    return matching[0]


def topic_matches(pattern: str, routing_key: str) -> bool:
    """RabbitMQ's topic binding rule: words split on dots, ``*`` is one word, ``#`` zero or
    more."""
    return _words_match(pattern.split("."), routing_key.split("."))


def _words_match(pattern: list[str], words: list[str]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_words_match(rest, words[skip:]) for skip in range(len(words) + 1))
    if not words:
        return False
    return head in ("*", words[0]) and _words_match(rest, words[1:])
