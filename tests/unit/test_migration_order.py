"""Which applied migrations a release accepts: a prefix of its own files, each unchanged."""

from datetime import UTC, datetime

from dispatcher.store import migrate

AT = datetime(2026, 1, 1, tzinfo=UTC)


def shipped(*versions: str) -> list[migrate.Migration]:
    return [
        migrate.Migration(version=v, sql=f"-- {v}", checksum=migrate.checksum(f"-- {v}"))
        for v in versions
    ]


def applied(*versions: str, checksum: str | None = "same") -> list[migrate.Applied]:
    return [
        migrate.Applied(
            version=v,
            checksum=migrate.checksum(f"-- {v}") if checksum == "same" else checksum,
            applied_at=AT,
        )
        for v in versions
    ]


FILES = shipped("0001_a", "0002_b", "0004_d")  # a gap in the numbers is no conflict


def test_a_prefix_of_the_shipped_files_is_accepted() -> None:
    assert migrate.conflicts(FILES, []) == []
    assert migrate.conflicts(FILES, applied("0001_a", "0002_b")) == []
    assert migrate.conflicts(FILES, applied("0001_a", "0002_b", "0004_d")) == []


def test_versions_recorded_without_a_checksum_are_accepted() -> None:
    assert migrate.conflicts(FILES, applied("0001_a", checksum=None)) == []


def test_a_migration_this_release_does_not_ship_is_named() -> None:
    [problem] = migrate.conflicts(FILES, applied("0001_a", "0002_b", "0004_d", "0005_e"))
    assert problem.startswith("0005_e.sql is applied but not shipped")


def test_a_skipped_migration_is_named_with_the_later_one_applied() -> None:
    [problem] = migrate.conflicts(FILES, applied("0001_a", "0004_d"))
    assert "0002_b.sql is not applied" in problem
    assert "0004_d.sql" in problem


def test_a_changed_file_is_named() -> None:
    rows = [*applied("0001_a"), *applied("0002_b", checksum="0" * 64)]
    [problem] = migrate.conflicts(FILES, rows)
    assert problem.startswith("0002_b.sql changed after it was applied")


def test_status_gives_each_migration_its_state() -> None:
    rows = [*applied("0001_a", checksum="f" * 64), *applied("0004_d", "0009_z")]
    lines = migrate.status(FILES, rows)
    assert [(line.version, line.state) for line in lines] == [
        ("0001_a", "changed"),
        ("0002_b", "skipped"),
        ("0004_d", "applied"),
        ("0009_z", "not shipped"),
    ]
    assert lines[1].applied_at is None
    assert lines[2].applied_at == AT
    assert [line.state for line in migrate.status(FILES, applied("0001_a"))] == [
        "applied",
        "pending",
        "pending",
    ]


def test_the_shipped_files_come_from_the_top_level_sql_folder_in_order() -> None:
    files = migrate.migration_files()
    versions = [m.version for m in files]
    assert versions == sorted(versions)
    assert versions[0] == "0001_jobs"
    assert all(m.checksum == migrate.checksum(m.sql) for m in files)
