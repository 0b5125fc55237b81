"""RabbitMQ down, stopped at the application level, or blocking publishers while a dispatcher
fires: firing pauses, the API keeps accepting, and everything accepted arrives afterwards."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from devstack.collector import Collector
from devstack.dispatcher_process import DispatcherProcess
from devstack.rabbitmq import RabbitServer
from devstack.spread import schedule_spread
from tests.support.nodes import WRITE
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.rabbitmq_version,
    pytest.mark.faults,
    # While the broker restarts, the AMQP client leaves the socket of a connection attempt the
    # broker dropped mid-handshake to the garbage collector; that notice is not a failure here.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]

OUTAGE_S = 10.0


async def test_broker_process_down_for_10s_during_firing_loses_nothing(
    dispatcher: DispatcherProcess, collector: Collector, rabbit_server: RabbitServer
) -> None:
    accepted = await schedule_spread(dispatcher.url, 3000, over_s=12, batch=1000)
    await eventually(lambda: len(collector.deliveries) >= 500, 40)
    await asyncio.to_thread(rabbit_server.stop)  # the whole node: the Erlang VM exits
    stopped_at = time.monotonic()
    # The jobs exchange, the collector's queue and the persistent messages are all durable.
    during = await schedule_spread(dispatcher.url, 500, over_s=4, batch=500)
    await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped_at)))
    delivered_while_down = len(collector.deliveries)
    await asyncio.to_thread(rabbit_server.start)
    everything = {**accepted, **during}
    ledger = await collector.reckon(everything, deadline_s=90, quiet_s=1.5)
    print(
        f"\nRabbitMQ stopped {OUTAGE_S:.0f}s after {delivered_while_down} deliveries, "
        f"{len(during)} jobs accepted meanwhile; {ledger}"
    )
    assert ledger.lost == []
    assert ledger.early == []


async def test_broker_outage_pauses_firing_while_the_api_keeps_accepting(
    dispatcher: DispatcherProcess, collector: Collector, rabbit_server: RabbitServer
) -> None:
    await asyncio.to_thread(rabbit_server.stop_app)
    try:
        accepted = await schedule_spread(dispatcher.url, 300, over_s=1, start_in_s=0.2)
        await asyncio.sleep(3)
        async with httpx.AsyncClient(base_url=dispatcher.url, headers=WRITE) as http:
            ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["rabbitmq"] is False
    finally:
        await asyncio.to_thread(rabbit_server.start_app)
    # The collector reconnects too; everything accepted during the outage arrives afterwards.
    ledger = await collector.reckon(accepted, deadline_s=60, quiet_s=1.0)
    print(f"\nRabbitMQ app stopped 3s; {ledger}")
    assert ledger.lost == []
    assert ledger.early == []


async def test_blocked_broker_pauses_firing_and_resumes_without_loss(
    dispatcher: DispatcherProcess, collector: Collector, rabbit_server: RabbitServer
) -> None:
    # A memory alarm makes RabbitMQ block publishing connections (connection.blocked).
    await asyncio.to_thread(rabbit_server.ctl, "set_vm_memory_high_watermark", "0.000001")
    try:
        accepted = await schedule_spread(dispatcher.url, 300, over_s=1, start_in_s=0.2)
        await asyncio.sleep(3)
        delivered_while_blocked = len(collector.deliveries)
    finally:
        await asyncio.to_thread(rabbit_server.ctl, "set_vm_memory_high_watermark", "0.4")
    ledger = await collector.reckon(accepted, deadline_s=60, quiet_s=1.0)
    print(f"\nbroker blocked for 3s; delivered meanwhile={delivered_while_blocked}; {ledger}")
    assert delivered_while_blocked == 0
    assert ledger.lost == []
    assert ledger.early == []
