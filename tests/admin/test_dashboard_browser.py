"""The dashboard in headless Chromium against a real server: it shows a running request,
and a W_max change made on the page reaches the server, only with the admin key."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
import requests

from tests.admin.conftest import Server
from tests.serving.conftest import ADMIN_KEY

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Set to a path to keep the screenshot (the README's docs/dashboard.png comes from here).
SCREENSHOT_ENV = "NANOSPEC_DASHBOARD_SCREENSHOT"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1100,820",
]  # fmt: skip


@pytest.fixture
def browser():
    if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def submit_w_max(browser, w_max: int, key: str) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    result = browser.find_element(By.ID, "w-max-result")
    browser.execute_script("arguments[0].textContent = ''", result)
    for field, value in (("w-max-input", str(w_max)), ("admin-key-input", key)):
        element = browser.find_element(By.ID, field)
        element.clear()
        if value:
            element.send_keys(value)
    browser.find_element(By.CSS_SELECTOR, "#w-max-form button").click()
    WebDriverWait(browser, 60).until(lambda b: result.text)
    return result.text


def texts(browser, selector: str) -> list[str]:
    """Texts of the matching elements, read in one go: the page redraws on every poll."""
    script = "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)"
    return browser.execute_script(script, selector)


def _has(browser, selector: str) -> bool:
    return browser.execute_script("return !!document.querySelector(arguments[0])", selector)


def settings(server: Server) -> dict:
    return requests.get(f"{server.url}/nanospec/settings", timeout=30).json()


def test_dashboard_shows_running_request_and_changes_w_max(server: Server, browser) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    rid = "dashboard-running"
    body = {"rid": rid, "input_ids": [1, 5, 9, 13], "sampling_params": {
        "max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    long_request = threading.Thread(
        target=requests.post, args=(f"{server.url}/generate",), kwargs={"json": body}
    )
    long_request.start()
    browser.get(f"{server.url}/dashboard?interval=300")
    cells = f'tr.running[data-rid="{rid}"] td'
    WebDriverWait(browser, 120).until(lambda b: texts(b, cells))
    row = texts(browser, cells)
    assert row[1] == "running" and int(row[6]) > 0  # active vocabulary now
    line = f'#chart-active polyline[data-rid="{rid}"]'
    WebDriverWait(browser, 60).until(lambda b: _has(b, line))

    before = settings(server)["w_max"]
    assert "401" in submit_w_max(browser, 777, "")
    assert "403" in submit_w_max(browser, 777, "not-the-key")
    assert settings(server)["w_max"] == before
    assert "777" in submit_w_max(browser, 777, ADMIN_KEY)
    assert settings(server)["w_max"] == 777
    WebDriverWait(browser, 30).until(lambda b: texts(b, '[data-name="W_max"]') == ["777"])
    if os.environ.get(SCREENSHOT_ENV):
        browser.save_screenshot(str(Path(os.environ[SCREENSHOT_ENV])))
    long_request.join()
    requests.post(
        f"{server.url}/nanospec/settings",
        json={"w_max": before},
        headers={"X-Admin-Key": ADMIN_KEY},
        timeout=30,
    )
