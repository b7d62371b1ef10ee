"""The donor's web page in a real browser (Debian's chromium, headless, through chromium-driver
and selenium): it loads from a running daemon, its plots render with data, its buttons pause,
finish and fold the daemon, and neither a foreign page nor a browser without the token can
drive it. Screenshots are taken along the way (and copied to /tmp/donor-shots/ for a person to
look at)."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import threading
import time

import pytest

from volunteer.donor.history import History, history_path, save

from .test_donor_cli import EXPERTS, Joined, call_experts, listed, wait_listed
from .test_join_cli import relay  # noqa: F401  (fixture)

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1400,1700")
SHOTS = "/tmp/donor-shots"

if not (CHROMIUM and DRIVER) and os.environ.get("VOLUNTEER_REQUIRE_BROWSER") != "1":
    pytest.skip("chromium and chromium-driver are not installed (scripts/setup.sh installs them as root)",
                allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver")


def browser(profile):
    """A headless chromium with a fresh profile (no cookies, no cache, nothing from the network)."""
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(30)
    return driver


def wait_until(condition, what: str, timeout: float = 30, driver=None):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, what + (f"; the page: {driver.page_source[:800]}" if driver else "")
        time.sleep(0.2)


def text_of(driver, element_id: str) -> str:
    """An element's text, read in one step (the page swaps its live part every few seconds,
    so an element found in one call may be gone in the next)."""
    return driver.execute_script("const e = document.getElementById(arguments[0]); return e ? e.textContent : '';",
                                 element_id) or ""


def press(driver, button: str) -> None:
    """Click one of the page's buttons, as a donor would (found and clicked in one step)."""
    driver.execute_script("document.getElementById(arguments[0]).click();", f"btn-{button}")


def shot(driver, tmp_path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    driver.save_screenshot(str(path))
    os.makedirs(SHOTS, exist_ok=True)
    shutil.copy(path, os.path.join(SHOTS, f"{name}.png"))


def bars(driver, chart_id: str) -> int:
    """Drawn bars (rects with a height) in one of the page's SVG plots."""
    return int(driver.execute_script(
        "return Array.from(document.querySelectorAll(`#${arguments[0]} rect`))"
        ".filter(r => parseFloat(r.getAttribute('height')) > 0).length;", chart_id))


class ForeignSite:
    """A page on another origin (127.0.0.2) whose script tries to press the daemon's buttons."""

    def __init__(self, target: str) -> None:
        page = ("<!doctype html><title>foreign</title><script>"
                f"fetch('{target}/api/pause', {{method: 'POST', credentials: 'include', mode: 'no-cors'}})"
                ".then(() => document.title = 'sent').catch(e => document.title = 'blocked');"
                "</script>").encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.2", 0), Handler)
        self.url = f"http://127.0.0.2:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def seed_history(state_dir, swarm_id: str) -> None:
    """Earlier days and hours of contributions, as a daemon that ran before would have left."""
    history = History()
    now = time.time()
    for day in range(1, 60, 3):
        history.add(now - day * 86400, {"calls": 100 + 10 * day, "cpu_s": 30.0 + day, "uptime_s": 3600})
    for hour in range(2, 150, 5):
        history.add(now - hour * 3600, {"calls": 5 + hour % 7, "cpu_s": 2.0 + hour % 3})
    assert save(history_path(state_dir, swarm_id), history)


@pytest.mark.slow
def test_the_page_in_a_real_browser(relay, tmp_path, cli_env):  # noqa: F811
    env = {**os.environ, **cli_env, "PYTHONUNBUFFERED": "1"}
    seed_history(tmp_path / "state" / "volunteer", "e2e")
    daemon = Joined(relay, *EXPERTS, "--yes", "--web", "127.0.0.1:0", env=env, control=tmp_path / "d.sock")
    drivers = []
    foreign = None
    try:
        login = re.search(r"web page on (http://127\.0\.0\.1:\d+/\?token=\S+)", "".join(daemon.lines)).group(1)
        base = login.split("?")[0].rstrip("/")
        wait_listed(relay, env, ["expert.0", "expert.1"])
        assert call_experts(relay, ["expert.0", "expert.1"], times=2) == []
        driver = browser(tmp_path / "profile")
        drivers.append(driver)
        driver.get(login)
        assert driver.current_url == base + "/"  # the token went into a cookie, out of the address bar
        def state() -> str:  # the page's state badge; "" while a page loads or if it is not the page
            return text_of(driver, "state").lower()

        wait_until(lambda: state() == "folding", "the page shows the daemon folding")
        assert "expert.0" in text_of(driver, "experts") and "relay" in text_of(driver, "connections")
        for chart in ("chart-calls-hourly", "chart-compute-hourly", "chart-calls-daily", "chart-compute-daily"):
            assert bars(driver, chart) >= 10, chart
        # this session's calls (live, not yet saved) are in the newest hour's bar
        wait_until(lambda: "expert.0" in driver.page_source and bars(driver, "chart-calls-hourly") >= 30,
                   "the calls of this hour drawn")
        shot(driver, tmp_path, "1-folding")

        press(driver, "pause")
        wait_until(lambda: state() == "paused", "the page shows the daemon paused", driver=driver)
        assert "paused by you (web)" in text_of(driver, "state-text")
        status = daemon.status()
        assert status["paused"] and status["conduct"]["events"][-1]["origin"] == "web"
        wait_listed(relay, env, [])
        shot(driver, tmp_path, "2-paused")

        press(driver, "fold")
        wait_until(lambda: state() == "folding", "folding again")
        wait_listed(relay, env, ["expert.0", "expert.1"])

        press(driver, "finish")
        wait_until(lambda: state() == "finished", "finished: idle and connected")
        assert not daemon.status()["conduct"]["serving"]
        shot(driver, tmp_path, "3-finished")
        press(driver, "fold")
        wait_until(lambda: state() == "folding", "folding after a finish")

        # a page of another origin cannot press the buttons, even in the donor's own browser
        foreign = ForeignSite(base)
        driver.get(foreign.url)
        wait_until(lambda: driver.title in ("sent", "blocked"), "the foreign page's script ran")
        time.sleep(1)
        assert daemon.status()["state"] == "folding"
        events = daemon.status()["conduct"]["events"]
        assert [e["action"] for e in events if e["origin"] == "web"][-1] == "fold"

        # a browser without the token sees the refusal, and the live view's data stays private
        stranger = browser(tmp_path / "stranger")
        drivers.append(stranger)
        stranger.get(base + "/")
        assert "401 missing or wrong token" in stranger.find_element("tag name", "body").text
        stranger.get(base + "/api/status")
        assert "peer_id" not in stranger.page_source
        shot(stranger, tmp_path, "4-no-token")

        driver.get(base + "/")
        wait_until(lambda: state() == "folding", "the page again")
        shot(driver, tmp_path, "5-folding-again")
        web = json.loads(daemon.cli("status", "--json").stdout)["web"]
        assert web == {"url": base + "/", "login": login}  # where the donor finds the link again
        assert listed(relay, env) == ["expert.0", "expert.1"]
    finally:
        for driver in drivers:
            driver.quit()
        if foreign is not None:
            foreign.close()
        daemon.stop()
