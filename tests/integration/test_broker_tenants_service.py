"""Compose's ``broker-tenants``, run as its container runs it: devstack/tenants.py alone, a script
copied out of the repository, with a compose file's environment, against a real RabbitMQ. It makes
each tenant's user with that file's password and exactly the documented permissions and topic
permissions on vhost /, and running it again (every `docker compose up`) changes nothing."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aio_pika
import httpx
import pytest

from devstack import tenants
from tests.support import compose
from tests.support.services import RabbitService

FILES = (*compose.FILES, "compose.tutorial.yaml")
ROOT_VHOST = quote("/", safe="")


@pytest.fixture
def management(rabbit_server: RabbitService) -> Iterator[httpx.Client]:
    """The test broker's management API as guest; the tenants' users are removed after."""
    if not rabbit_server.is_running():
        rabbit_server.start()
    with httpx.Client(base_url=rabbit_server.mgmt_url, auth=("guest", "guest"), timeout=30) as http:
        yield http
        for tenant in tenants.TENANTS:
            http.delete(f"/api/users/{tenants.user(tenant)}")


def granted(http: httpx.Client, user: str) -> dict[str, dict[str, str]]:
    """USER's permissions on vhost / in the shape of ``tenants.permissions``."""
    permissions = http.get(f"/api/permissions/{ROOT_VHOST}/{user}")
    permissions.raise_for_status()
    found = {"permissions": {k: permissions.json()[k] for k in ("configure", "write", "read")}}
    topics = http.get(f"/api/users/{user}/topic-permissions")
    topics.raise_for_status()
    for topic in topics.json():
        assert topic["vhost"] == "/", topic
        found[topic["exchange"]] = {"write": topic["write"], "read": topic["read"]}
    return found


async def logs_in(amqp_port: int, user: str, password: str) -> bool:
    connection = await aio_pika.connect(f"amqp://{user}:{password}@127.0.0.1:{amqp_port}/")
    await connection.close()
    return True


@pytest.mark.parametrize("file", FILES)
def test_broker_tenants_makes_each_tenants_user_with_the_documented_permissions(
    file: str, tmp_path: Path, rabbit_server: RabbitService, management: httpx.Client
) -> None:
    environment: dict[str, Any] = compose.services(file)["broker-tenants"]["environment"]
    environ = {name: compose.interpolated(value) for name, value in environment.items()}
    # The test broker's administrator is guest; compose's is that file's.
    broker = urlsplit(rabbit_server.mgmt_url)
    environ[tenants.MANAGEMENT_URL_VARIABLE] = broker._replace(
        netloc=f"guest:guest@{broker.netloc}"
    ).geturl()
    script = tmp_path / "tenants.py"  # as mounted: the file alone, not the repository
    shutil.copy(compose.ROOT / "devstack" / "tenants.py", script)
    for _ in range(2):
        ran = subprocess.run(
            [sys.executable, "-I", str(script)],
            env=environ,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
    assert "billing-consumer (billing.*), payments-consumer (payments.*)" in ran.stdout
    found = tenants.target(environ)
    for tenant in tenants.TENANTS:
        user = tenants.user(tenant)
        assert granted(management, user) == tenants.permissions(tenant), (file, user)
        assert management.get(f"/api/users/{user}").json()["tags"] in ([], "")
        password = found.passwords[tenant]
        assert asyncio.run(logs_in(rabbit_server.amqp_port, user, password)), (file, user)


def test_broker_tenants_names_what_is_missing_and_makes_nothing(
    tmp_path: Path, management: httpx.Client
) -> None:
    script = tmp_path / "tenants.py"
    shutil.copy(compose.ROOT / "devstack" / "tenants.py", script)
    environ = {tenants.MANAGEMENT_URL_VARIABLE: "http://guest:guest@127.0.0.1:1"}
    ran = subprocess.run(
        [sys.executable, "-I", str(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 1
    assert ran.stderr.strip() == (
        "broker-tenants: set BILLING_CONSUMER_PASSWORD, PAYMENTS_CONSUMER_PASSWORD"
    )
    assert management.get(f"/api/users/{tenants.user('billing')}").status_code == 404
