"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.ports import free_port
from tests.support.process import DispatcherProcess


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    """One dispatcher process with default settings (test modules may override it)."""
    process = DispatcherProcess(
        tmp_path,
        port=free_port(),
        env={"DISPATCHER_DATABASE_URL": database_url, "DISPATCHER_AMQP_URL": amqp_url},
    )
    process.start()
    yield process
    process.stop()
