"""Submit and fire rates of one dispatcher next to the raw ceilings of the same services, measured
in one run (the machine's speed drifts: only same-run ratios are comparable).

    .venv/bin/python -m bench.throughput [--runs 3] [--jobs 30000] [--fire-jobs 100000]

Ceilings: asyncpg COPY of job rows in 1000-row batches; persistent 200-byte publishes with a
sliding window of 1000 unconfirmed, both through aio-pika's Exchange.publish and through the
aiormq channel underneath it (the higher of the two is the per-message ceiling); the same 200-byte
publishes through the dispatcher's Publisher, batches of 500 framed as one write, 4 in flight, with
no database (the broker's confirm path for the way firing publishes); consume-and-ack with
prefetch 500.
Dispatcher: POST /v1/jobs/batch (1000 a request, 4 connections) and POST /v1/jobs (64
connections, with and without group commit), both driven by wrk, and
firing N jobs due at one instant (due -> confirmed in the queue, its depth polled; no consumer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import aio_pika
import aiormq
import asyncpg
import httpx

from bench import harness
from bench.harness import median, services, write
from consumers_sdk import contract
from consumers_sdk.ids import JobIds
from devstack import packages
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from dispatcher.amqp.publisher import Publisher, PublishPath
from dispatcher.metrics import Metrics
from dispatcher.models import Claimed
from dispatcher.store.migrate import apply_migrations


async def ceiling_copy(dsn: str, rows: int) -> float:
    connection = await asyncpg.connect(dsn)
    ids = JobIds()
    run_at = datetime.now(UTC) + timedelta(days=1)
    started = time.perf_counter()
    for _ in range(rows // 1000):
        records = [(ids.next(), 0, "bench.raw", b'{"n":1}', "{}", run_at) for _ in range(1000)]
        await connection.copy_records_to_table(
            "jobs",
            records=records,
            columns=["id", "shard", "routing_key", "payload", "headers", "run_at"],
        )
    elapsed = time.perf_counter() - started
    await connection.execute("DELETE FROM jobs WHERE routing_key = 'bench.raw'")
    await connection.close()
    return rows / elapsed


async def ceiling_publish(amqp_url: str, messages: int, *, underlay: bool = False) -> float:
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(f"bench.raw.{uuid.uuid4().hex[:6]}", durable=True)
    amqp = cast(aiormq.Channel, await channel.get_underlay_channel())
    body = b"x" * 200
    properties = aiormq.spec.Basic.Properties(delivery_mode=2)
    window = asyncio.Semaphore(1000)

    async def one() -> None:
        async with window:
            if underlay:
                await amqp.basic_publish(
                    body, routing_key=queue.name, properties=properties, wait=False
                )
                return
            message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await channel.default_exchange.publish(message, queue.name)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(messages)))
    elapsed = time.perf_counter() - started
    await ceiling_consume(channel, queue.name, messages)  # drains what was just published
    await queue.delete()
    await connection.close()
    return messages / elapsed


async def ceiling_publish_framed(
    amqp_url: str, messages: int, path: PublishPath = "framed"
) -> float:
    """The dispatcher's own publisher (batches framed as one write, as firing does: 4 batches of
    500 in flight) with no database: the broker's confirm path for the way firing publishes."""
    publisher = Publisher(
        amqp_url,
        exchange=contract.EXCHANGE,
        unroutable_exchange="dispatcher.unroutable",
        connection_name=f"bench-{path}",
        timeout_s=30.0,
        metrics=Metrics(),
        path=path,
        now=time.time,
    )
    await publisher.run()
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    queue = await channel.declare_queue(f"bench.raw.{uuid.uuid4().hex[:6]}", durable=True)
    await queue.bind(await channel.get_exchange(contract.EXCHANGE), queue.name)
    ids = JobIds()
    now = datetime.now(UTC)
    body = b"x" * 200
    jobs = [
        Claimed(ids.next(), 0, queue.name, body, now, None, {}, None, None, uuid.uuid4())
        for _ in range(messages)
    ]
    batches = [jobs[at : at + 500] for at in range(0, messages, 500)]

    async def worker() -> None:
        while batches:
            batch = batches.pop()
            outcome = await publisher.publish_many(batch)
            assert len(outcome.confirmed) == len(batch)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(4)))
    elapsed = time.perf_counter() - started
    await publisher.close()
    await queue.delete(if_unused=False, if_empty=False)
    await connection.close()
    return messages / elapsed


CONSUME_RATES: list[float] = []


async def ceiling_consume(channel: aio_pika.abc.AbstractChannel, name: str, messages: int) -> float:
    await channel.set_qos(prefetch_count=500)
    queue = await channel.get_queue(name)
    done = asyncio.Event()
    count = 0

    async def on(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal count
        await message.ack()
        count += 1
        if count == messages:
            done.set()

    started = time.perf_counter()
    tag = await queue.consume(on)
    await done.wait()
    elapsed = time.perf_counter() - started
    await queue.cancel(tag)
    CONSUME_RATES.append(messages / elapsed)
    return messages / elapsed


def wrk(url: str, body: str, *, connections: int, seconds: int) -> tuple[float, float, float]:
    """POST ``body`` with wrk (a native client: Python clients cap out below the server here);
    returns requests/s, p50 and p99 latency in seconds."""
    packages.ensure({packages.Group.BENCH})
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = [[{body}]]\n"
        )
    output = subprocess.run(
        # A thread per connection at most: wrk refuses more threads than connections.
        [
            *("wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{seconds}s"),
            *("--latency", "-s", script.name, url),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    Path(script.name).unlink()
    if "Non-2xx" in output:
        raise RuntimeError(f"some requests failed:\n{output}")
    latency = {m[0]: _seconds(m[1]) for m in re.findall(r"\s(50|99)%\s+([\d.]+\w+)", output)}
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    return rate, latency["50"], latency["99"]


def _seconds(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def far() -> str:
    """A run_at never due during the run: submission alone is measured."""
    return (datetime.now(UTC) + timedelta(days=1)).isoformat()


def submit_batch(url: str) -> tuple[float, float, float]:
    body = json.dumps(
        {
            "jobs": [
                {"routing_key": "bench.far", "payload": {"n": i}, "run_at": far()}
                for i in range(1000)
            ]
        }
    )
    rate, p50, p99 = wrk(f"{url}/v1/jobs/batch", body, connections=4, seconds=10)
    return rate * 1000, p50, p99


def submit_single(url: str) -> tuple[float, float, float]:
    body = json.dumps({"routing_key": "bench.far", "payload": {"order": 1}, "run_at": far()})
    return wrk(f"{url}/v1/jobs", body, connections=64, seconds=10)


async def fire(url: str, amqp_url: str, jobs: int) -> tuple[float, float]:
    """N jobs due at one instant: due -> confirmed in the queue. No consumer runs meanwhile (the
    publish ceiling has none either): the queue's depth is polled until every job is in it."""
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    exchange = await channel.get_exchange(contract.EXCHANGE)
    queue = await channel.declare_queue(f"bench.fire.{uuid.uuid4().hex[:6]}", durable=True)
    await queue.bind(exchange, "bench.fire")
    run_at_s = time.time() + 10 + jobs / 5000  # time to submit them all first
    run_at = datetime.fromtimestamp(run_at_s, UTC).isoformat()
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for first in range(0, jobs, 1000):
            body = {
                "jobs": [
                    {"routing_key": "bench.fire", "payload": i, "run_at": run_at}
                    for i in range(first, min(first + 1000, jobs))
                ]
            }
            assert (await http.post("/v1/jobs/batch", json=body)).status_code == 201
    assert time.time() < run_at_s, "submission took longer than the lead time"
    deadline = run_at_s + 300
    while await queue_depth(channel, queue.name) < jobs:
        if time.time() > deadline:
            break
        await asyncio.sleep(0.01)
    last = time.time()
    await asyncio.sleep(1)  # a job published twice would show here
    depth = await queue_depth(channel, queue.name)
    await queue.delete(if_unused=False, if_empty=False)
    await connection.close()
    assert depth == jobs, f"{depth} of {jobs} jobs in the queue"
    return jobs / (last - run_at_s), last - run_at_s


async def queue_depth(channel: aio_pika.abc.AbstractChannel, name: str) -> int:
    declared = await channel.declare_queue(name, passive=True)
    count = declared.declaration_result.message_count
    return count if count is not None else 0


async def main(runs: int, jobs: int, fire_jobs: int) -> None:
    figures: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        figures.setdefault(name, []).append(value)

    with services() as svc, tempfile.TemporaryDirectory() as logs:
        await apply_migrations(svc.database_url)
        env = {"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url}
        node = DispatcherProcess(Path(logs), port=reserve_port(), env=env)
        # The same dispatcher with one INSERT and commit per request, for the group-commit ratio.
        # Its own database: two single-node dispatchers on one database fence each other out.
        svc.postgres.create_database("bench_ungrouped")
        ungrouped = DispatcherProcess(
            Path(logs),
            port=reserve_port(),
            env={
                **env,
                "DISPATCHER_DATABASE_URL": svc.postgres.dsn("bench_ungrouped"),
                "DISPATCHER_GROUP_COMMIT": "false",
            },
            name="ungrouped",
        )
        node.start()
        ungrouped.start()
        try:
            for _ in range(runs):
                record("ceiling_copy_rows_s", await ceiling_copy(svc.database_url, jobs))
                aio_pika_rate = await ceiling_publish(svc.amqp_url, jobs)
                record("ceiling_consume_ack_s", CONSUME_RATES[-1])
                aiormq_rate = await ceiling_publish(svc.amqp_url, jobs, underlay=True)
                record("ceiling_publish_aio_pika_s", aio_pika_rate)
                record("ceiling_publish_aiormq_s", aiormq_rate)
                record("ceiling_publish_confirmed_s", max(aio_pika_rate, aiormq_rate))
                record("ceiling_publish_framed_s", await ceiling_publish_framed(svc.amqp_url, jobs))
                rate, p50, p99 = await asyncio.to_thread(submit_batch, node.url)
                record("submit_batch_jobs_s", rate)
                record("submit_batch_p50_s", p50)
                record("submit_batch_p99_s", p99)
                rate, p50, p99 = await asyncio.to_thread(submit_single, node.url)
                record("submit_single_jobs_s", rate)
                record("submit_single_p50_s", p50)
                record("submit_single_p99_s", p99)
                rate, p50, p99 = await asyncio.to_thread(submit_single, ungrouped.url)
                record("submit_single_ungrouped_jobs_s", rate)
                record("submit_single_ungrouped_p99_s", p99)
                rate, drain = await fire(node.url, svc.amqp_url, fire_jobs)
                record("fire_jobs_s", rate)
                record("fire_last_in_queue_s", drain)
        finally:
            node.stop()
            ungrouped.stop()
    result: dict[str, object] = {
        name: {"median": median(values), "runs": values} for name, values in figures.items()
    }
    result["jobs_per_run"] = jobs
    result["fire_jobs_per_run"] = fire_jobs
    m = {name: median(values) for name, values in figures.items()}
    print(
        f"throughput: median of {runs} runs, {jobs} jobs each ({fire_jobs} fired at once), "
        "one dispatcher, same services"
    )
    print(f"  {'figure':34} {'ours':>10} {'ceiling':>10} {'ratio':>7}")
    rows = [
        ("submit, batch of 1000 (jobs/s)", m["submit_batch_jobs_s"], m["ceiling_copy_rows_s"]),
        ("submit, single POST (jobs/s)", m["submit_single_jobs_s"], m["ceiling_copy_rows_s"]),
        (
            "single POST, group commit vs one each",
            m["submit_single_jobs_s"],
            m["submit_single_ungrouped_jobs_s"],
        ),
        ("fire vs per-message publish", m["fire_jobs_s"], m["ceiling_publish_confirmed_s"]),
        ("fire vs framed batches, no db", m["fire_jobs_s"], m["ceiling_publish_framed_s"]),
    ]
    for name, ours, ceiling in rows:
        print(f"  {name:34} {ours:10.0f} {ceiling:10.0f} {ours / ceiling:7.0%}")
    print(
        f"  batch request p50/p99 {m['submit_batch_p50_s'] * 1000:.0f}/"
        f"{m['submit_batch_p99_s'] * 1000:.0f} ms; single POST p50/p99 "
        f"{m['submit_single_p50_s'] * 1000:.1f}/{m['submit_single_p99_s'] * 1000:.1f} ms "
        f"(one commit each: p99 {m['submit_single_ungrouped_p99_s'] * 1000:.1f} ms)"
    )
    print(
        f"  last of {fire_jobs} jobs due at once in the queue after "
        f"{m['fire_last_in_queue_s']:.2f}s; publish ceilings: aio-pika "
        f"{m['ceiling_publish_aio_pika_s']:.0f}/s, aiormq {m['ceiling_publish_aiormq_s']:.0f}/s, "
        f"framed batches {m['ceiling_publish_framed_s']:.0f}/s; "
        f"consume+ack ceiling {m['ceiling_consume_ack_s']:.0f}/s"
    )
    print(f"  written to {write('throughput', result)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=30000)
    parser.add_argument("--fire-jobs", type=int, default=100_000)
    args = parser.parse_args()
    harness.run(main(args.runs, args.jobs, args.fire_jobs))
