"""The guarded protocol under a real uvicorn server on a socket, with a tiny app: an answer the
client does not read waits in the app's send (not in a buffer), is charged to the unsent budget,
and the connection is reset once the socket takes nothing for the write deadline."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.types import Receive, Scope, Send

from dispatcher.api import client_slots, connections
from dispatcher.api.unsent import Unsent

ANSWER_BYTES = 16 * 1024 * 1024
WRITE_TIMEOUT_S = 0.5


class BigAnswer:
    """Answers every request with SIZE bytes in one body message; notes when send returned."""

    def __init__(self, size: int = ANSWER_BYTES) -> None:
        self.size = size
        self.sent = asyncio.Event()
        self.sent_at = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-length", str(self.size).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"x" * self.size})
        self.sent_at = time.monotonic()
        self.sent.set()


def limited(
    unsent: Unsent, refused: list[str], write_timeout_s: float = WRITE_TIMEOUT_S
) -> connections.Limits:
    return connections.Limits(
        max_connections=8,
        clients=client_slots.ClientSlots(8),  # every connection here comes from loopback
        header_timeout_s=10,
        body_timeout_s=10,
        write_timeout_s=write_timeout_s,
        send_buffer_bytes=64 * 1024,
        unsent=unsent,
        refused=refused.append,
    )


@contextlib.asynccontextmanager
async def served(app: BigAnswer, limits: connections.Limits) -> AsyncIterator[int]:
    listener = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=connections.protocol_class(limits), lifespan="off", log_config=None
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
        await asyncio.sleep(0.01)
    try:
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def test_an_unread_answer_waits_in_send_and_is_reset_after_the_write_deadline() -> None:
    app = BigAnswer()
    refused: list[str] = []
    unsent = connections.unsent_budget(64 * 1024 * 1024, WRITE_TIMEOUT_S)
    limits = limited(unsent, refused)
    async with served(app, limits) as port:
        client = socket.create_connection(("127.0.0.1", port))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        asked = time.monotonic()
        await asyncio.sleep(WRITE_TIMEOUT_S / 2)
        assert not app.sent.is_set()  # the app's send is still waiting
        assert unsent.total_bytes > ANSWER_BYTES - 2 * 1024 * 1024  # most of it is unsent
        async with asyncio.timeout(10):
            await app.sent.wait()
        received = 0
        client.settimeout(5)
        with client, contextlib.suppress(ConnectionResetError):
            while chunk := client.recv(1024 * 1024):
                received += len(chunk)
    assert refused == ["write_timeout"]
    assert unsent.total_bytes == 0
    assert app.sent_at - asked >= WRITE_TIMEOUT_S
    assert received < ANSWER_BYTES  # reset: the rest was never sent


async def test_an_answer_read_at_once_goes_out_whole() -> None:
    app = BigAnswer()
    refused: list[str] = []
    unsent = connections.unsent_budget(64 * 1024 * 1024, WRITE_TIMEOUT_S)
    limits = limited(unsent, refused)
    async with served(app, limits) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        body = await reader.readexactly(ANSWER_BYTES)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert body == b"x" * ANSWER_BYTES
    assert refused == []


async def test_a_client_reading_slower_than_the_kernel_refills_is_not_cut() -> None:
    # The socket takes more from the node only once a third of the kernel's buffer is free: at
    # this pace, longer than the write deadline. The kernel's own queue shows the progress.
    write_timeout_s = 0.3
    app = BigAnswer(256 * 1024)
    refused: list[str] = []
    unsent = connections.unsent_budget(64 * 1024 * 1024, write_timeout_s)
    async with served(app, limited(unsent, refused, write_timeout_s)) as port:
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.setblocking(False)
        loop = asyncio.get_running_loop()
        received = b""
        with client:
            await loop.sock_connect(client, ("127.0.0.1", port))
            await loop.sock_sendall(client, b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            while len(received.partition(b"\r\n\r\n")[2]) < app.size:
                chunk = await loop.sock_recv(client, 4096)
                assert chunk, f"closed after {len(received)} bytes"
                received += chunk
                await asyncio.sleep(0.05)  # about 80 KB/s
    assert received.partition(b"\r\n\r\n")[2] == b"x" * app.size
    assert refused == []
