"""The session's PostgreSQL, RabbitMQ and ZooKeeper in containers (testcontainers), where a
Docker engine answers (tests/support/engine.py decides, tests/fixtures.py starts them). They offer
what the tests use of devstack's servers (tests/support/services.py), with the same settings.

Each container port is published on 127.0.0.1 at a host port from devstack.ports' bands, never
an ephemeral one: Docker picks a new ephemeral port at every start of a container, and a test
that stops and starts a service reconnects to the URL it had. A stop and a start keep the
container, its volumes and its ports, as a devstack restart keeps the server's folder.

Removal: the fixtures remove their containers at teardown; testcontainers' Ryuk removes every
container of this process's session once the process dies, however it dies (the process reaper,
devstack/reaper.py, sees host processes only)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import docker.errors
import psycopg
from testcontainers.core.container import DockerContainer
from testcontainers.core.exceptions import ContainerStartException

from devstack import postgres, rabbitmq, rabbitmq4, zookeeper
from devstack.base import LOG_TAIL_LINES, ServiceError, wait_until
from devstack.ports import wait_port_free
from tests.support.engine import engine_answers, use_containers

if TYPE_CHECKING:
    from tests.support import services

__all__ = ["engine_answers", "use_containers"]  # re-exported: engine.py imports no testcontainers

# compose.yaml's images (a unit test holds the majors equal), but RabbitMQ: the suite runs 3.x
# (Debian's, in the binaries' path) unless DISPATCHER_TEST_RABBITMQ=4 (tests/fixtures.py).
POSTGRES_IMAGE: Final = "postgres:15"
RABBITMQ_IMAGES: Final = {3: "rabbitmq:3.13-management", 4: "rabbitmq:4.0-management"}
ZOOKEEPER_IMAGE: Final = "zookeeper:3.8"

POSTGRES_PORT: Final = 5432
AMQP_PORT: Final = 5672
MGMT_PORT: Final = 15672
ZOOKEEPER_PORT: Final = 2181
# The image reads every file here after its own 10-defaults.conf.
RABBITMQ_CONF: Final = "/etc/rabbitmq/conf.d/90-dispatcher.conf"
ZOO_CFG: Final = "/conf/zoo.cfg"  # the image writes its own only where none is
# Docker gives /dev/shm 64 MB; PostgreSQL's parallel queries take their memory there.
POSTGRES_SHM: Final = "256m"
READY_S: Final = 90.0
STOP_S: Final = 60  # RabbitMQ stops its queues and writes its state before it exits
LIVE: Final = frozenset({"created", "restarting", "running"})
# Gone (Ryuk removed it, say), or made but never created (its start failed).
ABSENT: Final = (docker.errors.NotFound, ContainerStartException)


def postgres_command(settings: Mapping[str, str]) -> list[str]:
    """The server's command line: devstack's settings, then SETTINGS."""
    merged = {**postgres.SERVER_SETTINGS, **settings}
    return ["postgres", *(arg for item in merged.items() for arg in ("-c", "=".join(item)))]


def rabbitmq_config(major: int) -> str:
    """Devstack's rabbitmq.conf less its addresses (inside a container a broker listens on every
    interface; only its published ports face the host). ``loopback_users = none`` lets guest in
    from the host: through a published port, a client is not on the broker's loopback."""
    return rabbitmq.SHARED_CONFIG + (rabbitmq4.EXTRA_CONFIG if major >= 4 else "")


def zoo_cfg() -> str:
    """Devstack's zoo.cfg with the container's data folder and port, on every interface."""
    own = ("dataDir=", "clientPort=", "clientPortAddress=")
    lines = zookeeper.ZooKeeperServer(Path("/unused"), ZOOKEEPER_PORT).config()
    kept = [line for line in lines if not line.startswith(own)]
    return "\n".join([*kept, "dataDir=/data", f"clientPort={ZOOKEEPER_PORT}"]) + "\n"


def publish(container: DockerContainer, ports: Mapping[int, int]) -> DockerContainer:
    """Each container port of PORTS on 127.0.0.1 at its host port. testcontainers' own
    with_bind_ports binds every interface; its start hands ``ports`` to docker-py unchanged,
    which takes an (address, port) pair (DockerClient.create's annotation names that form)."""
    for inner, outer in ports.items():
        container.ports[f"{inner}/tcp"] = ("127.0.0.1", outer)  # type: ignore[assignment]
    return container


class ServiceContainer:
    """One service's container: created at the first start; stopped and started again in place;
    removed at the end. Subclasses say what to run and when it is ready."""

    service = "service"

    def __init__(self, published: Mapping[int, int]) -> None:
        self.published = dict(published)  # container port -> host port on 127.0.0.1
        self._container: DockerContainer | None = None

    def definition(self) -> DockerContainer:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        if self._container is None:
            # Kept before it starts: remove() can then remove one that was made but failed.
            self._container = publish(self.definition(), self.published)
            self._container.start()
        else:
            self._wrapped().start()
        if not wait_until(self._started, READY_S):
            raise ServiceError(self.service, f"not ready after {READY_S:.0f}s", self.logs())

    def _started(self) -> bool:
        if not self.is_running():
            raise ServiceError(self.service, "exited during start", self.logs())
        return self.ready()

    def stop(self) -> None:
        if self.is_running():
            self._wrapped().stop(timeout=STOP_S)
        self._wait_ports_free()

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        if self.is_running():
            self._wrapped().kill(signal=sig.name)
            self._wrapped().wait(timeout=STOP_S)
        self._wait_ports_free()

    def restart(self) -> None:
        self.stop()
        self.start()

    def is_running(self) -> bool:
        if self._container is None:
            return False
        try:
            self._wrapped().reload()
        except ABSENT:
            return False
        return self._wrapped().status in LIVE

    def logs(self) -> str:
        if self._container is None:
            return ""
        try:
            tail: bytes = self._wrapped().logs(tail=LOG_TAIL_LINES)
        except (docker.errors.APIError, ContainerStartException):
            return ""
        return tail.decode(errors="replace")

    def remove(self) -> None:
        """The container and its volumes, at once (testcontainers' stop removes it)."""
        if self._container is not None:
            self._container.stop()
            self._container = None

    def exec(self, args: list[str], check: Callable[[int, str], None]) -> str:
        """ARGS run in the container (``docker exec``); CHECK sees the exit code and stderr
        and raises to refuse them; stdout is the answer."""
        try:
            code, (out, err) = self._wrapped().exec_run(args, demux=True)
        except docker.errors.APIError as exc:  # not running, say
            code, out, err = -1, b"", str(exc).encode()
        check(int(code if code is not None else -1), (err or b"").decode(errors="replace"))
        return (out or b"").decode(errors="replace")

    def _wrapped(self) -> Any:  # docker-py's Container: docker-py ships no types
        if self._container is None:
            raise ServiceError(self.service, "not started", "")
        return self._container.get_wrapped_container()

    def _wait_ports_free(self) -> None:
        for port in self.published.values():
            wait_port_free(port)


class PostgresContainer(ServiceContainer):
    """PostgreSQL 15 with devstack's settings; ``postgres`` signs in without a password (as
    devstack's ``initdb -A trust``). No ``data``: its folder is the container's; a test that
    reads the postmaster's pid runs on the binaries (tests/support/stranded_worker.py)."""

    service = "postgres"

    def __init__(self, port: int, *, settings: Mapping[str, str] | None = None) -> None:
        super().__init__({POSTGRES_PORT: port})
        self.port = port
        self.settings = dict(settings or {})

    def definition(self) -> DockerContainer:
        return (
            DockerContainer(POSTGRES_IMAGE)
            .with_env("POSTGRES_HOST_AUTH_METHOD", "trust")
            .with_command(postgres_command(self.settings))
            .with_kwargs(shm_size=POSTGRES_SHM)
        )

    def ready(self) -> bool:
        # Over the published port: the image's first-run server listens on its socket only.
        try:
            with psycopg.connect(self.dsn(), connect_timeout=2, autocommit=True) as connection:
                connection.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def kill(self, sig: signal.Signals = signal.SIGQUIT) -> None:
        """A crash: SIGQUIT is PostgreSQL's immediate shutdown (devstack's ``-m immediate``)."""
        super().kill(sig)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def sql(self, statement: str, dbname: str = "postgres") -> str:
        """STATEMENT run by the container's psql, as devstack runs the host's: its rows."""
        args = ["psql", *postgres.PSQL_OPTIONS, "-U", "postgres", "-d", dbname, "-c", statement]
        return self.exec(args, self._refused(statement))

    def _refused(self, statement: str) -> Callable[[int, str], None]:
        def check(code: int, stderr: str) -> None:
            if code != 0:
                raise ServiceError("postgres", f"{statement!r} failed: {stderr}", self.logs())

        return check

    def create_database(self, name: str, template: str | None = None) -> None:
        self.sql(postgres.create_database_statement(name, template))

    def drop_database(self, name: str) -> None:
        self.sql(postgres.drop_database_statement(name))


class RabbitContainer(ServiceContainer):
    """RabbitMQ with its management plugin, guest allowed in from the host."""

    service = "rabbitmq"

    def __init__(self, amqp_port: int, mgmt_port: int, major: int) -> None:
        super().__init__({AMQP_PORT: amqp_port, MGMT_PORT: mgmt_port})
        self.amqp_port = amqp_port
        self.mgmt_port = mgmt_port
        self.major = major
        self.mgmt_url = f"http://127.0.0.1:{mgmt_port}"
        self.starts = 0  # how many times start() ran: a test can tell it was restarted

    def definition(self) -> DockerContainer:
        config = rabbitmq_config(self.major).encode()
        return DockerContainer(RABBITMQ_IMAGES[self.major]).with_copy_into_container(
            config, RABBITMQ_CONF
        )

    def start(self) -> None:
        self.starts += 1
        super().start()

    def ready(self) -> bool:
        return rabbitmq.amqp_answers(self.amqp_port) and rabbitmq.management_answers(self.mgmt_url)

    def ctl(self, *args: str, check: bool = True) -> str:
        """``rabbitmqctl`` in the container (its node is the default one there)."""

        def refused(code: int, stderr: str) -> None:
            if check and code != 0:
                raise ServiceError("rabbitmq", f"rabbitmqctl {args} failed: {stderr}", self.logs())

        return self.exec(["rabbitmqctl", *args], refused)

    def connection_names(self, vhost: str) -> list[str]:
        return rabbitmq.connection_names_in(self.ctl(*rabbitmq.LIST_CONNECTIONS), vhost)

    def stop_app(self) -> None:
        """A broker outage that keeps the Erlang process (and the container)."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        if not wait_until(self.ready, READY_S):
            raise ServiceError("rabbitmq", "not ready after start_app", self.logs())

    def url(self, vhost: str = "/") -> str:
        return rabbitmq.guest_url(self.amqp_port, vhost)

    def create_vhost(self, name: str) -> None:
        rabbitmq.create_vhost(self.mgmt_url, name)

    def delete_vhost(self, name: str) -> None:
        rabbitmq.delete_vhost(self.mgmt_url, name)


class ZooKeeperContainer(ServiceContainer):
    """A standalone ZooKeeper with devstack's zoo.cfg (short ticks, four-letter words)."""

    service = "zookeeper"

    def __init__(self, client_port: int) -> None:
        super().__init__({ZOOKEEPER_PORT: client_port})
        self.client_port = client_port
        self.hosts = f"127.0.0.1:{client_port}"

    def definition(self) -> DockerContainer:
        return DockerContainer(ZOOKEEPER_IMAGE).with_copy_into_container(
            zoo_cfg().encode(), ZOO_CFG
        )

    def ready(self) -> bool:
        return zookeeper.four_letter(self.client_port, "ruok") == "imok"


if TYPE_CHECKING:  # mypy holds these to what the tests use of devstack's servers

    def _containers(
        pg: PostgresContainer, rabbit: RabbitContainer, zk: ZooKeeperContainer
    ) -> tuple[services.PostgresService, services.RabbitService, services.ZooKeeperService]:
        return pg, rabbit, zk
