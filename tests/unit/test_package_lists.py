"""One list of Debian packages (devstack/packages.py): `make run` and `make test` install from it,
nothing else installs any (CI once installed the browser on its own and the README's `make test`
failed without it), each entry is known by a file that package itself installs, and compose runs
the same services at the same versions."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devstack import packages, rabbitmq
from devstack.postgres import BIN as PG_BIN

ROOT = Path(__file__).parents[2]
# The RabbitMQ 4.x chroot installs its broker inside the chroot, from its own Debian release.
INSTALLS_ELSEWHERE = {ROOT / "devstack" / "rabbitmq4.py"}


def test_every_package_is_known_by_a_file_it_installs_itself() -> None:
    ensured_by_make_test = {
        packages.Group.SERVICES,
        packages.Group.BROWSER,
        packages.Group.CHROOT,
        packages.Group.FAULTS,
    }
    if absent := packages.missing(ensured_by_make_test):
        pytest.skip(f"not installed here: {absent} (python -m devstack ensure --browser --chroot)")
    for package in [p for p in packages.PACKAGES if p.installed()]:
        owner = subprocess.run(
            ["dpkg", "-S", str(package.marker)], capture_output=True, text=True, check=True
        )
        assert owner.stdout.split(":")[0] == package.name, owner.stdout


def test_make_test_ensures_every_group_and_make_run_the_services() -> None:
    makefile = (ROOT / "Makefile").read_text()
    test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "devstack ensure --browser --chroot --faults" in test_recipe
    assert packages.missing(set()) == []  # no group asked: nothing listed as wanted
    assert {p.group for p in packages.PACKAGES} == set(packages.Group)


def test_nothing_but_the_list_installs_a_package() -> None:
    installers = re.compile(r"apt(-get)?\W+(-\w+\W+)*install|pip install .*chromium")
    checked = [
        ROOT / "Makefile",
        ROOT / ".ci" / "run",
        ROOT / "Dockerfile",
        *ROOT.glob("devstack/*.py"),
        *ROOT.glob("bench/*.py"),
        *ROOT.glob("tests/**/*.py"),
    ]
    offenders = [
        str(path.relative_to(ROOT))
        for path in checked
        if path not in INSTALLS_ELSEWHERE
        and path != ROOT / "devstack" / "packages.py"
        and path != Path(__file__)
        and installers.search(path.read_text())
    ]
    assert offenders == []
    # The list's own installer is the one call of apt-get install.
    assert '"apt-get", "install"' in (ROOT / "devstack" / "packages.py").read_text()


def test_compose_runs_the_services_of_the_list_at_their_versions() -> None:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    names = {p.name for p in packages.PACKAGES}
    postgres_major = PG_BIN.parent.name  # /usr/lib/postgresql/<major>/bin
    assert f"postgresql-{postgres_major}" in names
    assert services["postgres"]["image"] == f"postgres:{postgres_major}"
    assert "rabbitmq-server" in names
    assert services["rabbitmq"]["image"].startswith("rabbitmq:")
    assert "zookeeper" in names
    zookeeper = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "zookeeper"], capture_output=True, text=True
    )
    if zookeeper.returncode == 0:
        major_minor = ".".join(zookeeper.stdout.split(".")[:2])
        assert services["zookeeper"]["image"] == f"zookeeper:{major_minor}"


def test_the_list_runs_before_any_virtual_environment_exists() -> None:
    """`make venv` calls it with Debian's bare python3: no site-packages, so the standard library
    only (-S leaves site-packages off the path)."""
    ran = subprocess.run(
        [sys.executable, "-S", "-m", "devstack.packages"], cwd=ROOT, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert packages.RABBITMQ_SERVER == rabbitmq.BIN / "rabbitmq-server"
    makefile = (ROOT / "Makefile").read_text()
    assert "-m devstack.packages python" in makefile
