"""The due notice is built in one place: the SQL function ``dispatcher_notify_due_v1`` (sql/0012),
and its channel named in one module (``dispatcher/store/due_notices.py``). Migrations before 0012
are history (forward-only; 0012 re-defines what of them builds the notice)."""

from __future__ import annotations

import re
from pathlib import Path

from dispatcher.store import migrate

ROOT = Path(__file__).resolve().parents[2]
DEFINING_MIGRATION = 12
CHANNEL_OWNER = ROOT / "dispatcher" / "store" / "due_notices.py"
# Sends on a channel other than the key notices' or the flow rules', or names the due channel.
HAND_BUILT = re.compile(
    r"pg_notify\s*\((?!\s*'dispatcher_(keys|flow_rules)')|dispatcher_due", re.IGNORECASE
)
NOTIFY_FUNCTION = re.compile(
    r"CREATE (OR REPLACE )?FUNCTION dispatcher_notify_due_v1\b.*?\$\$.*?\$\$;", re.DOTALL
)
SQL_COMMENT = re.compile(r"--[^\n]*")


def hand_built(text: str) -> list[str]:
    """The lines of ``text`` that build or send a due notice themselves."""
    return [line.strip() for line in text.splitlines() if HAND_BUILT.search(line)]


def migration_number(path: Path) -> int:
    return int(path.name.split("_", 1)[0])


def sql_files() -> list[Path]:
    """The migrations; not sql/schema.sql, which is what they build (the function included)."""
    found = {path.resolve() for path in (ROOT / "sql").glob("*.sql")}
    for package in ("dispatcher", "consumers_sdk"):  # any packaged copy of the migrations
        found |= {path.resolve() for path in (ROOT / package).rglob("*.sql")}
    return sorted(path for path in found if path.name != migrate.SCHEMA_FILE)


def python_files() -> list[Path]:
    packages = (ROOT / "dispatcher", ROOT / "consumers_sdk")
    return sorted(path for package in packages for path in package.rglob("*.py"))


def test_no_python_module_but_the_store_one_names_the_channel_or_sends_a_due_notice() -> None:
    offenders = {
        str(path.relative_to(ROOT)): lines
        for path in python_files()
        if path != CHANNEL_OWNER and (lines := hand_built(path.read_text()))
    }
    assert offenders == {}
    assert hand_built(CHANNEL_OWNER.read_text()) == ['CHANNEL: Final = "dispatcher_due"']


def test_no_migration_from_0012_on_builds_a_due_notice_outside_the_function() -> None:
    defined = 0
    offenders = {}
    for path in sql_files():
        if migration_number(path) < DEFINING_MIGRATION:
            continue
        text = SQL_COMMENT.sub("", path.read_text())
        if migration_number(path) == DEFINING_MIGRATION:
            text, defined = NOTIFY_FUNCTION.subn("", text)
        if lines := hand_built(text):
            offenders[path.name] = lines
    assert offenders == {}
    assert defined == 1  # the function is where this test looks for it


def test_the_scan_finds_notices_built_by_hand() -> None:
    before = (ROOT / "sql" / "0010_flood_bounds.sql").read_text()
    assert hand_built(SQL_COMMENT.sub("", before)) == ["(SELECT count(pg_notify('dispatcher_due',"]
    assert hand_built("RETURNING pg_notify($1, id::text)") != []
    assert hand_built("SELECT pg_notify('dispatcher_keys', 'created,' || id)") == []
