"""A throwaway PostgreSQL cluster from /usr/lib/postgresql/<v>/bin."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from devstack import reaper
from devstack.base import ServiceError, run_as_postgres, tail

BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))

# What `make run` and the benchmarks run the server with (the tests' servers keep the defaults):
# autovacuum visits each database every 5 s instead of 60, so that a new database's queue tables
# are analysed while they grow, and their dead index entries go as fast as jobs finish
# (docs/how-to/production.md, "PostgreSQL").
QUEUE_SETTINGS: Final = {"autovacuum_naptime": "5s"}
# What every server here runs with, the tests' too (tests/support/containers.py gives a container
# the same): room for many nodes' pools, and checkpoints kept out of the log a failure shows.
SERVER_SETTINGS: Final = {
    "max_connections": "300",
    "shared_buffers": "256MB",
    "log_checkpoints": "off",
}
# How a statement is run: no ~/.psqlrc, quiet, bare unaligned rows, stop at the first error.
PSQL_OPTIONS: Final = ("-X", "-q", "-At", "-v", "ON_ERROR_STOP=1")


def create_database_statement(name: str, template: str | None = None) -> str:
    suffix = f' TEMPLATE "{template}"' if template else ""
    return f'CREATE DATABASE "{name}"{suffix}'


def drop_database_statement(name: str) -> str:
    return f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'


class PostgresServer:
    def __init__(self, root: Path, port: int, *, settings: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.port = port
        self.settings = dict(settings or {})
        self.data = root / "data"
        self.log = root / "postgres.log"
        self.mark = reaper.current()  # the server belongs to the scope that made it (reaper.py)

    def _own_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")

    def start(self) -> None:
        self._own_root()
        if not (self.data / "PG_VERSION").exists():
            self._run([str(BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"])
        settings = {**SERVER_SETTINGS, **self.settings}
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1" + "".join(
            f" -c {name}={value}" for name, value in settings.items()
        )
        self._run(
            [
                str(BIN / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                "60",
                "-o",
                options,
                "start",
            ]
        )

    def stop(self) -> None:
        if self.is_running():
            self._run([str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def kill(self) -> None:
        """A crash: immediate shutdown, no checkpoint."""
        if self.is_running():
            self._run([str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def restart(self) -> None:
        self.stop()
        self.start()

    def is_running(self) -> bool:
        if not (self.data / "postmaster.pid").exists():
            return False
        status = subprocess.run(
            run_as_postgres([str(BIN / "pg_ctl"), "-D", str(self.data), "status"]),
            capture_output=True,
        )
        return status.returncode == 0

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def logs(self) -> str:
        return tail(self.log)

    def sql(self, statement: str, dbname: str = "postgres") -> str:
        result = subprocess.run(
            [
                "psql",
                *PSQL_OPTIONS,
                "-d",
                self.dsn(dbname),
                "-c",
                statement,
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise ServiceError("postgres", f"{statement!r} failed: {result.stderr}", self.logs())
        return result.stdout

    def create_database(self, name: str, template: str | None = None) -> None:
        self.sql(create_database_statement(name, template))

    def drop_database(self, name: str) -> None:
        self.sql(drop_database_statement(name))

    def _run(self, args: list[str]) -> None:
        result = subprocess.run(
            run_as_postgres(args), capture_output=True, text=True, env=reaper.marked(self.mark)
        )
        if result.returncode != 0:
            raise ServiceError(
                "postgres", f"{args[0]} failed: {result.stdout}{result.stderr}", self.logs()
            )
