"""What a workload cost PostgreSQL's storage, per job: WAL (bytes, records, full-page images),
row versions written to each table (inserted, updated, of them HOT, deleted), and the WAL's
record types (``pg_waldump --stats=record`` over the run's range).

The counters come from the database's own views (``pg_stat_wal``, ``pg_stat_user_tables``). A
backend hands its table counters to them when a transaction ends, at most once a second, and an
idle one within ten: ``Storage.read`` waits for that before it reads.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

# An idle backend reports what it counted within this long (PostgreSQL's PGSTAT_IDLE_INTERVAL).
STATS_SETTLE_S = 11.0
WAL_COLUMNS = ("wal_bytes", "wal_records", "wal_fpi")
TABLE_COLUMNS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del")


@dataclass(frozen=True)
class Reading:
    """The counters at one instant."""

    lsn: str
    wal: dict[str, int]
    tables: dict[str, dict[str, int]]


@dataclass
class Cost:
    """The difference between two readings, per job."""

    jobs: int
    wal: dict[str, float]
    tables: dict[str, dict[str, float]]
    records: list[tuple[str, float, float]] = field(default_factory=list)  # type, count, bytes

    def figures(self) -> dict[str, float]:
        """Flat figures for a results file and for ratios between two trees."""
        flat = {
            "wal_bytes_per_job": self.wal["wal_bytes"],
            "wal_records_per_job": self.wal["wal_records"],
            "wal_fpi_per_job": self.wal["wal_fpi"],
        }
        for table, counts in self.tables.items():
            for column, value in counts.items():
                flat[f"{table}_{column.removeprefix('n_tup_')}_per_job"] = value
        return flat

    def lines(self) -> list[str]:
        wal = self.wal
        out = [
            f"WAL per job: {wal['wal_bytes']:.0f} bytes, {wal['wal_records']:.1f} records,"
            f" {wal['wal_fpi']:.2f} full-page images"
        ]
        for table, counts in sorted(self.tables.items()):
            updated = counts["n_tup_upd"]
            hot = f" ({counts['n_tup_hot_upd'] / updated:.0%} HOT)" if updated else ""
            out.append(
                f"  {table}: per job {counts['n_tup_ins']:.2f} inserted, {updated:.2f} updated"
                f"{hot}, {counts['n_tup_del']:.2f} deleted"
            )
        if self.records:
            out.append("  WAL by record type (bytes per job, records per job):")
            out += [f"    {kind:32} {size:7.0f} {count:6.2f}" for kind, count, size in self.records]
        return out


async def read(dsn: str, *, settle: bool = True) -> Reading:
    if settle:
        await asyncio.sleep(STATS_SETTLE_S)
    connection = await asyncpg.connect(dsn)
    try:
        lsn = str(await connection.fetchval("SELECT pg_current_wal_lsn()::text"))
        wal_row = await connection.fetchrow(f"SELECT {', '.join(WAL_COLUMNS)} FROM pg_stat_wal")
        assert wal_row is not None
        rows = await connection.fetch(
            f"SELECT relname, {', '.join(TABLE_COLUMNS)} FROM pg_stat_user_tables"
        )
    finally:
        await connection.close()
    return Reading(
        lsn=lsn,
        wal={column: int(wal_row[column]) for column in WAL_COLUMNS},
        tables={row["relname"]: {c: int(row[c]) for c in TABLE_COLUMNS} for row in rows},
    )


def cost(before: Reading, after: Reading, jobs: int, wal_dir: Path | None = None) -> Cost:
    """AFTER less BEFORE per job; the record types too when WAL_DIR (the server's pg_wal) is
    given. Tables written fewer than once per hundred jobs are left out."""
    wal = {column: (after.wal[column] - before.wal[column]) / jobs for column in WAL_COLUMNS}
    tables: dict[str, dict[str, float]] = {}
    for table, counts in after.tables.items():
        earlier = before.tables.get(table, dict.fromkeys(TABLE_COLUMNS, 0))
        per_job = {c: (counts[c] - earlier[c]) / jobs for c in TABLE_COLUMNS}
        if sum(per_job[c] for c in ("n_tup_ins", "n_tup_upd", "n_tup_del")) >= 0.01:
            tables[table] = per_job
    made = Cost(jobs=jobs, wal=wal, tables=tables)
    if wal_dir is not None:
        made.records = record_types(wal_dir, before.lsn, after.lsn, jobs)
    return made


# A row of ``pg_waldump --stats=record``: the type, then count (percent), record size (percent),
# FPI size (percent), combined size (percent).
_STATS_ROW = re.compile(
    r"^(?P<kind>\S+(?: \S+)*?)\s+(?P<count>\d+)\s+\(\s*[\d.]+\)\s+(?P<rec>\d+)\s+\(\s*[\d.]+\)"
    r"\s+(?P<fpi>\d+)\s+\(\s*[\d.]+\)\s+(?P<combined>\d+)\s+\(\s*[\d.]+\)\s*$"
)


def parse_record_stats(text: str) -> list[tuple[str, int, int]]:
    """(type, count, combined bytes) of each row of ``pg_waldump --stats=record``'s table, the
    total left out."""
    rows = []
    for line in text.splitlines():
        found = _STATS_ROW.match(line.strip())
        if found and not found["kind"].startswith("Total"):
            rows.append((found["kind"], int(found["count"]), int(found["combined"])))
    return rows


def record_types(
    wal_dir: Path, start: str, end: str, jobs: int, top: int = 12
) -> list[tuple[str, float, float]]:
    """The TOP record types by bytes between two LSNs: (type, records per job, bytes per job)."""
    waldump = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_waldump"))
    if not waldump:
        return []
    result = subprocess.run(
        [str(waldump[-1]), "--stats=record", "-p", str(wal_dir), "-s", start, "-e", end],
        capture_output=True,
        text=True,
        check=False,
    )
    rows = parse_record_stats(result.stdout)
    rows.sort(key=lambda row: -row[2])
    return [(kind, count / jobs, size / jobs) for kind, count, size in rows[:top]]
