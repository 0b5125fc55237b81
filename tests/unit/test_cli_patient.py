"""The API commands' transport: a 429 is sent again after its Retry-After, a few times; every
other answer is the command's at once."""

from __future__ import annotations

import httpx

from dispatcher.cli.patient import TRIES, PatientTransport


def transport(statuses: list[int], slept: list[float]) -> tuple[PatientTransport, list[bytes]]:
    bodies: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        status = statuses.pop(0)
        return httpx.Response(status, headers={"retry-after": "2"} if status == 429 else {})

    return PatientTransport(httpx.MockTransport(answer), sleep=slept.append), bodies


def test_a_429_is_sent_again_after_its_retry_after_with_its_body() -> None:
    slept: list[float] = []
    patient, bodies = transport([429, 429, 202], slept)
    with httpx.Client(transport=patient, base_url="http://node") as http:
        answer = http.post("/v1/bulk-actions", json={"action": "cancel"})
    assert answer.status_code == 202
    assert slept == [2.0, 2.0]
    assert len(set(bodies)) == 1
    assert len(bodies) == 3


def test_past_its_tries_the_429_is_the_answer_and_other_refusals_come_at_once() -> None:
    slept: list[float] = []
    patient, _ = transport([429] * TRIES + [409], slept)
    with httpx.Client(transport=patient, base_url="http://node") as http:
        assert http.get("/v1/bulk-actions").status_code == 429
        assert http.get("/v1/bulk-actions").status_code == 409
    assert len(slept) == TRIES - 1
