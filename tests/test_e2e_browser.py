"""End to end in a real headless Chromium: start the app with the tiny model, click Sample, see the heatmap.

Needs Debian's ``chromium`` (/usr/bin/chromium) and Playwright for Python (installed by ``make test-setup``); the
test installs nothing and is skipped when either is missing. Screenshots go to ``$MRTPO_SHOTS`` when set.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def server():
    port = _free_port()
    env = dict(os.environ, MRTPO_MODEL="tiny-random")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port", str(port),
         "--browser.gatherUsageStats", "false"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                pytest.fail(f"streamlit did not start: {proc.stdout.read().decode(errors='replace')[-2000:] if proc.poll() is not None else 'timeout'}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_sample_shows_heatmap_in_chromium(server):
    sync_api = pytest.importorskip("playwright.sync_api")
    shots = os.environ.get("MRTPO_SHOTS")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(server, wait_until="domcontentloaded")
            page.wait_for_selector(IDLE, timeout=60_000)
            page.get_by_role("button", name="Sample group").click()
            page.wait_for_selector(".mrtpo .tok", state="visible", timeout=90_000)
            page.wait_for_selector(IDLE, timeout=60_000)
            toks = page.locator(".mrtpo .tok")
            assert toks.count() > 0 and toks.first.is_visible()
            assert page.locator(".mrtpo .legend").first.is_visible()
            assert page.get_by_text("GDPO (uniform)").first.is_visible()
            assert page.locator("[data-testid='stException']").count() == 0
            assert page.locator("[data-testid='stAlertContentError']").count() == 0
            if shots:
                Path(shots).mkdir(parents=True, exist_ok=True)
                page.screenshot(path=f"{shots}/e2e_explore.png", full_page=True)
        finally:
            browser.close()
