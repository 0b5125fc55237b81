"""``sql/schema.sql`` is the schema the migrations build, so that a reader need not replay them:
the migrations applied in order to an empty database and the file loaded into another dump the
same. ``DISPATCHER_WRITE_SCHEMA=1`` (``make schema``) writes the file from the migrations instead
of checking it, after a new migration."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.postgres import BIN, PostgresServer
from dispatcher.store import migrate

SCHEMA = Path(__file__).resolve().parents[2] / "sql" / migrate.SCHEMA_FILE
HEADER = """\
-- The schema the migrations in this folder build, applied in order to an empty database: for
-- reading, never run by the service. Written by `make schema` (pg_dump --schema-only);
-- tests/integration/test_schema_file.py fails when it differs from the migrations.
"""

# What pg_dump writes that is not the schema: its comments (the versions) and the per-dump
# random key of \\restrict. Its session settings stay: the file loads with them.
NOT_SCHEMA = re.compile(r"^(--.*|\\(un)?restrict .*)$")


def schema_of(dsn: str) -> str:
    dump = subprocess.run(
        [str(BIN / "pg_dump"), "--schema-only", "--no-owner", "--no-privileges", "-d", dsn],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = [line for line in dump.splitlines() if not NOT_SCHEMA.match(line)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


@pytest.fixture
def empty_database(pg_server: PostgresServer) -> Iterator[str]:
    name = f"schema_{uuid.uuid4().hex}"
    pg_server.create_database(name)
    yield pg_server.dsn(name)
    pg_server.drop_database(name)


def test_schema_sql_is_what_the_migrations_build(
    pg_server: PostgresServer, pg_template: str, empty_database: str
) -> None:
    migrated = schema_of(pg_server.dsn(pg_template))
    if os.environ.get("DISPATCHER_WRITE_SCHEMA") == "1":
        SCHEMA.write_text(HEADER + "\n" + migrated)
    subprocess.run(
        [str(BIN / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-d", empty_database, "-f", str(SCHEMA)],
        check=True,
        capture_output=True,
    )
    assert schema_of(empty_database) == migrated, (
        "sql/schema.sql differs from what the migrations build: `make schema` rewrites it"
    )


def test_the_schema_file_is_not_a_migration() -> None:
    assert migrate.SCHEMA_FILE not in {f"{m.version}.sql" for m in migrate.migration_files()}
    assert all(re.fullmatch(r"[0-9]{4}_[a-z0-9_]+", m.version) for m in migrate.migration_files())
