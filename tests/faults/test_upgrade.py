"""An upgrade under load: a node of an earlier release fires jobs while a producer submits and an
SDK consumer handles them and reports their outcomes; it is stopped, and a node of this tree
starts on the same database and applies the migrations in between (0026 moves the job rows into
the rebuilt table) while the producer keeps submitting. Every job accepted before, during and after
the upgrade arrives, none early (duplicates are counted); the outcomes the earlier release
recorded are still each job's state and history."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import httpx
import pytest

from bench import compare
from consumers_sdk import Consumer, Job
from devstack.collector import Collector
from devstack.dispatcher_process import FAST_LEASE, DispatcherProcess
from devstack.ports import reserve_port
from tests.support.consumers import running
from tests.support.waiting import eventually

pytestmark = pytest.mark.faults

# The main before migration 0026 (the last that moves existing rows: the job rows into the
# rebuilt table): the release an upgrade moves them from. Moved on when a later migration moves
# rows again.
UPGRADE_FROM = "9682af5"
MOVING = "0026"
ROUTING_KEY = "upgrade.work"
BATCH = 40  # jobs a submit, every SUBMIT_EVERY_S, each due 1-3 s ahead
SUBMIT_EVERY_S = 0.1
BEFORE_S = 5.0  # the earlier release fires this long, then the upgrade
AFTER_S = 4.0  # submitting goes on this long after the new node is ready


def node(
    log_dir: Path, name: str, database_url: str, amqp_url: str, **env: str
) -> DispatcherProcess:
    return DispatcherProcess(
        log_dir,
        port=reserve_port(),
        name=name,
        env={
            "DISPATCHER_DATABASE_URL": database_url,
            "DISPATCHER_AMQP_URL": amqp_url,
            "DISPATCHER_SHARD_COUNT": "16",
            **FAST_LEASE,
            **env,
        },
    )


async def migrated_to(database_url: str) -> str:
    connection = await asyncpg.connect(database_url)
    try:
        return str(await connection.fetchval("SELECT max(version) FROM schema_migrations"))
    finally:
        await connection.close()


async def test_an_upgrade_under_load_loses_nothing_and_keeps_the_outcomes(
    tmp_path: Path, empty_database_url: str, amqp_url: str, collector: Collector
) -> None:
    accepted: dict[str, float] = {}
    handled: set[str] = set()
    consumer = Consumer(amqp_url, group="upgrade", name="worker-1")

    @consumer.handler(ROUTING_KEY)
    async def work(job: Job) -> None:
        handled.add(job.id)

    with compare.base_tree(UPGRADE_FROM) as earlier:
        old = node(
            tmp_path,
            "old",
            empty_database_url,
            amqp_url,
            PYTHONPATH=str(earlier),
            PYTHONSAFEPATH="1",  # not this tree's packages from the working directory
        )
        new = node(tmp_path, "new", empty_database_url, amqp_url)
        serving = [old]
        submitting = True
        refused = 0

        async def produce() -> None:
            nonlocal refused
            async with httpx.AsyncClient(timeout=10) as http:
                while submitting:
                    now = time.time()
                    jobs = [
                        {
                            "routing_key": ROUTING_KEY,
                            "payload": n,
                            "run_at": datetime.fromtimestamp(
                                now + 1 + 2 * n / BATCH, UTC
                            ).isoformat(),
                        }
                        for n in range(BATCH)
                    ]
                    try:
                        answer = await http.post(
                            f"{serving[-1].url}/v1/jobs/batch", json={"jobs": jobs}
                        )
                    except httpx.HTTPError:
                        answer = None
                    if answer is not None and answer.status_code == 201:
                        for job in answer.json()["jobs"]:
                            accepted[job["id"]] = datetime.fromisoformat(job["run_at"]).timestamp()
                    else:
                        refused += 1  # the node going or not yet up: not accepted
                    await asyncio.sleep(SUBMIT_EVERY_S)

        async with running(consumer):
            await asyncio.to_thread(old.start)
            try:
                assert await migrated_to(empty_database_url) < MOVING
                producing = asyncio.create_task(produce())
                await asyncio.sleep(BEFORE_S)
                before = set(accepted)
                await eventually(lambda: len(handled & before) >= len(before) // 2, 30)
                stopped_at = time.time()
                await asyncio.to_thread(old.stop)
                await asyncio.to_thread(new.start)
                upgraded_in_s = time.time() - stopped_at
                serving.append(new)
                assert await migrated_to(empty_database_url) >= MOVING
                await asyncio.sleep(AFTER_S)
                submitting = False
                await producing
                ledger = await collector.reckon(accepted, deadline_s=60, quiet_s=1.5)
                await eventually(lambda: set(accepted) <= handled, 30)
                finished_before = sorted(handled & before)[:20]
                async with httpx.AsyncClient(timeout=10) as http:
                    for job_id in finished_before:
                        got = (await http.get(f"{new.url}/v1/jobs/{job_id}")).json()
                        steps = [step["event"] for step in got["history"]]
                        assert got["state"] == "succeeded", got
                        assert {"started", "succeeded"} <= set(steps), steps
            finally:
                print(old.logs())
                print(new.logs())
                old.stop()
                new.stop()
    print(
        f"\nupgrade under load: {len(accepted)} jobs accepted ({len(before)} before the old node "
        f"stopped), {refused} submits refused while no node served; the new node migrated and was "
        f"ready {upgraded_in_s:.2f}s after the old one stopped; {ledger}"
    )
    assert ledger.lost == []
    assert ledger.early == []
