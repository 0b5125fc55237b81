"""The wheel carries its migrations: an installed (non-editable) package can migrate a database."""

import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

from devstack.postgres import PostgresServer
from dispatcher.version import __version__

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
    [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
    headers = zipfile.ZipFile(wheel).read(metadata).decode().split("\n\n", 1)[0].splitlines()
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
    assert [line.split()[1] for line in status.splitlines()] == ["applied"] * len(shipped)
    assert installed_python("-m", "dispatcher", "--version") == f"dispatcher {__version__}\n"
    where = installed_python("-c", "import dispatcher; print(dispatcher.__file__)")
    assert where.startswith(str(installed))
