"""The pure core loads with its pure dependencies alone: each module the import-linter contract
"The pure core does no I/O" names is imported in a clean interpreter where the drivers, the web
framework and the HTTP client cannot be imported; and the SDK's package hands out every public
name from its own module, imported when first asked for."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import consumers_sdk

ROOT = Path(__file__).resolve().parents[2]
# What a pure module may not need: I/O drivers, the web stack, the HTTP client, the event loop.
NOT_PURE = (
    "aio_pika",
    "aiormq",
    "asyncpg",
    "fastapi",
    "fastapi_offline",
    "httptools",
    "httpx",
    "kazoo",
    "pamqp",
    "prometheus_client",
    "psycopg",
    "starlette",
    "uvicorn",
    "uvloop",
)
# Run as `python -c`: refuses the modules above, then imports the one named.
GUARDED_IMPORT = f"""
import importlib, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {NOT_PURE!r}:
            raise ImportError("a pure module imported " + name)
sys.meta_path.insert(0, Refuse())
importlib.import_module(sys.argv[1])
"""


def pure_modules() -> list[str]:
    document = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [
        contract
        for contract in document["tool"]["importlinter"]["contracts"]
        if contract["name"] == "The pure core does no I/O"
    ]
    return list(contract["source_modules"])


def guarded_import(module: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", GUARDED_IMPORT, module]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("module", pure_modules())
def test_a_pure_module_imports_without_drivers_web_stack_or_http_client(module: str) -> None:
    ran = guarded_import(module)
    assert ran.returncode == 0, ran.stderr


def test_the_guard_refuses_what_it_names() -> None:
    ran = guarded_import("consumers_sdk.client")
    assert ran.returncode != 0
    assert "a pure module imported httpx" in ran.stderr


def test_the_sdk_hands_out_each_public_name_from_its_own_module() -> None:
    homes = consumers_sdk._HOMES
    assert set(homes) == set(consumers_sdk.__all__)
    for name in consumers_sdk.__all__:
        found = getattr(consumers_sdk, name)
        module = sys.modules[homes[name]]
        expected = module if homes[name].endswith(f".{name}") else getattr(module, name)
        assert found is expected, name
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = consumers_sdk.Nothing  # type: ignore[attr-defined]
