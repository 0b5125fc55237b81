"""compose.ha.yaml, read without a Docker engine: every dispatcher node is given every server of
every tier under the names of Settings, the tiers agree with each other (the RabbitMQ peers, the
ZooKeeper servers, the synchronous standby's name), and the images are compose.yaml's."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from dispatcher.cluster.zk import split_hosts
from dispatcher.settings import Settings
from dispatcher.store import servers
from tests.support import compose

ROOT = compose.ROOT


def services(name: str = "compose.ha.yaml") -> dict[str, Any]:
    return compose.services(name)


def named(prefix: str) -> dict[str, dict[str, Any]]:
    found = {name: spec for name, spec in services().items() if name.startswith(prefix)}
    assert found, prefix
    return found


def test_every_dispatcher_uses_only_the_settings_names_and_gets_every_server() -> None:
    rabbitmq, postgres, zookeeper = named("rabbitmq"), named("postgres"), named("zookeeper")
    assert (len(rabbitmq), len(postgres), len(zookeeper)) == (3, 2, 3)
    known = {f"DISPATCHER_{field.upper()}" for field in Settings.model_fields}
    for name, spec in named("dispatcher").items():
        environment = spec["environment"]
        assert set(environment) <= known, (name, set(environment) - known)
        settings = compose.dispatcher_settings(environment)
        brokers = {urlsplit(url).hostname for url in settings.amqp_urls()}
        assert brokers == set(rabbitmq), name
        databases = {urlsplit(url).hostname for url in servers.each_server(settings.database_url)}
        assert databases == set(postgres), name
        hosts, _ = split_hosts(settings.zk_hosts, settings.zk_path)
        assert {host.partition(":")[0] for host in hosts.split(",")} == set(zookeeper), name
        assert {"postgres-standby", "rabbitmq3", "zookeeper3"} <= set(spec["depends_on"])


def test_the_dispatchers_are_three_nodes_with_their_own_ids_and_ports() -> None:
    dispatchers = named("dispatcher").values()
    assert len(dispatchers) == 3
    ids = {compose.dispatcher_settings(spec["environment"]).node_id for spec in dispatchers}
    assert len(ids) == 3
    published = [port for spec in dispatchers for port in spec.get("ports", [])]
    assert published == ["127.0.0.1:8081:8080", "127.0.0.1:8082:8080", "127.0.0.1:8083:8080"]


def test_the_images_are_those_of_compose_yaml() -> None:
    single = services("compose.yaml")
    for prefix, image in (
        ("rabbitmq", single["rabbitmq"]["image"]),
        ("zookeeper", single["zookeeper"]["image"]),
        ("postgres", single["postgres"]["image"]),
    ):
        assert {spec["image"] for spec in named(prefix).values()} == {image}, prefix
    builds = {spec["build"] for spec in named("dispatcher").values()}
    assert builds == {single["dispatcher"]["build"]}


def test_the_admin_key_and_the_erlang_cookie_have_no_default() -> None:
    for spec in named("dispatcher").values():
        assert spec["environment"]["DISPATCHER_API_KEYS"].startswith("${DISPATCHER_ADMIN_TOKEN:?")
    for spec in named("rabbitmq").values():
        cookie = spec["environment"]["RABBITMQ_ERLANG_COOKIE"]
        assert cookie.startswith("${RABBITMQ_ERLANG_COOKIE:?")


def test_the_rabbitmq_config_lists_exactly_the_three_nodes() -> None:
    nodes = named("rabbitmq")
    for spec in nodes.values():
        [mount] = [v for v in spec["volumes"] if v.split(":")[1].startswith("/etc/rabbitmq/")]
        source, _, mode = mount.split(":")
        assert mode == "ro"
        config = (ROOT / source).read_text()
        settings = dict(
            (key.strip(), value.strip())
            for key, _, value in (line.partition("=") for line in config.splitlines())
            if key.strip() and not key.startswith("#")
        )
        assert settings["cluster_formation.peer_discovery_backend"] == "classic_config"
        assert settings["cluster_partition_handling"] == "pause_minority"
        peers = "cluster_formation.classic_config.nodes."
        listed = {value for key, value in settings.items() if key.startswith(peers)}
        assert listed == {f"rabbit@{node['hostname']}" for node in nodes.values()}
    assert {spec["hostname"] for spec in nodes.values()} == set(nodes)


def test_each_zookeeper_server_is_the_one_zoo_servers_gives_its_id() -> None:
    ensemble = named("zookeeper")
    for name, spec in ensemble.items():
        environment = spec["environment"]
        lines = dict(entry.split("=", 1) for entry in environment["ZOO_SERVERS"].split())
        assert len(lines) == 3, name
        host = lines[f"server.{environment['ZOO_MY_ID']}"].partition(":")[0]
        assert host == spec["hostname"] == name
    assert len({spec["environment"]["ZOO_MY_ID"] for spec in ensemble.values()}) == 3


def test_the_standby_is_the_one_the_primary_waits_for() -> None:
    primary, standby = services()["postgres-primary"], services()["postgres-standby"]
    waits_for = primary["environment"]["SYNCHRONOUS_STANDBY_NAMES"]
    assert standby["environment"]["STANDBY_APPLICATION_NAME"] == waits_for
    assert standby["environment"]["PRIMARY_HOST"] == primary["hostname"]
    [init_mount] = primary["volumes"]
    assert init_mount.startswith("./ops/ha/postgres-primary.sh:/docker-entrypoint-initdb.d/")
    [script_mount] = standby["volumes"]
    assert script_mount.split(":")[1] == standby["entrypoint"][-1]
    init = (ROOT / "ops/ha/postgres-primary.sh").read_text()
    assert "synchronous_standby_names = :'standby'" in init
    assert '--set standby="$SYNCHRONOUS_STANDBY_NAMES"' in init
    assert "host replication replicator" in init
    base_backup = (ROOT / "ops/ha/postgres-standby.sh").read_text()
    assert "application_name=$STANDBY_APPLICATION_NAME" in base_backup
    assert "--write-recovery-conf" in base_backup
