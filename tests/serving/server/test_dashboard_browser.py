"""The dashboard in headless Chromium against a real `gpupool server`: sign in, both GPUs, a new lease live.

Needs Debian's `chromium` and `chromium-driver` and the `selenium` package
(`.ci/run` installs them); skipped with the reason where any is missing.
Selenium is pointed at /usr/bin/chromedriver, so nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import stop_process
from envs import clean_env
from waiting import wait_until

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
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1150"):
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


def texts(driver, selector: str) -> list:
    """The text of every element that matches, read in one script run.

    The page's live update replaces its rows while the test reads them: a WebElement found in one
    call can be stale by the next, so nothing here holds an element across calls.
    """
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);", selector
    )


def attributes(driver, selector: str, name: str) -> list:
    """The attribute `name` of every element that matches, read in one script run (see texts)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.getAttribute(arguments[1]));", selector, name
    )


def seed_samples(state: Path, hours_ago: range) -> None:
    """A sample a minute over `hours_ago`, through the store (a quarter of the memory used, 2 waiting)."""
    from gpupool.pooling.store import Store, samples

    store = Store(state)
    now = time.time()
    try:
        with store.write() as tx:
            for hour in hours_ago:
                for minute in range(60):
                    sample = samples.Sample(now - hour * 3600 + 60 * minute, 32768, 16384, 8192, 1, 2)
                    samples.write(tx, sample)
    finally:
        store.close()


def test_dashboard_in_chromium(browser, server_factory, tmp_path, monkeypatch):
    import httpx
    from selenium.webdriver.common.by import By

    usage = tmp_path / "usage.json"  # what the emulated GPUs' processes use, read by the server's watchdog
    usage.write_text("{}")
    monkeypatch.setenv("GPUPOOL_EMULATED_USAGE", str(usage))
    server = server_factory("--usage-interval", "0.2", "--enforce-grace", "0.2")  # 2 emulated 16 GiB GPUs
    browser.get(server.url + "/")
    field = browser.find_element(By.NAME, "token")  # the sign-in page: the API's token
    field.send_keys(server.token)
    field.submit()
    uuids = wait_until(lambda: attributes(browser, "tr.gpu", "data-uuid"), 30, "the GPUs show")
    assert len(uuids) == 2
    assert all(u.startswith("GPU-emu-") for u in uuids)
    assert not browser.find_elements(By.CSS_SELECTOR, "tr.lease")
    browser.execute_script("window.__notReloaded = true;")

    env = clean_env(
        HOME=str(tmp_path / "home"), GPUPOOL_STATE=str(tmp_path / "no-embedded"), GPUPOOL_TOKEN=server.token
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "run", "--server", server.url, "-p", "0.5", "--", "sleep", "60"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        started = time.monotonic()
        lease = wait_until(lambda: texts(browser, "tr.lease"), 30.0, "the new lease shows")
        appeared_s = time.monotonic() - started
        assert browser.execute_script("return window.__notReloaded === true;"), "the page was reloaded"
        assert "50%" in lease[0] and "8GiB" in lease[0]
        assert browser.find_elements(By.CSS_SELECTOR, "svg.bar g rect"), "the lease's slice is drawn in its GPU's bar"

        # Its process uses 6 GiB, and a process of no lease 1 GiB on the other GPU: both show, live.
        (held,) = httpx.get(server.url + "/v1/leases", headers=server.headers()).json()["leases"]
        on = held["devices"][0]["uuid"]
        other = next(u for u in uuids if u != on)
        usage.write_text(json.dumps({on: {str(run.pid): 6144}, other: {str(os.getpid()): 1024}}))
        wait_until(lambda: any("6GiB" in t for t in texts(browser, "tr.lease")), 30.0, "the lease's use shows")
        wait_until(
            lambda: browser.find_elements(By.CSS_SELECTOR, "#enforcement tbody tr"),
            30.0,
            "the watchdog's warning shows",
        )
        assert browser.find_elements(By.CSS_SELECTOR, "svg.bar rect.unleased")

        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        if os.environ.get("GPUPOOL_DASHBOARD_SCREENSHOT"):  # how docs/dashboard.png is made
            shutil.copyfile(shot, Path(os.environ["GPUPOOL_DASHBOARD_SCREENSHOT"]))
        print(f"lease appeared after {appeared_s:.2f} s; screenshot {shot}")

        # The lease's row names its label and queue; the charts' range is chosen by a link and kept by the refresh.
        cells = texts(browser, "tr.lease td.label, tr.lease td.queue, tr.lease td.job")
        assert cells == ["–", "–", "–"], cells  # a plain `gpupool run`: no job, no label, the default queue
        assert texts(browser, "#charts .range-name") == ["1 hour"]
        assert len(texts(browser, "#charts .time-axis span")) == 15  # five times of day under each of the 3 charts
        seed_samples(server.state, hours_ago=range(20, 1, -1))  # what the server's sampler kept on disk
        browser.find_element(By.CSS_SELECTOR, 'a.range[data-range="24h"]').click()
        wait_until(lambda: texts(browser, "#charts .range-name") == ["24 hours"], 30.0, "the 24-hour range shows")
        # Past the live hour, memory used and queue length come from the samples on disk.
        for line in ("line-used", "line-queue"):
            (points,) = attributes(browser, f"#charts polyline.{line}", "points")
            older = [x for x, _ in (p.split(",") for p in points.split()) if float(x) < 300 * (1 - 1 / 24) - 0.1]
            assert len(older) >= 60, (line, points)  # 18 hours of samples in 12-minute buckets: 90 points
        browser.execute_script("window.__sameDay = true; document.getElementById('state').textContent = '';")
        wait_until(lambda: texts(browser, "#state")[0].startswith("live ·"), 30.0, "a live refresh comes")
        assert browser.execute_script("return window.__sameDay === true;"), "the page was reloaded"
        assert texts(browser, "#charts .range-name") == ["24 hours"], "the refresh kept the range"
        hours = texts(browser, "#usage table.usage-by-holder td.gpu-hours")
        assert len(hours) == 1 and float(hours[0]) >= 0.0  # the live lease's holder, counted up to now
    finally:
        stop_process(run, signal.SIGTERM)
    wait_until(lambda: not browser.find_elements(By.CSS_SELECTOR, "tr.lease"), 30.0, "the released lease goes")
    assert console_errors(browser) == []
