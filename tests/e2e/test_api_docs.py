"""/docs and /redoc render in a real browser that can reach nothing but this machine: their
scripts and styles come from the dispatcher, not from a CDN."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from devstack.dispatcher_process import DispatcherProcess
from tests.support import browser as chromium

pytestmark = pytest.mark.e2e
# What the page fetched, as it recorded it: scripts, styles and the OpenAPI document. (Redoc's
# "Redocly" footer links a logo image on its CDN; offline it only stays blank.)
FETCHED = """return performance.getEntriesByType("resource")
  .filter((entry) => entry.initiatorType !== "img").map((entry) => entry.name)"""


@pytest.fixture
def offline() -> Iterator[webdriver.Chrome]:
    driver = chromium.chromium(chromium.OFFLINE)
    yield driver
    driver.quit()


def test_the_swagger_ui_lists_the_operations_without_internet(
    dispatcher: DispatcherProcess, offline: webdriver.Chrome
) -> None:
    offline.get(f"{dispatcher.url}/docs")
    wait = WebDriverWait(offline, 60)  # a loaded machine renders slowly
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".opblock"))
    operations = offline.find_element(By.CSS_SELECTOR, ".swagger-ui").text
    assert "/v1/jobs" in operations, operations
    assert "/v1/schedules/{name}" in operations, operations
    fetched = offline.execute_script(FETCHED)
    assert f"{dispatcher.url}/docs-assets/swagger-ui-bundle.js" in fetched, fetched
    assert all(url.startswith(dispatcher.url) for url in fetched), fetched


def test_redoc_renders_the_reference_without_internet(
    dispatcher: DispatcherProcess, offline: webdriver.Chrome
) -> None:
    offline.get(f"{dispatcher.url}/redoc")
    wait = WebDriverWait(offline, 60)  # a loaded machine renders slowly
    # Redoc's menu lists the operations once it has loaded its script and the OpenAPI document.
    wait.until(lambda b: "/v1/jobs" in b.find_element(By.TAG_NAME, "body").text)
    page = offline.find_element(By.TAG_NAME, "body").text
    assert "Delay dispatcher" in page, page
    fetched = offline.execute_script(FETCHED)
    assert f"{dispatcher.url}/docs-assets/redoc.standalone.js" in fetched, fetched
    assert all(url.startswith(dispatcher.url) for url in fetched), fetched
