"""The wheel carries its migrations: an installed (non-editable) package can migrate a database."""

import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

from tests.services.postgres import PostgresServer

ROOT = Path(__file__).parents[2]


def test_wheel_ships_the_migrations_and_migrates_from_another_folder(
    tmp_path: Path, pg_server: PostgresServer
) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not (ROOT / "dispatcher" / "sql").exists()  # mapped in by the build, no symlink
    shipped = sorted(n for n in names if n.startswith("dispatcher/sql/"))
    assert shipped == [f"dispatcher/sql/{p.name}" for p in sorted((ROOT / "sql").glob("*.sql"))]
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
    result = subprocess.run(
        [sys.executable, "-m", "dispatcher", "migrate"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "0001_jobs" in result.stdout
    status = subprocess.run(
        [sys.executable, "-m", "dispatcher", "migrate", "--status"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert [line.split()[1] for line in status.stdout.splitlines()] == ["applied"] * len(shipped)
    where = subprocess.run(
        [sys.executable, "-c", "import dispatcher; print(dispatcher.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(installed))
