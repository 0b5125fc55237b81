"""The documentation runs as written, as a reader would follow it: the tutorials in order, the SDK's
guides, FastAPI and Django, the other how-to pages; each page's commands and code taken from the
page (tests/support/samples.py), on a system like `make run`'s (a node, PostgreSQL and RabbitMQ
with its management API), by a reader in a directory of their own
(tests/support/sample_reader.py). Only the addresses move: the test's system answers where the
pages say `make run`'s does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from devstack.rabbitmq import RabbitServer
from tests.support.sample_reader import Reader
from tests.support.samples import HOW_TO, INTEGRATIONS, SDK_GUIDE, TUTORIALS, System, samples

pytestmark = [pytest.mark.e2e, pytest.mark.rabbitmq_version]


@pytest.fixture
def reader(
    tmp_path: Path,
    make_run_node: DispatcherProcess,
    rabbit_server: RabbitServer,
    amqp_url: str,
    database_url: str,
) -> Iterator[Reader]:
    """A reader on a system of its own: a node, its database, a vhost of RabbitMQ."""
    system = System(
        api_url=make_run_node.url,
        management_url=rabbit_server.mgmt_url,
        vhost=unquote(urlsplit(amqp_url).path[1:]),
        amqp_url=amqp_url,
        database_url=database_url,
        app_port=reserve_port(),
    )
    (tmp_path / "reader").mkdir()
    following = Reader(tmp_path / "reader", system)
    yield following
    following.leave()


async def follow(reader: Reader, pages: list[str]) -> int:
    """Every sample of PAGES, in order; how many were run."""
    followed = 0
    for page in pages:
        for sample in samples(page):
            await reader.follow(sample)
            followed += sample.kind != "not run"
        reader.end_session()
    return followed


async def test_the_tutorials_run_in_order_as_written(reader: Reader) -> None:
    assert await follow(reader, TUTORIALS) >= 3 * len(TUTORIALS)


async def test_the_sdk_guides_samples_run_as_written(reader: Reader) -> None:
    assert await follow(reader, SDK_GUIDE) >= 7


async def test_the_fastapi_and_django_samples_run_as_written(reader: Reader) -> None:
    assert await follow(reader, INTEGRATIONS) >= 15


async def test_the_how_to_samples_run_as_written(reader: Reader) -> None:
    assert await follow(reader, HOW_TO) >= 12
