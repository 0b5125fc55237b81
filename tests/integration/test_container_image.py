"""The Dockerfile compose builds, checked without a Docker engine: its build stage is replayed
from exactly the files it copies (none of them kept out by .dockerignore), the wheels it builds
resolve together as its runtime stage installs them, and the image runs the dispatcher as a user
that is not root, on the port compose publishes, with a health check on /healthz."""

import fnmatch
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dispatcher.version import __version__

ROOT = Path(__file__).parents[2]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for word, args in self.instructions if word == keyword]


def stages() -> list[Stage]:
    """The Dockerfile's stages, each with its instructions (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    parsed: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            base, _, name = args.partition(" AS ")
            parsed.append(Stage(base.strip(), name.strip() or None))
        else:
            parsed[-1].instructions.append((keyword.upper(), " ".join(args.split())))
    return parsed


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps this context path out of the build."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = Path(path).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        for pattern in patterns
        for prefix in prefixes
    )


def copies(stage: Stage) -> list[tuple[list[str], str]]:
    """The stage's COPY instructions from the build context: (sources, destination)."""
    found = []
    for args in stage.all("COPY"):
        *sources, destination = shlex.split(args)
        if not any(s.startswith("--from") for s in sources):
            found.append((sources, destination))
    return found


def test_the_build_stage_copies_only_files_that_exist_and_are_not_ignored() -> None:
    build, _runtime = stages()
    sources = [source for listed, _ in copies(build) for source in listed]
    assert {"sdk/", "consumers_sdk/", "dispatcher/", "sql/", "pyproject.toml"} <= set(sources)
    assert "constraints.txt" in sources  # the lock the build tool is installed with
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source.rstrip("/")), source
    # What the build needs from inside the copied folders is not ignored either.
    for needed in ("dispatcher/version.py", "sdk/hatch_build.py", "sql/0001_jobs.sql"):
        assert not ignored(needed), needed
    for junk in (".venv", ".run", ".git", "dispatcher/__pycache__", "test-artifacts"):
        assert ignored(junk), junk


def test_the_build_stage_builds_both_wheels_from_what_it_copies(tmp_path: Path) -> None:
    build, runtime = stages()
    context = tmp_path / "src"
    context.mkdir()
    for sources, destination in copies(build):
        # COPY's rules: a folder's contents go into the destination; files go beneath it.
        for source in sources:
            if (ROOT / source).is_dir():
                shutil.copytree(
                    ROOT / source,
                    context / destination,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                    dirs_exist_ok=True,
                )
            else:
                (context / destination).mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / source, context / destination / Path(source).name)
    [run] = [args for args in build.all("RUN") if "python -m build" in args]
    wheels = tmp_path / "wheels"
    for command in run.split("&&"):
        argv = [str(wheels) if word == "/wheels" else word for word in shlex.split(command)]
        assert argv[:3] == ["python", "-m", "build"], command
        built = subprocess.run(
            [sys.executable, *argv[1:]], cwd=context, capture_output=True, text=True
        )
        assert built.returncode == 0, built.stdout + built.stderr
    assert sorted(p.name for p in wheels.iterdir()) == [
        f"delay_dispatcher-{__version__}-py3-none-any.whl",
        f"delay_dispatcher_sdk-{__version__}-py3-none-any.whl",
    ]
    # The runtime stage installs the wheels alone, with the lock: the service's pin on the SDK
    # must resolve from them, with no index holding the SDK, and the lock's pins with them.
    [install] = [args for args in runtime.all("RUN") if "pip install" in args]
    assert "/tmp/wheels/*.whl" in install
    assert "-c /tmp/constraints.txt" in install
    assert copies(runtime) == [(["constraints.txt"], "/tmp/constraints.txt")]
    resolved = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "-q",
            "-c",
            str(ROOT / "constraints.txt"),
            *map(str, sorted(wheels.glob("*.whl"))),
        ],
        capture_output=True,
        text=True,
    )
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr


def test_the_image_serves_the_dispatcher_as_a_user_on_the_published_port() -> None:
    _build, runtime = stages()
    assert runtime.base == "python:3.11-slim"
    [user] = runtime.all("USER")
    assert user not in ("root", "0")
    assert runtime.all("ENTRYPOINT") == ['["dispatcher"]']
    assert runtime.all("CMD") == ['["serve"]']
    assert runtime.all("EXPOSE") == ["8080"]
    [healthcheck] = runtime.all("HEALTHCHECK")
    assert "http://127.0.0.1:8080/healthz" in healthcheck
    dispatcher = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["dispatcher"]
    assert dispatcher["build"] == "."
    assert dispatcher["ports"] == ["127.0.0.1:8080:8080"]
    assert dispatcher["environment"]["DISPATCHER_HTTP_PORT"] == "8080"


def test_compose_runs_a_supported_rabbitmq_and_never_an_open_api() -> None:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    image = services["rabbitmq"]["image"]
    name, _, tag = image.partition(":")
    assert name == "rabbitmq", image
    assert tag.split(".")[0].split("-")[0] == "4", image
    assert tag.endswith("-management"), image
    environment = services["dispatcher"]["environment"]
    # The admin key has no default: compose refuses to start without one.
    assert environment["DISPATCHER_API_KEYS"].startswith("${DISPATCHER_ADMIN_TOKEN:?")
    # ZooKeeper only with the cluster profile: a single node does not use it.
    assert services["zookeeper"]["profiles"] == ["cluster"]
    assert "zookeeper" not in services["dispatcher"].get("depends_on", {})
