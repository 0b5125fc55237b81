"""The web console in a real headless browser (Debian's chromium through Selenium): it opens with
an API key; tells apart two jobs made in the same minute; finds a job by idempotency key and by id
with its payload, headers and history; counts the next jobs due per minute and routing key; pauses
and resumes a schedule; and requeues a dead job, saying what becomes of its copy in the dead queue.
A screenshot is saved to test-artifacts/console.png."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from consumers_sdk import reporter
from devstack.dispatcher_process import DispatcherProcess
from devstack.rabbitmq import RabbitServer
from tests.support.browser import click, settled, text_of, until
from tests.support.dispatched import dispatch_round as round_of
from tests.support.process import served

pytestmark = pytest.mark.e2e
ADMIN = "console-admin-0123456789abcdef"
MONITOR = "console-monitor-0123456789abcdef"
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
            "DISPATCHER_API_KEYS": f"{ADMIN}:admin,{MONITOR}:monitor",
            "DISPATCHER_STATS_INTERVAL_S": "0.5",
            "DISPATCHER_AMQP_MANAGEMENT_URL": rabbit_server.mgmt_url.replace(
                "http://", "http://guest:guest@"
            ),
        },
        api_key=ADMIN,
    )


@pytest.fixture
def http(dispatcher: DispatcherProcess) -> Iterator[httpx.Client]:
    """The admin's client, closed even when the test fails (a socket left to the collector would
    be reported in whichever later test collects it)."""
    with httpx.Client(
        base_url=dispatcher.url, headers={"authorization": f"Bearer {ADMIN}"}
    ) as client:
        yield client


def test_the_console_finds_a_job_shows_its_history_and_requeues_a_dead_job(
    dispatcher: DispatcherProcess,
    http: httpx.Client,
    amqp_url: str,
    database_url: str,
    browser: webdriver.Chrome,
) -> None:
    job = {
        "routing_key": "orders.expire",
        "payload": {"order": 7, "lines": ["socks", "shoes"]},
        "headers": {"x-tenant": "acme"},
        "idempotency_key": "order-7",
    }
    job_id = http.post("/v1/jobs", json=job).json()["id"]
    twin = {"routing_key": "orders.expire", "payload": {"order": 8}}
    twin_id = http.post("/v1/jobs", json=twin).json()["id"]  # made in the same minute
    # Three jobs due in the same minute (a ten minutes ahead) are one row counting 3.
    minute = (datetime.now(UTC) + timedelta(minutes=10)).replace(second=0, microsecond=0)
    for second in (5, 20, 40):
        run_at = (minute + timedelta(seconds=second)).isoformat()
        later = {"routing_key": "orders.remind", "payload": {"order": 8}, "run_at": run_at}
        http.post("/v1/jobs", json=later).raise_for_status()
    nightly = {
        "name": "nightly-report",
        "interval_s": 3600,
        "job": {"routing_key": "reports.nightly", "payload": {}},
    }
    http.post("/v1/schedules", json=nightly).raise_for_status()
    for dead in (job_id, twin_id):
        until(lambda dead=dead: http.get(f"/v1/jobs/{dead}").json()["state"] == "dispatched")
        asyncio.run(report_dead(amqp_url, database_url, dead))  # as a consumer that gave up would
        until(lambda dead=dead: http.get(f"/v1/jobs/{dead}").json()["state"] == "dead")
    # Forgeries of the twin's end: a few are kept in its history, the rest only counted.
    asyncio.run(report_forged(amqp_url, twin_id, 8))
    until(lambda: http.get(f"/v1/jobs/{twin_id}").json()["ignored_dropped"] == 3)

    # The console re-renders its panels on every poll: an element found a moment ago may be gone.
    wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))
    browser.get(f"{dispatcher.url}/console/")
    browser.find_element(By.ID, "api-key").send_keys(ADMIN)
    browser.find_element(By.ID, "key-save").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, f'#dead tr[data-job="{job_id}"]'))
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, f'#dead tr[data-job="{twin_id}"]'))
    wait.until(lambda b: "node" in b.find_element(By.ID, "cluster").text)
    wait.until(lambda b: "dispatcher.events" in b.find_element(By.ID, "queues").text)

    # Jobs of the same minute: what the dead table shows of each id differs, and it is the id.
    shown = {dead: visible_id(browser, dead) for dead in (job_id, twin_id)}
    assert shown[job_id] != shown[twin_id], shown
    assert shown == {job_id: job_id, twin_id: twin_id}, shown

    # The next-due panel: one row for orders.remind's minute, counting its three jobs.
    due_row = '#due tr[data-routing-key="orders.remind"] td.jobs'
    wait.until(lambda b: b.find_element(By.CSS_SELECTOR, due_row).text.strip() == "3")
    assert (
        len(browser.find_elements(By.CSS_SELECTOR, '#due tr[data-routing-key="orders.remind"]'))
        == 1
    )

    search = browser.find_element(By.ID, "search")
    search.send_keys(twin_id)
    browser.find_element(By.ID, "search-go").click()
    wait.until(lambda b: "3 more ignored events" in text_of(b, "#ignored-dropped"))
    assert text_of(browser, "#history").count("(ignored: other_round)") == 5
    search.clear()
    search.send_keys("order-7")  # by idempotency key
    browser.find_element(By.ID, "search-go").click()
    wait.until(lambda b: job_id in b.find_element(By.ID, "job").text)
    search.clear()
    search.send_keys(job_id)  # by id
    browser.find_element(By.ID, "search-go").click()
    wait.until(lambda b: "RuntimeError: order 7 is locked" in b.find_element(By.ID, "job").text)
    steps = ("scheduled", "dispatched", "started", "dead")
    wait.until(lambda b: all(s in b.find_element(By.ID, "history").text for s in steps))
    payload = text_of(browser, "#payload")
    assert '"order": 7' in payload, payload
    assert '"socks"' in payload, payload
    headers = text_of(browser, "#headers")
    assert "x-tenant" in headers, headers
    assert "acme" in headers, headers

    # Schedules: listed with their timing and next occurrence; pause and resume reach the API.
    schedule_row = '#schedules tr[data-schedule="nightly-report"]'
    wait.until(lambda b: "reports.nightly" in b.find_element(By.CSS_SELECTOR, schedule_row).text)
    listed = text_of(browser, schedule_row)
    assert "every 1h" in listed, listed
    assert "active" in listed, listed
    toggle = 'button.pause-toggle[data-schedule="nightly-report"]'
    for paused, before, after in ((True, "Pause", "Resume"), (False, "Resume", "Pause")):
        # Each button sets one state (Pause pauses, Resume resumes), so clicking the one that says
        # `before` again is harmless; it is clicked again when a re-render moved it under the click.
        WebDriverWait(browser, 45, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda b, paused=paused, before=before: (
                b.find_element(By.CSS_SELECTOR, toggle).text == before
                and click(b, toggle)
                and settled(lambda: schedule_paused(http, "nightly-report") is paused)
            )
        )
        wait.until(lambda b, after=after: b.find_element(By.CSS_SELECTOR, toggle).text == after)

    # Found and clicked in one step of the wait: the dead panel may re-render in between.
    wait.until(lambda b: click(b, f'button.requeue[data-job="{job_id}"]'))
    wait.until(lambda b: f"requeued {job_id}" in b.find_element(By.ID, "dead-message").text)
    said = text_of(browser, "#dead-message")
    assert "Its copy in billing.orders.expire.dead stays there" in said, said
    assert "dispatcher dlq requeue drops it (it does not run again)" in said, said
    assert http.get(f"/v1/jobs/{job_id}").json()["state"] != "dead"  # back on its way
    wait.until(lambda b: "requeued" in b.find_element(By.ID, "history").text)
    wait.until(lambda b: not b.find_elements(By.CSS_SELECTOR, f'#dead tr[data-job="{job_id}"]'))
    ARTIFACTS.mkdir(exist_ok=True)
    browser.set_window_size(1400, 1850)  # the whole console, from the top, for the docs
    browser.execute_script("window.scrollTo(0, 0)")
    assert browser.save_screenshot(str(ARTIFACTS / "console.png"))

    # A reminder pushed back by a later submit of its key: the history says to when.
    remind = {"routing_key": "orders.nudge", "payload": {}, "idempotency_key": "nudge-7"}
    http.post("/v1/jobs", json={**remind, "run_at": minute.isoformat()}).raise_for_status()
    pushed = (minute + timedelta(minutes=5)).isoformat()
    http.post(
        "/v1/jobs", json={**remind, "run_at": pushed, "on_existing": "extend"}
    ).raise_for_status()
    search.clear()
    search.send_keys("nudge-7")
    browser.find_element(By.ID, "search-go").click()
    wait.until(lambda b: "extended: run_at " in b.find_element(By.ID, "history").text)


def test_the_console_pauses_and_resumes_a_routing_key_after_confirmation(
    dispatcher: DispatcherProcess, http: httpx.Client, browser: webdriver.Chrome
) -> None:
    later = {"routing_key": "billing.charge", "payload": {"order": 9}, "delay_ms": 600_000}
    http.post("/v1/jobs", json=later).raise_for_status()
    wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))
    browser.get(f"{dispatcher.url}/console/")
    browser.find_element(By.ID, "api-key").send_keys(ADMIN)
    browser.find_element(By.ID, "key-save").click()
    wait.until(lambda b: "no routing key is held back" in b.find_element(By.ID, "limits").text)

    # Asked to confirm, and declined: nothing is paused.
    browser.find_element(By.ID, "pause-key").send_keys("billing")
    browser.find_element(By.ID, "pause-note").send_keys("card processor down")
    browser.find_element(By.ID, "pause-go").click()
    dialog = wait.until(lambda b: b.switch_to.alert)
    assert "Pause billing" in dialog.text
    dialog.dismiss()
    assert http.get("/v1/limits").json()["limits"] == []
    browser.find_element(By.ID, "pause-go").click()
    wait.until(lambda b: b.switch_to.alert).accept()
    wait.until(lambda b: "paused billing" in b.find_element(By.ID, "limits-message").text)
    [rule] = http.get("/v1/limits").json()["limits"]
    assert (rule["key"], rule["note"], rule["holding"]) == ("billing", "card processor down", True)
    held_row = '#limits tr[data-key="billing"]'
    wait.until(lambda b: "paused" in b.find_element(By.CSS_SELECTOR, held_row).text)
    assert "every namespace" in text_of(browser, held_row)
    # The next-due panel says the key is paused.
    due_row = '#due tr[data-routing-key="billing.charge"]'
    wait.until(lambda b: "billing.charge (paused)" in b.find_element(By.CSS_SELECTOR, due_row).text)

    # Resume: one click and a confirmation.
    wait.until(lambda b: click(b, 'button.resume-key[data-key="billing"]'))
    wait.until(lambda b: b.switch_to.alert).accept()
    wait.until(lambda b: "resumed billing" in b.find_element(By.ID, "limits-message").text)
    assert http.get("/v1/limits").json()["limits"] == []
    wait.until(lambda b: "no routing key is held back" in b.find_element(By.ID, "limits").text)


def test_the_console_counts_dead_jobs_by_filter_and_requeues_them_all_after_confirmation(
    dispatcher: DispatcherProcess, http: httpx.Client, database_url: str, browser: webdriver.Chrome
) -> None:
    far = {"payload": {}, "delay_ms": 600_000}
    timed_out = [
        http.post("/v1/jobs", json={"routing_key": "billing.charge", **far}).json()["id"]
        for _ in range(3)
    ]
    declined = http.post("/v1/jobs", json={"routing_key": "billing.charge", **far}).json()["id"]
    asyncio.run(make_dead(database_url, timed_out, "bank timeout"))
    asyncio.run(make_dead(database_url, [declined], "card declined"))
    wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))
    browser.get(f"{dispatcher.url}/console/")
    browser.find_element(By.ID, "api-key").send_keys(ADMIN)
    browser.find_element(By.ID, "key-save").click()
    browser.find_element(By.ID, "bulk-prefix").send_keys("billing")
    browser.find_element(By.ID, "bulk-error").send_keys("timeout")
    browser.find_element(By.ID, "bulk-count").click()
    wait.until(lambda b: "3 dead jobs match" in b.find_element(By.ID, "bulk-message").text)
    go = browser.find_element(By.ID, "bulk-go")
    assert go.text == "Requeue these 3 jobs"

    # Declined: nothing changes; accepted: the three are requeued in the background.
    go.click()
    wait.until(lambda b: b.switch_to.alert).dismiss()
    assert http.get("/v1/bulk-actions").json()["bulk_actions"] == []
    go.click()
    wait.until(lambda b: b.switch_to.alert).accept()
    wait.until(lambda b: "done, 3 of 3 requeued" in b.find_element(By.ID, "bulk-message").text)
    assert all(http.get(f"/v1/jobs/{job}").json()["state"] != "dead" for job in timed_out)
    assert http.get(f"/v1/jobs/{declined}").json()["state"] == "dead"


async def make_dead(database_url: str, ids: list[str], error: str) -> None:
    """Dead as a consumer's last failure leaves a job (its events aside)."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "UPDATE jobs SET state = 'dead', last_error = $2, dispatched_at = now(),"
            " updated_at = now() WHERE id = ANY($1::uuid[])",
            ids,
            error,
        )
    finally:
        await connection.close()


def test_a_monitor_key_sees_the_figures_but_neither_jobs_nor_schedules(
    dispatcher: DispatcherProcess, http: httpx.Client, browser: webdriver.Chrome
) -> None:
    later = {"routing_key": "orders.remind", "payload": {"order": 8}, "delay_ms": 600_000}
    http.post("/v1/jobs", json=later).raise_for_status()
    nightly = {"name": "nightly", "interval_s": 60, "job": {"routing_key": "r.n", "payload": {}}}
    http.post("/v1/schedules", json=nightly).raise_for_status()
    wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))
    browser.get(f"{dispatcher.url}/console/")
    browser.find_element(By.ID, "api-key").send_keys(MONITOR)
    browser.find_element(By.ID, "key-save").click()
    wait.until(lambda b: "orders.remind" in b.find_element(By.ID, "due").text)
    wait.until(lambda b: "this needs producer" in b.find_element(By.ID, "schedules").text)
    assert "this needs producer" in text_of(browser, "#dead")
    assert "this needs limits" in text_of(browser, "#limits")
    assert not browser.find_elements(By.CSS_SELECTOR, "button.pause-toggle")


def schedule_paused(http: httpx.Client, name: str) -> bool:
    paused: bool = http.get(f"/v1/schedules/{name}").json()["paused"]
    return paused


def visible_id(browser: webdriver.Chrome, job_id: str) -> str:
    """The id as the dead table shows it (what a person sees, not an attribute)."""
    cell = f'#dead tr[data-job="{job_id}"] .job-id'
    wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))

    def shown(b: webdriver.Chrome) -> tuple[bool, str]:
        found = b.find_element(By.CSS_SELECTOR, cell)  # found and read in one step of the wait
        return found.is_displayed(), str(found.text)

    displayed, text = wait.until(shown)
    assert displayed, cell
    return text


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


async def report_forged(amqp_url: str, job_id: str, count: int) -> None:
    """Dead events about JOB_ID naming rounds no delivery carried."""
    events = reporter.EventReporter(amqp_url, group="mallory", consumer="mallory-1")
    events.open()
    for _ in range(count):
        events.report(
            job_id=job_id,
            routing_key="orders.expire",
            attempt=1,
            outcome="dead",
            dispatch_round=str(uuid.uuid4()),
        )
    await events.close(10)
