"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver

from devstack import tenants
from devstack.dispatcher_process import DispatcherProcess
from tests.support import browser as chromium
from tests.support.process import served


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    """One dispatcher process with default settings (test modules may override it)."""
    yield from served(tmp_path, database_url, amqp_url)


@pytest.fixture
def make_run_node(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    """A dispatcher process as `make run` starts it: it counts an event only from a broker user
    granted its job (the tenants' users, and guest, whom the docs' consumers connect as:
    devstack/tenants.py), so the docs' first steps are shown to work with isolation on."""
    env = {"DISPATCHER_EVENT_USERS": tenants.event_users()}
    yield from served(tmp_path, database_url, amqp_url, env=env)


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    """A headless chromium (Debian's, with its chromedriver)."""
    driver = chromium.chromium()
    yield driver
    driver.quit()
