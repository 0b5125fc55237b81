"""Debian's headless chromium through Selenium, for the browser tests and the docs' screenshots."""

from __future__ import annotations

import time
from collections.abc import Callable

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from devstack.ports import reserve_port

# Every name but the machine's own resolves to nothing: a page that needs a CDN fails to load it.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost"


def chromium(*arguments: str, size: tuple[int, int] = (1400, 1200)) -> webdriver.Chrome:
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    for argument in arguments:
        options.add_argument(argument)
    options.add_argument(f"--window-size={size[0]},{size[1]}")
    # Selenium would pick chromedriver's port by binding 0 and letting go: a race (ports.py).
    service = Service("/usr/bin/chromedriver", port=reserve_port())
    return webdriver.Chrome(service=service, options=options)


def settled(check: Callable[[], object], timeout_s: float = 5) -> bool:
    """Whether ``check()`` holds within ``timeout_s`` (for a wait that acts again if not)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def until(check: Callable[[], object], timeout_s: float = 20) -> None:
    """Return once ``check()`` holds (state in another process); AssertionError at the deadline."""
    assert settled(check, timeout_s), "timed out"


def click(browser: webdriver.Chrome, selector: str) -> bool:
    """Find and click in one step (for a wait: a page that re-renders may replace the element)."""
    browser.find_element(By.CSS_SELECTOR, selector).click()
    return True


def text_of(browser: webdriver.Chrome, selector: str, timeout_s: float = 20) -> str:
    """The text of the element at ``selector``, read again if a re-render replaced it between
    finding and reading (the console re-renders its panels on every poll)."""
    wait = WebDriverWait(browser, timeout_s, ignored_exceptions=(StaleElementReferenceException,))
    text: str = wait.until(lambda b: (b.find_element(By.CSS_SELECTOR, selector).text,))[0]
    return text
