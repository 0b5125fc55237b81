"""The job rules the HTTP API and enqueue() share (consumers_sdk.validation), and the one id
generator and shard hash both sides use."""

from __future__ import annotations

from consumers_sdk import ids, validation
from dispatcher.intake import service as intake
from dispatcher.settings import Settings


def test_the_dispatcher_uses_the_sdks_id_generator_and_shard_hash() -> None:
    assert intake.ids is ids  # the intake draws ids and shards from the SDK's module itself
    job_id = ids.JobIds().next()
    assert ids.shard_for(job_id.bytes, range(16)) == ids.id_hash(job_id.bytes) % 16


def test_the_dispatchers_default_limits_are_the_sdks() -> None:
    assert Settings().limits() == validation.DEFAULT_LIMITS


def test_routing_keys() -> None:
    assert validation.routing_key_problem("orders.expire:eu-1") is None
    assert validation.routing_key_problem("orders.#") is not None
    assert validation.routing_key_problem("orders..expire") is not None
    assert validation.routing_key_problem("a" * 256) == "must be at most 255 bytes"
    assert validation.routing_key_problem("a" * 20, max_bytes=10) == "must be at most 10 bytes"


def test_a_prefix_is_its_words_without_the_final_dot() -> None:
    assert validation.prefix_words("billing.") == ("billing", None)
    assert validation.prefix_words("billing.charge") == ("billing.charge", None)
    assert validation.prefix_words("bill%")[1] is not None
    assert validation.prefix_words(".")[1] is not None  # no words at all


def test_headers_name_the_header_at_fault() -> None:
    limits = validation.Limits(max_headers=2, max_header_bytes=10)
    assert validation.headers_problem({"a": "b", "c": 1}, limits) is None
    assert validation.headers_problem({"a": 1, "b": 2, "c": 3}, limits) == (
        "headers",
        "at most 2 headers",
    )
    assert validation.headers_problem({"x-job-id": "e"}, limits) == (
        "headers.x-job-id",
        "header 'x-job-id' is reserved for the dispatcher and RabbitMQ",
    )
    assert validation.headers_problem({"": "e"}, limits) == (
        "headers",
        "header names must be non-empty strings",
    )
    for value, problem in [
        ("v\x00", "must not contain NUL characters"),
        (2**63, "integers must fit in 64 bits"),
        (float("inf"), "must be a finite number"),
        (None, "must be a string, an integer, a float or a boolean"),
        ("0123456789", "name and value must fit in 10 bytes"),
    ]:
        assert validation.headers_problem({"h": value}, limits) == ("headers.h", problem)
