"""The OpenAPI document is complete enough for generated clients: valid OpenAPI, and every answer
it lists says what its body is (a client generated from an answer without a schema returns None
for it)."""

from __future__ import annotations

from typing import Any

from openapi_spec_validator import validate

from tests.support.docs_hooks import hook


def document() -> dict[str, Any]:
    spec: dict[str, Any] = hook("openapi_page").document()
    return spec


def answers(spec: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, status, answer)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
        if method in ("get", "post", "put", "patch", "delete")
        for status, answer in operation["responses"].items()
    ]


def test_the_document_is_valid_openapi() -> None:
    spec = document()
    validate(spec)  # raises, naming the first fault
    assert spec["openapi"].startswith("3.")


def test_every_answer_has_a_schema_for_each_of_its_media_types() -> None:
    spec = document()
    listed = answers(spec)
    assert len(listed) > 50
    missing = [
        f"{method} {path} {status} {media or '(no content)'}"
        for method, path, status, answer in listed
        for media, body in (answer.get("content") or {None: {}}).items()
        if not (body or {}).get("schema") and status.startswith(("2", "4", "5"))
    ]
    assert missing == []


def test_a_repeated_idempotency_key_answers_the_job_as_the_first_submit_did() -> None:
    operations = document()["paths"]
    for path, model in (("/v1/jobs", "JobSubmitted"), ("/v1/jobs/batch", "BatchOut")):
        responses = operations[path]["post"]["responses"]
        schemas = [
            responses[status]["content"]["application/json"]["schema"] for status in ("201", "200")
        ]
        assert schemas == [{"$ref": f"#/components/schemas/{model}"}] * 2, path


def test_readiness_answers_the_same_shape_ready_or_not() -> None:
    responses = document()["paths"]["/readyz"]["get"]["responses"]
    ready, not_ready = (
        responses[s]["content"]["application/json"]["schema"] for s in ("200", "503")
    )
    assert ready == {"$ref": "#/components/schemas/Readiness"}
    # A 503 is the node's own "not ready", or the HTTP edge's refusal of a busy node.
    assert {"$ref": "#/components/schemas/Problem"} in not_ready["anyOf"]
    assert ready in not_ready["anyOf"]
