"""The web console in a real headless browser (Debian's chromium through Selenium): it opens with
an API key, finds a job by idempotency key and by id with its history, and requeues a dead job.
A screenshot is saved to test-artifacts/console.png."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from consumers_sdk import reporter
from devstack.rabbitmq import RabbitServer
from tests.support.dispatched import dispatch_round as round_of
from tests.support.process import DispatcherProcess, served

pytestmark = pytest.mark.e2e
ADMIN = "console-admin-0123456789abcdef"
ARTIFACTS = Path(__file__).parents[2] / "test-artifacts"


@pytest.fixture
def dispatcher(
    tmp_path: Path, database_url: str, amqp_url: str, rabbit_server: RabbitServer
) -> Iterator[DispatcherProcess]:
    yield from served(
        tmp_path,
        database_url,
        amqp_url,
        env={
            "DISPATCHER_API_KEYS": f"{ADMIN}:admin",
            "DISPATCHER_STATS_INTERVAL_S": "0.5",
            "DISPATCHER_AMQP_MANAGEMENT_URL": rabbit_server.mgmt_url.replace(
                "http://", "http://guest:guest@"
            ),
        },
        api_key=ADMIN,
    )


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument("--window-size=1400,1200")
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    yield driver
    driver.quit()


def until(check: Callable[[], object], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_console_finds_a_job_shows_its_history_and_requeues_a_dead_job(
    dispatcher: DispatcherProcess, amqp_url: str, database_url: str, browser: webdriver.Chrome
) -> None:
    http = httpx.Client(base_url=dispatcher.url, headers={"authorization": f"Bearer {ADMIN}"})
    job = {"routing_key": "orders.expire", "payload": {"order": 7}, "idempotency_key": "order-7"}
    job_id = http.post("/v1/jobs", json=job).json()["id"]
    later = {"routing_key": "orders.remind", "payload": {"order": 8}, "delay_ms": 600_000}
    http.post("/v1/jobs", json=later).raise_for_status()
    until(lambda: http.get(f"/v1/jobs/{job_id}").json()["state"] == "dispatched")
    asyncio.run(report_dead(amqp_url, database_url, job_id))  # as a consumer that gave up would
    until(lambda: http.get(f"/v1/jobs/{job_id}").json()["state"] == "dead")

    # The console re-renders its panels on every poll: an element found a moment ago may be gone.
    wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))
    browser.get(f"{dispatcher.url}/console/")
    browser.find_element(By.ID, "api-key").send_keys(ADMIN)
    browser.find_element(By.ID, "key-save").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, f'#dead tr[data-job="{job_id}"]'))
    wait.until(lambda b: "node" in b.find_element(By.ID, "cluster").text)
    wait.until(lambda b: "orders.remind" in b.find_element(By.ID, "timeline").text)
    wait.until(lambda b: "dispatcher.events" in b.find_element(By.ID, "queues").text)

    search = browser.find_element(By.ID, "search")
    search.send_keys("order-7")  # by idempotency key
    browser.find_element(By.ID, "search-go").click()
    wait.until(lambda b: job_id in b.find_element(By.ID, "job").text)
    search.clear()
    search.send_keys(job_id)  # by id
    browser.find_element(By.ID, "search-go").click()
    wait.until(lambda b: "RuntimeError: order 7 is locked" in b.find_element(By.ID, "job").text)
    steps = ("scheduled", "dispatched", "started", "dead")
    wait.until(lambda b: all(s in b.find_element(By.ID, "history").text for s in steps))

    # Found and clicked in one step of the wait: the dead panel may re-render in between.
    wait.until(lambda b: click(b, f'button.requeue[data-job="{job_id}"]'))
    wait.until(lambda b: f"requeued {job_id}" in b.find_element(By.ID, "dead-message").text)
    assert http.get(f"/v1/jobs/{job_id}").json()["state"] != "dead"  # back on its way
    wait.until(lambda b: "requeued" in b.find_element(By.ID, "history").text)
    wait.until(lambda b: not b.find_elements(By.CSS_SELECTOR, f'#dead tr[data-job="{job_id}"]'))
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "console.png"))
    http.close()


def click(browser: webdriver.Chrome, selector: str) -> bool:
    browser.find_element(By.CSS_SELECTOR, selector).click()
    return True


async def report_dead(amqp_url: str, database_url: str, job_id: str) -> None:
    # The round its delivery carried (x-dispatcher-round), which a consumer echoes.
    own = {
        "routing_key": "orders.expire",
        "dispatch_round": str(await round_of(database_url, job_id)),
    }
    events = reporter.EventReporter(amqp_url, group="billing", consumer="worker-1")
    events.open()
    events.report(job_id=job_id, attempt=1, outcome="started", **own)
    events.report(
        job_id=job_id, attempt=1, outcome="dead", error="RuntimeError: order 7 is locked", **own
    )
    await events.close(10)
