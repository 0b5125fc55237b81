"""Throwaway services for benchmarks (the same controllers the tests use), and small statistics."""

from __future__ import annotations

import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvloop

from devstack.base import service_root
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from devstack.postgres import QUEUE_SETTINGS, PostgresServer
from devstack.rabbitmq import RabbitServer
from devstack.zookeeper import ZooKeeperServer

RESULTS = Path(__file__).parent / "results"

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a benchmark on uvloop, the loop the dispatcher runs on: the raw ceilings measured here
    are then what the same libraries reach on the same loop."""
    return uvloop.run(main)


@dataclass
class Services:
    postgres: PostgresServer
    rabbit: RabbitServer
    zookeeper: ZooKeeperServer | None
    database_url: str
    amqp_url: str
    zk_hosts: str


@contextmanager
def services(
    *, zookeeper: bool = False, postgres_settings: Mapping[str, str] = QUEUE_SETTINGS
) -> Iterator[Services]:
    pg_root = service_root("bench-pg")
    other_root = Path(tempfile.mkdtemp(prefix="dispatcher-bench-"))
    postgres = PostgresServer(pg_root, reserve_port(), settings=postgres_settings)
    rabbit = RabbitServer(
        other_root / "rabbitmq",
        reserve_port(),
        reserve_port(),
        reserve_port(),
        f"bench-{uuid.uuid4().hex[:6]}@localhost",
    )
    zk = ZooKeeperServer(other_root / "zookeeper", reserve_port()) if zookeeper else None
    started: list[PostgresServer | RabbitServer | ZooKeeperServer] = []
    try:
        for server in (postgres, rabbit, zk):
            if server is not None:
                server.start()
                started.append(server)
        postgres.create_database("bench")  # dispatchers migrate it when they start
        yield Services(
            postgres=postgres,
            rabbit=rabbit,
            zookeeper=zk,
            database_url=postgres.dsn("bench"),
            amqp_url=rabbit.url(),
            zk_hosts=f"{zk.hosts}/bench" if zk else "",
        )
    finally:
        for server in reversed(started):
            server.stop()
        shutil.rmtree(pg_root, ignore_errors=True)
        shutil.rmtree(other_root, ignore_errors=True)


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 0.50),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else float("nan"),
    }


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def medians(each: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the runs (each run a dict of the same figures)."""
    return {key: median([run[key] for run in each]) for key in each[0]}


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write(name: str, data: dict[str, object]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2, default=str))
    return path


def started(module: str, *args: str) -> subprocess.Popen[bytes]:
    """``python -m MODULE ARGS...``, once it printed its first line ("ready")."""
    process = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.readline()
    return process


def stopped(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(60)


@contextmanager
def services_with_node() -> Iterator[tuple[Services, Path, DispatcherProcess]]:
    """The services, a scratch folder and one node on them, its log in the folder."""
    with (
        services() as svc,
        tempfile.TemporaryDirectory() as folder,
        one_node(svc, Path(folder)) as node,
    ):
        yield svc, Path(folder), node


@contextmanager
def one_node(svc: Services, folder: Path) -> Iterator[DispatcherProcess]:
    """A dispatcher node on the services, its log in FOLDER; stopped on the way out."""
    env = {"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url}
    node = DispatcherProcess(folder, port=reserve_port(), env=env)
    node.start()
    try:
        yield node
    finally:
        node.stop()
