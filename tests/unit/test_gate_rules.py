"""The gate's rule per route, found in the access table and kept only for fixed paths: a client
walking job ids, methods or unknown paths cannot grow what the node keeps."""

from __future__ import annotations

import uuid

from starlette.types import Scope

from dispatcher.api.gate import SMALL_BODY_BYTES, Rules, document_bytes
from dispatcher.auth import api_keys
from dispatcher.settings import Settings


def request(method: str, path: str) -> Scope:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}


def rules_of_the_jobs_routes() -> Rules:
    return Rules(Settings())


def test_a_fixed_path_keeps_its_rule_and_answers_as_a_fresh_match() -> None:
    rules = rules_of_the_jobs_routes()
    first = rules.rule(request("POST", "/v1/jobs"))
    again = rules.rule(request("POST", "/v1/jobs"))
    assert again == first
    assert first.needs_key
    assert first.scope is api_keys.Scope.PRODUCER
    assert first.max_body_bytes == document_bytes(Settings())
    assert rules.paths_kept() == 1
    assert rules_of_the_jobs_routes().rule(request("POST", "/v1/jobs")) == first


def test_paths_with_an_id_and_unknown_paths_are_matched_each_time_never_kept() -> None:
    rules = rules_of_the_jobs_routes()
    for _ in range(50):
        job = rules.rule(request("GET", f"/v1/jobs/{uuid.uuid4()}"))
        assert job.needs_key
        assert job.scope is api_keys.Scope.PRODUCER
        unknown = rules.rule(request("GET", f"/nowhere/{uuid.uuid4()}"))
        assert not unknown.needs_key
        assert unknown.max_body_bytes == SMALL_BODY_BYTES
    assert rules.paths_kept() == 0


def test_a_method_the_fixed_path_does_not_serve_is_not_kept() -> None:
    rules = rules_of_the_jobs_routes()
    rules.rule(request("PATCH", "/v1/jobs"))  # 405 from the router: matched, never kept
    for made_up in range(20):
        assert rules.rule(request(f"M{made_up}", "/v1/jobs")).needs_key
    assert rules.paths_kept() == 0
    assert rules.rule(request("POST", "/v1/jobs")).needs_key
