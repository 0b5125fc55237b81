"""Every compose file starts with the tenants isolated on the broker, as `make run` does, read
without a Docker engine: its ``broker-tenants`` service runs devstack/tenants.py (the documented
permissions: the docs' commands are that module's) against its broker as the administrator, with
compose.yaml's and compose.ha.yaml's passwords required secrets and compose.tutorial.yaml's those
of `make run`; every dispatcher starts only once it has finished, counting events from exactly
those users (``DISPATCHER_EVENT_USERS``)."""

from __future__ import annotations

import ast
import re
import shlex
import sys
from typing import Any
from urllib.parse import urlsplit

import pytest

from devstack import tenants
from dispatcher.amqp import event_users
from tests.support import compose

FILES = (*compose.FILES, "compose.tutorial.yaml")
SERVICE = "broker-tenants"
SCRIPT = "devstack/tenants.py"
DOCS = "docs/concepts/job-life.md"


def brokers(file: str) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose.services(file).items() if n.startswith("rabbitmq")}


def administrator(file: str) -> tuple[str, str]:
    """The broker's administrator: RABBITMQ_DEFAULT_USER and its password, or RabbitMQ's guest."""
    environments = [spec.get("environment") or {} for spec in brokers(file).values()]
    [admin] = {
        (e.get("RABBITMQ_DEFAULT_USER", "guest"), e.get("RABBITMQ_DEFAULT_PASS", "guest"))
        for e in environments
    }
    return admin[0], compose.interpolated(admin[1])


@pytest.mark.parametrize("file", FILES)
def test_broker_tenants_runs_make_runs_tenants_file_in_the_dispatchers_image(file: str) -> None:
    services = compose.services(file)
    setup = services[SERVICE]
    [dispatcher_build] = {s["build"] for n, s in services.items() if n.startswith("dispatcher")}
    assert setup["build"] == dispatcher_build
    [mount] = setup["volumes"]
    source, target, mode = mount.split(":")
    assert (source, mode) == (f"./{SCRIPT}", "ro")
    assert setup["entrypoint"] == ["python", target]
    assert "command" not in setup
    assert "ports" not in setup
    assert "restart" not in setup  # one shot: the dispatchers wait for it to complete


@pytest.mark.parametrize("file", FILES)
def test_broker_tenants_waits_for_every_broker_and_logs_in_as_its_administrator(
    file: str,
) -> None:
    setup = compose.services(file)[SERVICE]
    assert setup["depends_on"] == {name: {"condition": "service_healthy"} for name in brokers(file)}
    environment = {k: compose.interpolated(v) for k, v in setup["environment"].items()}
    found = tenants.target(environment)
    assert found.admin == administrator(file)
    management = urlsplit(found.management_url)
    assert (management.scheme, management.port) == ("http", 15672)
    assert management.hostname in brokers(file)


@pytest.mark.parametrize("file", compose.FILES)
def test_each_tenants_password_is_a_secret_of_its_own_compose_refuses_to_start_without(
    file: str,
) -> None:
    environment = compose.services(file)[SERVICE]["environment"]
    expected = {tenants.MANAGEMENT_URL_VARIABLE, *map(tenants.password_variable, tenants.TENANTS)}
    assert set(environment) == expected
    for tenant in tenants.TENANTS:
        name = tenants.password_variable(tenant)
        [variable] = compose.variables(environment[name])
        assert environment[name] == f"${{{name}:?{variable.word}}}"
        assert (variable.name, variable.kind, variable.colon) == (name, "?", True)
    found = tenants.target({k: compose.interpolated(v) for k, v in environment.items()})
    assert found.passwords == {
        t: compose.value_of(tenants.password_variable(t)) for t in tenants.TENANTS
    }


def test_the_tutorials_tenants_have_make_runs_passwords() -> None:
    environment = compose.services("compose.tutorial.yaml")[SERVICE]["environment"]
    found = tenants.target(environment)
    # make run's: each user's password its name (tenants.url, what its consumers connect with).
    for tenant in tenants.TENANTS:
        assert urlsplit(tenants.url(5672, tenant)).password == found.passwords[tenant]
    assert found.admin == ("guest", "guest")


@pytest.mark.parametrize("file", FILES)
def test_every_dispatcher_starts_after_broker_tenants_and_counts_events_from_its_users(
    file: str,
) -> None:
    operator, _ = administrator(file)
    expected = event_users.parse(tenants.event_users(operator))
    dispatchers = {n: s for n, s in compose.services(file).items() if n.startswith("dispatcher")}
    assert dispatchers
    for name, spec in dispatchers.items():
        condition = spec["depends_on"][SERVICE]
        assert condition == {"condition": "service_completed_successfully"}, (file, name)
        settings = compose.dispatcher_settings(spec["environment"])
        assert settings.event_grants() == expected, (file, name)


def test_the_tenants_file_imports_only_what_the_dispatchers_image_holds() -> None:
    tree = ast.parse((compose.ROOT / SCRIPT).read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).partition(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    beyond_stdlib = imported - sys.stdlib_module_names - {"__future__"}
    assert beyond_stdlib == {"httpx", "consumers_sdk"}  # the service's and the SDK's wheels


def documented_commands() -> list[list[str]]:
    """The rabbitmqctl commands of the docs' "Tenants on one broker", continuations joined."""
    text = (compose.ROOT / DOCS).read_text()
    section = text.split("### Tenants on one broker", 1)[1]
    block = re.search(r"```\n(rabbitmqctl .*?)```", section, re.DOTALL)
    assert block is not None
    return [shlex.split(line) for line in block.group(1).replace("\\\n", " ").splitlines()]


def test_the_documented_commands_grant_what_devstack_tenants_applies() -> None:
    commands = documented_commands()
    granted = tenants.permissions("billing")
    user = tenants.user("billing")
    assert commands[0] == ["rabbitmqctl", "add_user", user, "<password>"]
    permissions = granted.pop("permissions")
    assert commands[1] == [
        "rabbitmqctl", "set_permissions", "-p", "/", user,
        permissions["configure"], permissions["write"], permissions["read"],
    ]  # fmt: skip
    assert commands[2:] == [
        ["rabbitmqctl", "set_topic_permissions", "-p", "/", user, exchange, t["write"], t["read"]]
        for exchange, t in granted.items()
    ]
    text = (compose.ROOT / DOCS).read_text()
    [documented] = re.findall(r'DISPATCHER_EVENT_USERS="([^"]+)"', text)
    assert set(documented.split(",")) < set(tenants.event_users().split(","))
