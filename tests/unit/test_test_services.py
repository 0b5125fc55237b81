"""The choice between the session's services in containers and from the binaries
(tests/support/engine.py), and what the containers are made of (tests/support/containers.py),
without a Docker engine: an unreachable DOCKER_HOST, or a stand-in that answers only the
version and ping requests the docker SDK makes before anything else."""

from __future__ import annotations

import gc
import inspect
import json
import os
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from testcontainers.core.docker_client import DockerClient

from devstack import rabbitmq, rabbitmq4
from devstack.postgres import SERVER_SETTINGS, PostgresServer
from devstack.rabbitmq import RabbitServer
from devstack.zookeeper import ZooKeeperServer
from tests.support import containers, engine

ROOT = Path(__file__).parents[2]
UNREACHABLE = "tcp://127.0.0.1:9"  # discard: nothing listens, the ping is refused at once


class _Engine(BaseHTTPRequestHandler):
    """The two requests of docker.from_env() and ping(): the API version, then /_ping."""

    def do_GET(self) -> None:
        if self.path == "/version":
            self._answer("application/json", json.dumps({"ApiVersion": "1.44"}).encode())
        elif self.path.endswith("/_ping"):
            self._answer("text/plain", b"OK")
        else:
            self.send_error(404)

    def _answer(self, content_type: str, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the test's output is the assertions'


@pytest.fixture
def answering_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """DOCKER_HOST set to a stand-in engine that answers a ping."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, name="fake-engine")
    thread.start()
    host = f"tcp://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("DOCKER_HOST", host)
    yield host
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", UNREACHABLE)


def test_an_engine_answers_only_where_one_answers(
    answering_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert engine.engine_answers()
    monkeypatch.setenv("DOCKER_HOST", UNREACHABLE)
    assert not engine.engine_answers()


@pytest.mark.parametrize("where", ["unix", "tcp"])
def test_asking_an_engine_that_is_not_there_leaves_no_socket_behind(
    where: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A refused connection inside the docker SDK left its socket to the collector; its
    ResourceWarning, an error under this suite's warning filter, failed whichever test ran when
    it was collected. A leak would fail this test (pytest reports it here, at this collection)."""
    absent = f"unix://{tmp_path / 'docker.sock'}" if where == "unix" else UNREACHABLE
    monkeypatch.setenv("DOCKER_HOST", absent)
    assert not engine.engine_answers()
    gc.collect()


def test_no_docker_host_and_no_local_socket_asks_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(engine, "LOCAL_SOCKET", str(tmp_path / "docker.sock"))
    monkeypatch.setattr(engine, "_pinged", lambda: pytest.fail("asked an engine"))
    assert not engine.engine_answers()


def test_unset_means_containers_where_an_engine_answers(
    answering_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(engine.SERVICES, raising=False)
    assert engine.use_containers()


@pytest.mark.usefixtures("no_engine")
def test_unset_means_binaries_where_no_engine_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(engine.SERVICES, raising=False)
    assert not engine.use_containers()


def test_binaries_never_takes_containers_even_where_an_engine_answers(
    answering_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(engine.SERVICES, "binaries")
    assert not engine.use_containers()


@pytest.mark.usefixtures("no_engine")
def test_containers_without_an_engine_fails_the_run_naming_where_it_looked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(engine.SERVICES, "containers")
    with pytest.raises(engine.EngineMissing, match=re.escape(UNREACHABLE)):
        engine.use_containers()


def test_containers_where_an_engine_answers_takes_containers(
    answering_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(engine.SERVICES, "containers")
    assert engine.use_containers()


def test_an_unknown_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(engine.SERVICES, "podman")
    with pytest.raises(ValueError, match="podman"):
        engine.use_containers()


def test_the_fixtures_run_on_the_binaries_without_testcontainers_installed() -> None:
    """tests/fixtures.py imports testcontainers only when it takes the containers' path."""
    script = (
        "import sys; sys.modules['testcontainers'] = None; sys.modules['docker'] = None\n"
        "import tests.fixtures\n"
        "from tests.support import engine\n"
        "assert not engine.use_containers()\n"
    )
    env = {**os.environ, engine.SERVICES: "", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def image_version(image: str) -> list[str]:
    """The release an image's tag names, by its dotted parts (``4-management`` gives 4)."""
    return image.split(":")[1].split("-")[0].split(".")


def test_the_images_are_compose_yamls_at_its_majors() -> None:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    assert services["postgres"]["image"] == containers.POSTGRES_IMAGE
    assert services["zookeeper"]["image"] == containers.ZOOKEEPER_IMAGE
    composed = image_version(services["rabbitmq"]["image"])
    assert image_version(containers.RABBITMQ_IMAGES[4])[: len(composed)] == composed
    for major, image in containers.RABBITMQ_IMAGES.items():
        assert image_version(image)[0] == str(major)
        assert image.endswith("-management")  # the tests use its HTTP API


def config_lines(text: str) -> set[str]:
    return {line for line in text.splitlines() if line and not line.startswith("#")}


@pytest.mark.parametrize("major", [3, 4])
def test_the_rabbitmq_config_lets_guest_in_from_the_host(major: int) -> None:
    lines = config_lines(containers.rabbitmq_config(major))
    assert "loopback_users = none" in lines
    assert config_lines(rabbitmq.SHARED_CONFIG) <= lines  # what devstack's nodes run with
    # Listening inside the container on every interface: only the published ports face out.
    assert not any("127.0.0.1" in line for line in lines)
    assert (config_lines(rabbitmq4.EXTRA_CONFIG) <= lines) == (major >= 4)


def test_postgres_runs_with_devstacks_settings() -> None:
    command = containers.postgres_command({"autovacuum_naptime": "5s"})
    assert command[0] == "postgres"
    options = dict(value.split("=", 1) for value in command[2::2])
    assert set(command[1::2]) == {"-c"}
    assert options == {**SERVER_SETTINGS, "autovacuum_naptime": "5s"}


def test_zookeeper_runs_with_devstacks_zoo_cfg_on_the_containers_paths() -> None:
    devstacks = ZooKeeperServer(Path("/anywhere"), 12345).config()
    cfg = containers.zoo_cfg().splitlines()
    assert {"dataDir=/data", "clientPort=2181"} <= set(cfg)
    assert not any(line.startswith("clientPortAddress=") for line in cfg)  # every interface
    assert {line for line in devstacks if not line.startswith(("dataDir", "clientPort"))} <= set(
        cfg
    )


def test_the_urls_are_devstacks_built_from_the_host_ports() -> None:
    pg = containers.PostgresContainer(16001)
    assert (
        pg.dsn()
        == PostgresServer(Path("/x"), 16001).dsn()
        == ("postgresql://postgres@127.0.0.1:16001/postgres")
    )
    assert pg.dsn("test_1") == "postgresql://postgres@127.0.0.1:16001/test_1"
    assert pg.published == {5432: 16001}

    rabbit = containers.RabbitContainer(16002, 16003, major=4)
    devstacks = RabbitServer(Path("/x"), 16002, 16003, 16004, "n@localhost")
    assert (
        rabbit.url("test-a/b")
        == devstacks.url("test-a/b")
        == ("amqp://guest:guest@127.0.0.1:16002/test-a%2Fb")
    )
    assert rabbit.mgmt_url == devstacks.mgmt_url == "http://127.0.0.1:16003"
    assert (rabbit.amqp_port, rabbit.mgmt_port, rabbit.major) == (16002, 16003, 4)
    assert rabbit.published == {5672: 16002, 15672: 16003}

    zk = containers.ZooKeeperContainer(16005)
    assert zk.hosts == ZooKeeperServer(Path("/x"), 16005).hosts == "127.0.0.1:16005"
    assert zk.published == {2181: 16005}


@pytest.mark.usefixtures("answering_engine")
def test_the_containers_publish_their_ports_on_127_0_0_1_at_the_reserved_ones() -> None:
    """What testcontainers hands docker-py at create: built against the stand-in engine, which
    the docker SDK asks only for its API version before a container is created."""
    servers = [
        containers.PostgresContainer(16001),
        containers.RabbitContainer(16002, 16003, major=3),
        containers.ZooKeeperContainer(16005),
    ]
    for server in servers:
        made = containers.publish(server.definition(), server.published)
        ports: dict[str, object] = dict(made.ports)
        assert ports == {
            f"{inner}/tcp": ("127.0.0.1", outer) for inner, outer in server.published.items()
        }
    # docker-py takes an (address, port) pair where testcontainers passes ports on unchanged.
    ports = inspect.signature(DockerClient.create).parameters["ports"].annotation
    assert "tuple[str, int]" in str(ports)


@pytest.mark.usefixtures("answering_engine")
def test_each_container_is_given_its_configuration() -> None:
    pg = containers.PostgresContainer(16001).definition()
    assert pg.image == "postgres:15"
    assert pg.env["POSTGRES_HOST_AUTH_METHOD"] == "trust"  # devstack's initdb -A trust
    assert pg._command == containers.postgres_command({})

    rabbit = containers.RabbitContainer(16002, 16003, major=4).definition()
    assert rabbit.image == containers.RABBITMQ_IMAGES[4]
    [(config, path, *_)] = rabbit._transferable_specs
    assert (config, path) == (containers.rabbitmq_config(4).encode(), containers.RABBITMQ_CONF)

    zk = containers.ZooKeeperContainer(16005).definition()
    [(cfg, path, *_)] = zk._transferable_specs
    assert (cfg, path) == (containers.zoo_cfg().encode(), "/conf/zoo.cfg")


def test_the_dev_group_includes_containers() -> None:
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    assert {"include-group": "containers"} in groups["dev"]
    assert any(entry.startswith("testcontainers") for entry in groups["containers"])
