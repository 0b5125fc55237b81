"""The sync client is generated from the async one (``sdk/unasync.py``, ``make sdk-sync``): the
checked-in ``consumers_sdk/sync_client.py`` is exactly the generator's output, and the rules
translate what the async client is written with."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "sdk" / "unasync.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_sync_client_is_the_generators_output() -> None:
    unasync = generator()
    expected = unasync.unasync((ROOT / "consumers_sdk" / "client.py").read_text())
    found = (ROOT / "consumers_sdk" / "sync_client.py").read_text()
    assert found == expected, "consumers_sdk/sync_client.py is stale: run make sdk-sync"


def test_the_generator_checks_with_the_standard_library_alone() -> None:
    command = [sys.executable, "-I", "-S", str(ROOT / "sdk" / "unasync.py"), "--check"]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "", "")


def test_the_rules_translate_an_async_method_and_its_loop() -> None:
    source = '''"""The async client."""

import asyncio
import builtins
from collections.abc import AsyncIterator, Coroutine, Mapping


class DispatcherClient:
    async def __aenter__(self) -> Self:
        return self

    async def close(self) -> None:
        await self._http.aclose()

    async def list(self) -> AsyncIterator[Schedules]:
        """``async for job in client.list()``"""
        await asyncio.sleep(1)
        for job in page.jobs:
            yield job

    def job(self) -> Coroutine[Any, Any, records.JobRecord]: ...
'''
    unasync = generator()
    output = unasync.unasync(source)
    assert output.startswith(unasync.HEADER + unasync.DOCSTRING)
    assert (
        output.removeprefix(unasync.HEADER + unasync.DOCSTRING)
        == '''
import builtins
import time
from collections.abc import Iterator, Mapping


class SyncDispatcherClient:
    def __enter__(self) -> Self:
        return self

    def close(self) -> None:
        self._http.close()

    def list(self) -> Iterator[SyncSchedules]:
        """``for job in client.list()``"""
        time.sleep(1)
        yield from page.jobs

    def job(self) -> records.JobRecord: ...
'''
    )
