"""RequestCap: a request holds a place until its answer starts, not while it is being sent."""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive, Scope, Send

from dispatcher.api.request_cap import RequestCap

SCOPE: Scope = {"type": "http", "method": "GET", "path": "/v1/jobs", "headers": []}


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class Answers:
    """The app behind the cap: each request waits at ``before_start`` or ``after_start``."""

    def __init__(self) -> None:
        self.before_start = asyncio.Event()
        self.after_start = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.before_start.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await self.after_start.wait()
        await send({"type": "http.response.body", "body": b"{}"})


async def call(cap: RequestCap) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await cap(SCOPE, receive, send)
    return sent


async def test_a_request_whose_answer_started_leaves_its_place_to_the_next() -> None:
    app = Answers()
    refused: list[str] = []
    cap = RequestCap(app, max_requests=1, counted=lambda scope: True, refused=refused.append)
    app.before_start.set()
    first = asyncio.create_task(call(cap))
    second = asyncio.create_task(call(cap))
    await asyncio.sleep(0.01)  # both started their answers; neither could send its body
    assert not first.done()
    assert not second.done()
    app.after_start.set()
    assert [m["type"] for m in await first] == ["http.response.start", "http.response.body"]
    assert (await second)[0]["status"] == 200
    assert refused == []


async def test_a_request_that_has_not_started_its_answer_holds_its_place() -> None:
    app = Answers()
    refused: list[str] = []
    cap = RequestCap(app, max_requests=1, counted=lambda scope: True, refused=refused.append)
    first = asyncio.create_task(call(cap))
    await asyncio.sleep(0.01)
    busy = await call(cap)
    app.before_start.set()
    app.after_start.set()
    await first
    assert busy[0]["status"] == 503
    assert refused == ["too_many_requests"]
    assert (await call(cap))[0]["status"] == 200  # its place was given back at the end
