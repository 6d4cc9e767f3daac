"""The dashboard in headless Chromium against a real `gpupool server`: sign in, both GPUs, a new lease live.

Needs Debian's `chromium` and `chromium-driver` and the `selenium` package
(`.ci/run` installs them); skipped with the reason where any is missing.
Selenium is pointed at /usr/bin/chromedriver, so nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import stop_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser(tmp_path):
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip("needs Chromium and its driver: apt-get install chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium: pip install selenium")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver) -> list:
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout:g} s")


def test_dashboard_in_chromium(browser, server_factory, tmp_path):
    from selenium.webdriver.common.by import By

    server = server_factory()  # 2 emulated 16 GiB GPUs, admin token
    browser.get(server.url + "/")
    field = browser.find_element(By.NAME, "token")  # the sign-in page: the API's token
    field.send_keys(server.token)
    field.submit()
    rows = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.gpu"), 10, "the GPUs show")
    assert len(rows) == 2
    assert all(r.get_attribute("data-uuid").startswith("GPU-emu-") for r in rows)
    assert not browser.find_elements(By.CSS_SELECTOR, "tr.lease")
    browser.execute_script("window.__notReloaded = true;")

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(HOME=str(tmp_path / "home"), GPUPOOL_STATE=str(tmp_path / "no-embedded"), GPUPOOL_TOKEN=server.token)
    run = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "run", "--server", server.url, "-p", "0.5", "--", "sleep", "60"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        started = time.monotonic()
        lease = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.lease"), 5.0, "the new lease shows")
        appeared_s = time.monotonic() - started
        assert browser.execute_script("return window.__notReloaded === true;"), "the page was reloaded"
        assert "50%" in lease[0].text
        bars = browser.find_elements(By.CSS_SELECTOR, "svg.bar rect.l0, svg.bar rect[class^='l']")
        assert bars, "the lease's slice is drawn in its GPU's bar"
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        if os.environ.get("GPUPOOL_DASHBOARD_SCREENSHOT"):
            shutil.copyfile(shot, Path(os.environ["GPUPOOL_DASHBOARD_SCREENSHOT"]))
        print(f"lease appeared after {appeared_s:.2f} s; screenshot {shot}")
    finally:
        stop_process(run, signal.SIGTERM)
    wait_for(lambda: not browser.find_elements(By.CSS_SELECTOR, "tr.lease"), 5.0, "the released lease goes")
    assert console_errors(browser) == []
