"""The two distributions `make dist` builds: the service's wheel carries its migrations (an
installed, non-editable package can migrate a database) and depends on the SDK's; the SDK's wheel
holds only consumers_sdk and installs and runs without any of the server's packages."""

import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from devstack.postgres import PostgresServer
from dispatcher.store import migrate
from dispatcher.version import __version__

ROOT = Path(__file__).parents[2]
SDK = "delay-dispatcher-sdk"
SERVER_ONLY = ("fastapi", "uvicorn", "kazoo", "asyncpg", "prometheus-client")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder `make dist` built both distributions into: wheels and sdists."""
    folder = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "dist", f"DIST={folder}"],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return folder


def the_one(folder: Path, pattern: str) -> Path:
    """The one file in folder that matches pattern."""
    [path] = folder.glob(pattern)
    return path


def metadata_headers(wheel: Path) -> list[str]:
    """The header lines of a wheel's METADATA (the description after them is left out)."""
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode().split("\n\n", 1)[0].splitlines()


def requirements(headers: list[str]) -> dict[str, Requirement]:
    """The wheel's Requires-Dist, by distribution name."""
    prefix = "Requires-Dist: "
    parsed = [Requirement(h.removeprefix(prefix)) for h in headers if h.startswith(prefix)]
    return {r.name: r for r in parsed}


def test_make_dist_builds_both_wheels_and_sdists_of_this_release(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == [
        f"delay_dispatcher-{__version__}-py3-none-any.whl",
        f"delay_dispatcher-{__version__}.tar.gz",
        f"delay_dispatcher_sdk-{__version__}-py3-none-any.whl",
        f"delay_dispatcher_sdk-{__version__}.tar.gz",
    ]
    assert (ROOT / "sdk" / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()


def test_sdk_wheel_holds_only_consumers_sdk_and_requires_nothing_of_the_server(
    dist: Path,
) -> None:
    wheel = the_one(dist, "delay_dispatcher_sdk-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    code = {n for n in names if not n.startswith(f"delay_dispatcher_sdk-{__version__}.dist-info/")}
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "consumers_sdk").rglob("*") if p.is_file()}
    assert code == {n for n in sources if "__pycache__" not in n}
    assert "consumers_sdk/py.typed" in code
    headers = metadata_headers(wheel)
    assert f"Version: {__version__}" in headers
    assert "License-File: LICENSE" in headers
    requires = requirements(headers)
    assert {"aio-pika", "aiormq", "httpx", "orjson"} <= set(requires)
    assert str(requires["asyncpg"].marker) == 'extra == "asyncpg"'
    assert str(requires["psycopg"].marker) == 'extra == "psycopg"'
    assert str(requires["opentelemetry-api"].marker) == 'extra == "otel"'
    assert str(requires["prometheus-client"].marker) == 'extra == "metrics"'
    assert [n for n in SERVER_ONLY if n in requires and requires[n].marker is None] == []
    assert "delay-dispatcher" not in requires


def test_service_wheel_holds_only_dispatcher_and_pins_the_sdk_of_its_release(
    dist: Path,
) -> None:
    wheel = the_one(dist, "delay_dispatcher-*.whl")
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"dispatcher", f"delay_dispatcher-{__version__}.dist-info"}
    pin = requirements(metadata_headers(wheel))[SDK]
    assert (str(pin.specifier), pin.marker) == (f"=={__version__}", None)
    sdist = the_one(dist, "delay_dispatcher-*.tar.gz")
    listed = subprocess.run(["tar", "tzf", str(sdist)], check=True, capture_output=True, text=True)
    assert not [n for n in listed.stdout.split() if "consumers_sdk" in n or "/sdk/" in n]


@pytest.mark.parametrize("pattern", ["delay_dispatcher-*.whl", "delay_dispatcher_sdk-*.whl"])
def test_each_wheel_carries_what_a_user_checks_before_adopting(dist: Path, pattern: str) -> None:
    headers = metadata_headers(the_one(dist, pattern))
    assert "License-Expression: MIT" in headers
    assert "License-File: LICENSE" in headers
    urls = dict(h.removeprefix("Project-URL: ").split(", ", 1) for h in headers if "URL: " in h)
    assert set(urls) == {"Homepage", "Documentation", "Repository", "Issues", "Changelog"}
    assert all(url.startswith("https://") for url in urls.values())
    classifiers = {h.removeprefix("Classifier: ") for h in headers if h.startswith("Classifier: ")}
    assert {"Programming Language :: Python :: 3.11", "Typing :: Typed"} <= classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)


def test_sdk_wheel_installs_alone_and_runs_without_the_server_packages(
    dist: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    wheel = the_one(dist, "delay_dispatcher_sdk-*.whl")
    installed = subprocess.run(
        [python, "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True
    )
    assert installed.returncode == 0, installed.stderr
    script = """
import importlib.util
import consumers_sdk
from consumers_sdk import topology
work = topology.work_queue("billing", "orders.expire")
print(work, topology.dead_queue(work), topology.wait_queue(work, 15))
print(consumers_sdk.polynomial(base=15, cap=10)(3) == 10, consumers_sdk.DispatcherClient)
print([m for m in ("dispatcher", "fastapi", "uvicorn", "kazoo", "asyncpg", "prometheus_client",
                  "psycopg", "django") if importlib.util.find_spec(m)])
import consumers_sdk.enqueue, consumers_sdk.integrations.fastapi  # no driver, no framework needed
try:
    consumers_sdk.enqueue.enqueue_sync(object(), "orders.expire", {})
except TypeError as refused:
    print(refused)
from consumers_sdk import metrics, tracing
print(tracing.available(), tracing.inject({"tenant": "t1"}))
try:
    metrics.ConsumerMetrics()
except ImportError as missing:
    print(missing)
import importlib.metadata, sys
import consumers_sdk.testing  # without pytest installed
plugins = {e.name: e.value for e in importlib.metadata.entry_points(group="pytest11")}
print("pytest" in sys.modules, plugins.get("consumers_sdk"))  # others' too: anyio has one
"""
    elsewhere = tmp_path / "elsewhere"  # not the source tree: only the installed wheel
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    ran = subprocess.run(
        [python, "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "billing.orders.expire billing.orders.expire.dead billing.orders.expire.retry.15s",
        "True <class 'consumers_sdk.client.DispatcherClient'>",
        "[]",
        "conn must be a psycopg.Connection ('delay-dispatcher-sdk[psycopg]'), not builtins.object"
        " (an asynchronous connection takes enqueue())",
        "False {'tenant': 't1'}",
        "consumer metrics need prometheus-client: pip install 'delay-dispatcher-sdk[metrics]'",
        "False consumers_sdk.testing.plugin",
    ]


def test_wheel_ships_the_migrations_and_migrates_from_another_folder(
    dist: Path, tmp_path: Path, pg_server: PostgresServer
) -> None:
    wheel = the_one(dist, "delay_dispatcher-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not (ROOT / "dispatcher" / "sql").exists()  # mapped in by the build, no symlink
    shipped = sorted(n for n in names if n.startswith("dispatcher/sql/"))
    assert shipped == [f"dispatcher/sql/{p.name}" for p in sorted((ROOT / "sql").glob("*.sql"))]
    headers = metadata_headers(wheel)
    assert "License-Expression: MIT" in headers
    assert "License-File: LICENSE" in headers
    assert "Classifier: Typing :: Typed" in headers
    assert f"Version: {__version__}" in headers
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    console = {"dispatcher/console/index.html", "dispatcher/console/console.js"}
    assert console <= set(names)  # the web console runs from the wheel, no build step

    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    database = f"pkg_{uuid.uuid4().hex[:8]}"
    pg_server.create_database(database)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(installed),  # the extracted wheel, not the source tree
        "DISPATCHER_DATABASE_URL": pg_server.dsn(database),
    }

    def installed_python(*args: str) -> str:
        """Run the extracted wheel's code, away from the source tree; its stdout."""
        return subprocess.run(
            [sys.executable, *args], cwd=elsewhere, env=env, capture_output=True, text=True
        ).stdout

    assert "0001_jobs" in installed_python("-m", "dispatcher", "migrate")
    status = installed_python("-m", "dispatcher", "migrate", "--status")
    migrations = len(migrate.migration_files())  # schema.sql ships beside them, never applied
    assert [line.split()[1] for line in status.splitlines()] == ["applied"] * migrations
    assert installed_python("-m", "dispatcher", "--version") == f"dispatcher {__version__}\n"
    where = installed_python("-c", "import dispatcher; print(dispatcher.__file__)")
    assert where.startswith(str(installed))
