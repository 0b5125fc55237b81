"""A real dispatcher process against real services: a graceful stop. Crashes and outages are in
tests/faults."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from devstack.collector import Collector
from devstack.dispatcher_process import DispatcherProcess
from devstack.spread import schedule_spread
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e


async def test_sigterm_stops_gracefully_and_leaves_no_claim_behind(
    dispatcher: DispatcherProcess, collector: Collector, database_url: str
) -> None:
    accepted = await schedule_spread(dispatcher.url, 2000, over_s=4)
    await eventually(lambda: len(collector.deliveries) >= 300, 30)
    assert await asyncio.to_thread(dispatcher.terminate) == 0
    connection = await asyncpg.connect(database_url)
    try:
        leased = await connection.fetchval("SELECT count(*) FROM jobs WHERE state = 'dispatching'")
    finally:
        await connection.close()
    assert leased == 0
    dispatcher.start()
    assert await collector.wait_for(accepted, 60) == set()
