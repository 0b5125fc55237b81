"""The compose files run nothing open, read without a Docker engine: every port is published on
127.0.0.1 only (PostgreSQL and ZooKeeper not at all), every secret is a variable compose refuses
to start without (no default password, no trust authentication), ZooKeeper's znodes get digest
ACLs, and Prometheus scrapes with the monitor key the dispatcher is given."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest

from dispatcher.auth import api_keys
from tests.support import compose

# Where a secret goes: what compose must refuse to start without.
SECRET_NAME = re.compile(r"PASS|PASSWORD|TOKEN|COOKIE|SECRET|AUTH|KEY", re.IGNORECASE)
PASSWORD_SLOT = re.compile(r"(^|_)(PASS|PASSWORD)$")
NOT_PUBLISHED = ("postgres", "zookeeper")


def required(text: str) -> str:
    """The variable TEXT is exactly, required with a message (``${NAME:?message}``)."""
    [variable] = compose.variables(text)
    assert text == f"${{{variable.name}:?{variable.word}}}", text
    assert (variable.kind, variable.colon) == ("?", True), text
    assert variable.word.strip(), text  # says what to set
    return variable.name


def urls(value: str) -> list[tuple[str, dict[str, str]]]:
    """The URLs in VALUE, each variable in them replaced by a marker, and what each marker was."""
    variables: dict[str, str] = {}

    def mark(match: re.Match[str]) -> str:
        marker = f"variable{len(variables)}"
        variables[marker] = match.group(0)
        return marker

    marked = compose.VARIABLE.sub(mark, value)
    return [(url, variables) for url in re.findall(r"\w+://[^\s,]+", marked)]


def every_service() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (file, name, spec)
        for file in compose.FILES
        for name, spec in compose.services(file).items()
    ]


@pytest.mark.parametrize("file", compose.FILES)
def test_every_published_port_is_on_127_0_0_1(file: str) -> None:
    published = 0
    for name, spec in compose.services(file).items():
        for port in spec.get("ports", []):
            published += 1
            if isinstance(port, dict):  # the long syntax
                assert port.get("host_ip") == "127.0.0.1", (name, port)
            else:
                host, _, ports = str(port).partition(":")
                assert host == "127.0.0.1", (name, port)
                assert ports.count(":") == 1, (name, port)  # host port:container port
    assert published > 0


def test_postgresql_and_zookeeper_are_reached_on_compose_network_only() -> None:
    found = 0
    for file, name, spec in every_service():
        if spec.get("image", "").split(":")[0] in NOT_PUBLISHED:
            found += 1
            assert "ports" not in spec, (file, name)
    assert found == 1 + 1 + 2 + 3  # compose.yaml's two, compose.ha.yaml's five


@pytest.mark.parametrize("file", compose.FILES)
def test_no_secret_has_a_default_and_every_secret_is_required(file: str) -> None:
    checked = 0
    for text in compose.strings(compose.loaded(file)):
        for variable in compose.variables(text):
            if SECRET_NAME.search(variable.name):
                checked += 1
                assert (variable.kind, variable.colon) == ("?", True), (file, variable)
                assert variable.word.strip(), (file, variable)  # says what to set
    assert checked >= 5


def test_every_password_and_url_credential_is_a_required_variable() -> None:
    slots = 0
    for file, name, spec in every_service():
        environment: dict[str, str] = spec.get("environment") or {}
        for key, value in environment.items():
            if PASSWORD_SLOT.search(key):
                slots += 1
                required(value)
            for url, variables in urls(value):
                parts = urlsplit(url)
                if parts.username is not None or parts.scheme.startswith("postgres"):
                    slots += 1
                    password = variables.get(parts.password or "", "")
                    assert SECRET_NAME.search(required(password)), (file, name, key)
            if key == "DISPATCHER_ZK_AUTH":
                slots += 1
                user, _, password = value.partition(":")
                assert user, (file, name)
                assert SECRET_NAME.search(required(password)), (file, name)
    assert slots >= 20


def test_postgresql_asks_for_a_password_everywhere() -> None:
    initialised = 0
    for file, name, spec in every_service():
        environment = spec.get("environment") or {}
        if "POSTGRES_USER" in environment:
            initialised += 1
            assert environment["POSTGRES_HOST_AUTH_METHOD"] == "scram-sha-256", (file, name)
            required(environment["POSTGRES_PASSWORD"])
    assert initialised == 2
    for script in ("ops/ha/postgres-primary.sh", "ops/ha/postgres-standby.sh"):
        text = (compose.ROOT / script).read_text()
        assert "trust" not in text, script
    assert "host replication replicator all scram-sha-256" in (
        (compose.ROOT / "ops/ha/postgres-primary.sh").read_text()
    )


@pytest.mark.parametrize("file", compose.FILES)
def test_every_dispatcher_puts_digest_acls_on_its_znodes(file: str) -> None:
    dispatchers = {n: s for n, s in compose.services(file).items() if n.startswith("dispatcher")}
    assert dispatchers
    for name, spec in dispatchers.items():
        settings = compose.dispatcher_settings(spec["environment"])
        user, _, password = settings.zk_auth.get_secret_value().partition(":")
        assert (user, password) == ("dispatcher", compose.value_of("ZOOKEEPER_PASSWORD")), name


def test_grafana_has_no_default_admin_password() -> None:
    grafana = compose.services("compose.yaml")["grafana"]["environment"]
    assert required(grafana["GF_SECURITY_ADMIN_PASSWORD"]) == "GRAFANA_ADMIN_PASSWORD"
    assert "GF_SECURITY_ADMIN_USER" not in grafana or grafana["GF_SECURITY_ADMIN_USER"] != "admin"


def test_prometheus_scrapes_with_the_monitor_key_the_dispatcher_is_given() -> None:
    document = compose.loaded("compose.yaml")
    prometheus = document["services"]["prometheus"]
    mounted = {config["target"]: config["source"] for config in prometheus["configs"]}
    scrape_configs = compose.loaded("ops/prometheus.yml")["scrape_configs"]
    [dispatcher_job] = [job for job in scrape_configs if job["job_name"] == "dispatcher"]
    authorization = dispatcher_job["authorization"]
    assert authorization.get("type", "Bearer") == "Bearer"
    # The file Prometheus reads holds what compose writes there: a required variable.
    content = document["configs"][mounted[authorization["credentials_file"]]]["content"]
    token_variable = required(content)
    # The dispatcher takes that variable's value as a monitor key, and a different admin key.
    environment = document["services"]["dispatcher"]["environment"]
    keys = compose.dispatcher_settings(environment).static_keys()
    scopes = {key.digest: key.principal.scope for key in keys}
    assert scopes[api_keys.digest(compose.value_of(token_variable))] is api_keys.Scope.MONITOR
    assert sorted(scopes.values()) == [api_keys.Scope.ADMIN, api_keys.Scope.MONITOR]
    assert dispatcher_job["static_configs"] == [{"targets": ["dispatcher:8080"]}]


@pytest.mark.parametrize(
    ("file", "page"),
    [("compose.yaml", "docs/how-to/docker.md"), ("compose.ha.yaml", "docs/how-to/production.md")],
)
def test_the_docs_env_file_sets_every_secret_compose_requires(file: str, page: str) -> None:
    required_names = {
        variable.name
        for text in compose.strings(compose.loaded(file))
        for variable in compose.variables(text)
        if variable.kind == "?"
    }
    # The docs' first step: python3 -c '... for name in ("A", "B", ...): print(...)' > .env
    text = (compose.ROOT / page).read_text()
    [names] = re.findall(r"python3 -c 'import secrets\nfor name in \(([^)]*)\)", text)
    assert set(re.findall(r'"(\w+)"', names)) == required_names
