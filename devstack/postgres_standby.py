"""A PostgreSQL primary with a synchronous streaming standby on one machine, and its failover.

The standby is a ``pg_basebackup -R`` copy of the primary (``standby.signal`` and a
``primary_conninfo`` naming it by ``application_name``); the primary then names it in
``synchronous_standby_names`` with ``synchronous_commit=on``, so a commit returns only once the
standby has flushed its WAL: a 2xx given before the primary dies is on the standby. The base
backup is taken before that setting, so a promoted standby does not wait for a standby of its own
(a failover manager clears the setting on a primary left alone for the same reason).

``fail_over`` is what a failover manager does, done by hand: kill -9 the primary (every process
of it at once, as when its machine dies), then ``pg_ctl promote`` the standby.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from devstack.base import ServiceError, run_as_postgres, service_root, wait_until
from devstack.ports import reserve_port
from devstack.postgres import BIN, PostgresServer

STANDBY_NAME = "standby"
SYNC_DEADLINE_S = 60.0
HBA_REPLICATION = "host replication postgres 127.0.0.1/32 trust\n"


class PrimaryWithStandby:
    """``primary`` and ``standby`` keep their names after ``fail_over`` (the standby is then the
    writable one); ``dsn`` names both, so a client follows the switch."""

    def __init__(self, primary: PostgresServer, standby: PostgresServer) -> None:
        self.primary = primary
        self.standby = standby

    @classmethod
    def fresh(cls) -> PrimaryWithStandby:
        """Two servers in fresh folders on free ports."""
        return cls(
            PostgresServer(service_root("postgres-primary"), reserve_port()),
            PostgresServer(service_root("postgres-standby"), reserve_port()),
        )

    def start(self, *databases: str) -> None:
        """Start the primary, create ``databases``, clone the standby, make it synchronous."""
        self.primary.start()
        hba = self.primary.data / "pg_hba.conf"
        if HBA_REPLICATION not in hba.read_text():
            with hba.open("a") as out:
                out.write(HBA_REPLICATION)
            self.primary.sql("SELECT pg_reload_conf()")
        for name in databases:
            self.primary.create_database(name)
        self._base_backup()
        self.standby.start()
        self.primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
        self.primary.sql("ALTER SYSTEM SET synchronous_commit = 'on'")
        self.primary.sql("SELECT pg_reload_conf()")
        if not wait_until(lambda: self.sync_state() == "sync", SYNC_DEADLINE_S):
            raise ServiceError(
                "postgres", f"the standby is not synchronous: {self.sync_state()!r}", self.logs()
            )

    def _base_backup(self) -> None:
        self.standby.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            subprocess.run(["chown", "postgres:postgres", str(self.standby.root)], check=True)
        conninfo = (
            f"host=127.0.0.1 port={self.primary.port} user=postgres application_name={STANDBY_NAME}"
        )
        args = [
            str(BIN / "pg_basebackup"),
            "-D",
            str(self.standby.data),
            "-d",
            conninfo,
            "-X",
            "stream",
            "-R",  # standby.signal and primary_conninfo
            "-c",
            "fast",
        ]
        result = subprocess.run(run_as_postgres(args), capture_output=True, text=True)
        if result.returncode != 0:
            raise ServiceError("postgres", f"pg_basebackup failed: {result.stderr}", self.logs())
        # The name the primary's synchronous_standby_names knows it by, whatever -R wrote.
        with (self.standby.data / "postgresql.auto.conf").open("a") as out:
            out.write(f"primary_conninfo = '{conninfo}'\n")

    def sync_state(self) -> str:
        """The standby's state in the primary's pg_stat_replication ('' when not streaming)."""
        return self.primary.sql(
            f"SELECT sync_state FROM pg_stat_replication WHERE application_name = '{STANDBY_NAME}'"
        ).strip()

    def dsn(self, dbname: str = "postgres") -> str:
        """Both hosts; libpq and asyncpg connect to the one that accepts writes."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{dbname}?target_session_attrs=read-write"
        )

    def kill_primary(self) -> None:
        """kill -9 the postmaster and its backends at once: no shutdown, no goodbye to clients."""
        pid_file = self.primary.data / "postmaster.pid"
        if not self.primary.is_running():
            return
        pid = int(pid_file.read_text().split()[0])
        try:
            if os.getpgid(pid) == pid:  # pg_ctl starts the postmaster in a session of its own
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not wait_until(lambda: not _alive(pid), 30):
            raise ServiceError("postgres", f"the primary ({pid}) outlived kill -9", self.logs())

    def promote(self) -> None:
        """The standby becomes a primary (``pg_ctl promote`` waits until it accepts writes)."""
        args = [str(BIN / "pg_ctl"), "-D", str(self.standby.data), "-w", "-t", "60", "promote"]
        result = subprocess.run(run_as_postgres(args), capture_output=True, text=True)
        if result.returncode != 0:
            raise ServiceError("postgres", f"promote failed: {result.stderr}", self.logs())

    def fail_over(self) -> None:
        self.kill_primary()
        self.promote()

    def stop(self) -> None:
        try:
            self.standby.stop()
        finally:
            self.primary.stop()

    def logs(self) -> str:
        return f"--- primary ---\n{self.primary.logs()}\n--- standby ---\n{self.standby.logs()}"


def _alive(pid: int) -> bool:
    """Until reaped: ``pg_ctl status`` counts a zombie postmaster as running (init here reaps
    orphans a second or two late)."""
    return Path(f"/proc/{pid}").exists()
