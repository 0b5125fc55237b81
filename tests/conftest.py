"""Markers and cross-cutting fixtures only; the service fixtures live in tests/services."""

from collections.abc import AsyncIterator

import pytest

from tests.support.collector import Collector

pytest_plugins = ["tests.services.fixtures"]


@pytest.fixture
async def collector(amqp_url: str) -> AsyncIterator[Collector]:
    """An independent consumer of every job published in this test's vhost."""
    consumer = Collector(amqp_url, binding="#")
    await consumer.start()
    yield consumer
    await consumer.stop()
