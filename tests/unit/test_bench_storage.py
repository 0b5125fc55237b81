"""The storage benchmark's arithmetic: pg_waldump's table read, counters per job, ratios."""

# ruff: noqa: E501 - pg_waldump's table, as it prints it

from __future__ import annotations

from bench import compare, storage

# pg_waldump --stats=record (PostgreSQL 15), trimmed.
WALDUMP = """\
Type                                           N      (%)          Record size      (%)             FPI size      (%)        Combined size      (%)
----                                           -      ---          -----------      ---             --------      ---        -------------      ---
Transaction/COMMIT                            31 (  0.87)                 1085 (  0.30)                    0 (  0.00)                 1085 (  0.30)
Heap/INSERT                                  296 (  8.32)                51100 ( 14.00)                  800 ( 50.00)                51900 ( 14.04)
Btree/INSERT_LEAF                           1980 ( 55.62)               172000 ( 47.12)                  800 ( 50.00)               172800 ( 46.77)
                                        --------                      --------                      --------                      --------
Total                                       3560                        365000 [99.56%]                 1600 [0.44%]                366600 [100%]
"""


def test_the_record_types_are_read_with_their_counts_and_combined_bytes() -> None:
    assert storage.parse_record_stats(WALDUMP) == [
        ("Transaction/COMMIT", 31, 1085),
        ("Heap/INSERT", 296, 51900),
        ("Btree/INSERT_LEAF", 1980, 172800),
    ]


def reading(lsn: str, wal: int, ins: int, upd: int, hot: int) -> storage.Reading:
    return storage.Reading(
        lsn=lsn,
        wal={"wal_bytes": wal, "wal_records": wal // 100, "wal_fpi": 0},
        tables={
            "jobs": {"n_tup_ins": ins, "n_tup_upd": upd, "n_tup_hot_upd": hot, "n_tup_del": 0},
            "idle": {"n_tup_ins": 5, "n_tup_upd": 0, "n_tup_hot_upd": 0, "n_tup_del": 0},
        },
    )


def test_costs_are_per_job_and_tables_barely_written_are_left_out() -> None:
    made = storage.cost(
        reading("0/0", 1_000, 10, 0, 0), reading("0/1", 901_000, 1_010, 3_000, 1_500), 1_000
    )
    assert made.figures() == {
        "wal_bytes_per_job": 900.0,
        "wal_records_per_job": 9.0,
        "wal_fpi_per_job": 0.0,
        "jobs_ins_per_job": 1.0,
        "jobs_upd_per_job": 3.0,
        "jobs_hot_upd_per_job": 1.5,
        "jobs_del_per_job": 0.0,
    }
    assert "jobs: per job 1.00 inserted, 3.00 updated (50% HOT)" in "\n".join(made.lines())


def run_of(wal: float, p99: float) -> dict[str, object]:
    median = {"wal_bytes_per_job": wal, "handler_p99": p99, "cpu_ms_per_1000_postgres": 400.0}
    return {"rate_1000": {"median": median}}


def test_ratios_are_head_over_base_of_each_sides_median() -> None:
    base = [run_of(3600, 0.020), run_of(3700, 0.030)]
    head = [run_of(900, 0.010), run_of(800, 0.014), run_of(1000, 0.012)]
    table = compare.ratios(base, head, 1000)
    assert table["wal_bytes_per_job"] == {"base": 3650.0, "head": 900.0, "ratio": 900 / 3650}
    assert table["handler_p99"]["ratio"] == 0.012 / 0.025
    assert table["cpu_ms_per_1000_all"]["ratio"] == 1.0


def test_a_table_only_one_side_writes_counts_as_no_rows_on_the_other() -> None:
    base_median = {"wal_bytes_per_job": 3600.0, "job_events_ins_per_job": 2.0}
    head_median = {"wal_bytes_per_job": 900.0, "event_batches_ins_per_job": 0.004}
    base: dict[str, object] = {"rate_1000": {"median": base_median}}
    head: dict[str, object] = {"rate_1000": {"median": head_median}}
    table = compare.ratios([base], [head], 1000)
    assert table["job_events_ins_per_job"] == {"base": 2.0, "head": 0.0, "ratio": 0.0}
    assert table["event_batches_ins_per_job"]["base"] == 0.0
    assert (
        table["event_batches_ins_per_job"]["ratio"] != table["event_batches_ins_per_job"]["ratio"]
    )
    assert any(line.split()[0] == "job_events_ins_per_job" for line in compare.show(table))
