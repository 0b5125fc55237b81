"""A job through the SDK's retries into its dead-letter queue, as the RabbitMQ management UI shows
it: the Queues page with the work, wait and dead queues, and the dead queue's page with the dead
job got ("Get messages") showing its failure headers. Saves test-artifacts/rabbitmq-queues.png and
test-artifacts/rabbitmq-dead-letter-queue.png for the docs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from consumers_sdk import Consumer, Job
from devstack.dispatcher_process import DispatcherProcess
from devstack.rabbitmq import RabbitServer
from tests.support.browser import text_of
from tests.support.queues import wait_for_queue
from tests.support.waiting import job_when

pytestmark = pytest.mark.e2e
ARTIFACTS = Path(__file__).parents[2] / "test-artifacts"
WORK = "billing.orders.expire"
DEAD = f"{WORK}.dead"
GET_MESSAGES = "//h2[text()='Get messages']"


async def dead_messages(rabbit_server: RabbitServer, vhost: str) -> int:
    """The dead queue's message count as the management API (and so the UI) reports it."""
    address = f"{rabbit_server.mgmt_url}/api/queues/{quote(vhost, safe='')}/{DEAD}"
    async with httpx.AsyncClient(auth=("guest", "guest"), timeout=10) as http:
        answer = await http.get(address)
    return int(answer.json().get("messages") or 0) if answer.status_code == 200 else 0


async def test_a_dead_job_is_seen_in_the_rabbitmq_management_ui(
    dispatcher: DispatcherProcess,
    amqp_url: str,
    rabbit_server: RabbitServer,
    browser: webdriver.Chrome,
) -> None:
    vhost = unquote(urlsplit(amqp_url).path[1:])
    consumer = Consumer(amqp_url, group="billing", retry_tiers=(1.0,))
    attempts: list[int] = []

    @consumer.handler("orders.expire", max_attempts=3, backoff=lambda _: 1.0)
    async def expire(job: Job) -> None:
        attempts.append(job.attempt)
        raise RuntimeError("the payment service is down")

    task = asyncio.create_task(consumer.run(handle_signals=False))
    try:
        await asyncio.wait_for(consumer.ready.wait(), 30)
        await wait_for_queue(amqp_url, WORK)
        async with httpx.AsyncClient(base_url=dispatcher.url) as http:
            job = {"routing_key": "orders.expire", "payload": {"order": 42}}
            created = await http.post("/v1/jobs", json=job)
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            await job_when(http, job_id, "dead", 60)  # the SDK reported it dead
        async with asyncio.timeout(60):  # the management API refreshes its counts every 5 s
            while await dead_messages(rabbit_server, vhost) != 1:  # noqa: ASYNC110 - another process
                await asyncio.sleep(0.5)
    finally:
        consumer.stop()
        await task
    assert attempts == [1, 2, 3]
    await asyncio.to_thread(look_in_the_ui, browser, rabbit_server, vhost, job_id)


def look_in_the_ui(
    browser: webdriver.Chrome, rabbit_server: RabbitServer, vhost: str, job_id: str
) -> None:
    ui = rabbit_server.mgmt_url
    # The UI re-renders its page on every refresh: an element found a moment ago may be gone.
    wait = WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,))
    browser.set_window_size(1400, 700)
    browser.get(f"{ui}/")
    wait.until(lambda b: b.find_elements(By.NAME, "username"))
    browser.find_element(By.NAME, "username").send_keys("guest")
    browser.find_element(By.NAME, "password").send_keys("guest")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(lambda b: b.find_elements(By.ID, "logout"))

    browser.get(f"{ui}/#/queues")
    queues = f"{WORK}.retry."
    wait.until(lambda b: queues in b.find_element(By.ID, "main").text)
    listed = text_of(browser, "#main")
    assert vhost in listed, listed
    for name in (WORK, DEAD, "dispatcher.events"):
        assert name in listed, (name, listed)
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "rabbitmq-queues.png"))

    browser.set_window_size(1400, 1150)  # the got message whole, with its headers
    browser.get(f"{ui}/#/queues/{quote(vhost, safe='')}/{DEAD}")
    wait.until(lambda b: b.find_elements(By.XPATH, GET_MESSAGES))
    wait.until(get_messages)
    wait.until(lambda b: job_id in b.find_element(By.ID, "msg-wrapper").text)
    got = text_of(browser, "#msg-wrapper")
    # The SDK's failure headers: why, after how many attempts, from which queue.
    for shown in (
        f"x-job-id: {job_id}",
        "x-dead-error: RuntimeError: the payment service is down",
        "x-dead-attempts: 3",
        f"x-dead-queue: {WORK}",
    ):
        assert shown in got, (shown, got)
    heading = browser.find_element(By.XPATH, GET_MESSAGES)
    # Its heading at the top, below the UI's fixed header bar.
    browser.execute_script("arguments[0].scrollIntoView(); window.scrollBy(0, -130)", heading)
    assert browser.save_screenshot(str(ARTIFACTS / "rabbitmq-dead-letter-queue.png"))


def get_messages(browser: webdriver.Chrome) -> bool:
    """Unfold "Get messages" and get one message, nacked and requeued (looking leaves it in
    the queue); False until the section has unfolded (the UI slides it open)."""
    ackmode = browser.find_element(By.CSS_SELECTOR, "select[name=ackmode]")
    if not ackmode.is_displayed():
        browser.find_element(By.XPATH, GET_MESSAGES).click()  # the section starts folded
        return False
    Select(ackmode).select_by_value("ack_requeue_true")
    browser.find_element(By.CSS_SELECTOR, "input[value='Get Message(s)']").click()
    return True
