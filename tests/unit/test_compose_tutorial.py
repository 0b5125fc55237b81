"""compose.tutorial.yaml, read without a Docker engine: it publishes on 127.0.0.1 only, exactly
where `make run`'s system answers (the addresses the tutorials use, which their test moves), with
`make run`'s credentials, on compose.yaml's images, and its node uses only Settings' names."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from devstack.stack import Ports
from tests.support import compose
from tests.support.samples import System

FILE = "compose.tutorial.yaml"


def services() -> dict[str, Any]:
    return compose.services(FILE)


def published() -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for name, spec in services().items():
        for port in spec.get("ports", []):
            host, host_port, container_port = str(port).split(":")
            assert host == "127.0.0.1", (name, port)
            assert host_port == container_port, (name, port)
            found.setdefault(name, set()).add(int(host_port))
    return found


def test_it_publishes_on_127_0_0_1_only_where_make_run_answers() -> None:
    ports = Ports()
    assert published() == {
        "postgres": {ports.postgres},
        "rabbitmq": {ports.amqp, ports.management},
        "dispatcher": {8080},
    }


def test_the_addresses_the_tutorials_use_are_the_ones_it_publishes() -> None:
    test_system = System("http://a", "http://b", "v", "amqp://c/", "postgresql://d/e")
    moved = test_system.rewrite(
        "amqp://guest:guest@127.0.0.1:5672/ http://127.0.0.1:8080 http://127.0.0.1:15672 "
        "postgresql://postgres@127.0.0.1:5432/dispatcher"
    )
    assert moved == "amqp://c/ http://a http://b postgresql://d/e"
    every_port = {port for ports in published().values() for port in ports}
    assert every_port == {5672, 8080, 15672, 5432}


def test_its_images_are_compose_yamls() -> None:
    shared = compose.services("compose.yaml")
    for name, spec in services().items():
        if "image" in spec:
            assert spec["image"] == shared[name]["image"], name
        else:
            assert spec["build"] == shared[name]["build"], name


def test_its_node_reaches_the_services_with_make_runs_credentials_and_no_key() -> None:
    environment = services()["dispatcher"]["environment"]
    settings = compose.dispatcher_settings(environment)
    database = urlsplit(settings.database_url)
    assert (database.username, database.password, database.hostname) == (
        "postgres",
        None,
        "postgres",
    )
    broker = urlsplit(settings.amqp_url)
    assert (broker.username, broker.password, broker.hostname) == ("guest", "guest", "rabbitmq")
    assert urlsplit(settings.amqp_management_url).hostname == "rabbitmq"
    assert "DISPATCHER_API_KEYS" not in environment  # open, as `make run`'s node is
    assert services()["postgres"]["environment"]["POSTGRES_HOST_AUTH_METHOD"] == "trust"


def test_rabbitmq_lets_guest_in_through_the_published_ports() -> None:
    [config] = services()["rabbitmq"]["configs"]
    content = compose.loaded(FILE)["configs"][config["source"]]["content"]
    assert content.strip() == "loopback_users = none"
    assert config["target"].startswith("/etc/rabbitmq/conf.d/")
