"""End to end in a real headless Chromium: start the app with the tiny model, click Sample, see the heatmap.

Needs Debian's ``chromium`` (/usr/bin/chromium) and Playwright for Python (installed by ``make test-setup``); the
test installs nothing and is skipped when either is missing. Screenshots go to ``$MRTPO_SHOTS`` when set.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app():
    """`mrtpo app` (what `make app` runs) on a free port with the tiny model: (url, process) once it is healthy."""
    port = _free_port()
    env = dict(os.environ, MRTPO_MODEL="tiny-random")
    proc = subprocess.Popen([sys.executable, "-m", "mrtpo", "app", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
                log = proc.stdout.read().decode(errors="replace")[-2000:] if proc.poll() is not None else "timeout"
                pytest.fail(f"streamlit did not start: {log}")
            time.sleep(0.3)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture()
def server():
    with running_app() as (url, _):
        yield url


def test_stopping_mrtpo_app_stops_its_server():
    """`mrtpo app` is the server process itself: stopping it leaves nothing serving (it ran Streamlit as a child
    before, which outlived a terminated parent and kept its port)."""
    with running_app() as (url, proc):
        proc.terminate()
        assert proc.wait(10) in (0, -signal.SIGTERM)  # it stopped (within 10 s) because it was asked to
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=2)


@contextlib.contextmanager
def chromium_page(url: str, height: int = 1000):
    """A page of headless Debian chromium (1400 px wide) at ``url``, once the app's script has run."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": height})
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_selector(IDLE, timeout=60_000)
            yield page
        finally:
            browser.close()


def test_sample_shows_heatmap_in_chromium(server):
    shots = os.environ.get("MRTPO_SHOTS")
    with chromium_page(server) as page:
        page.get_by_role("button", name="Sample group").click()
        page.wait_for_selector(".mrtpo .legend", state="visible", timeout=90_000)  # (a token may be empty)
        page.wait_for_selector(IDLE, timeout=60_000)
        toks = page.locator(".mrtpo .tok:not(:empty)")
        assert toks.count() > 0 and toks.first.is_visible()
        assert page.locator(".mrtpo .legend").first.is_visible()
        assert page.get_by_text("GDPO (uniform)").first.is_visible()
        assert page.locator("[data-testid='stException']").count() == 0
        assert page.locator("[data-testid='stAlertContentError']").count() == 0
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=f"{shots}/e2e_explore.png", full_page=True)


def test_evidence_outline_in_chromium(server):
    """tea-note (no comma; keywords green, cup), seed 1: the tokens a replayed reward's checker read are underlined
    (``.ev``) in some response's rows, and the legend says what the underline means."""
    shots = os.environ.get("MRTPO_SHOTS")
    with chromium_page(f"{server}/?family=instructions&example=tea-note") as page:
        seed = page.get_by_role("spinbutton", name="Seed")  # seed 1: the no-comma reward varies, so it is replayed
        seed.fill("1")
        seed.press("Enter")
        _idle(page)
        page.get_by_role("button", name="Sample group").click()
        page.wait_for_selector(".mrtpo .legend", state="visible", timeout=90_000)  # (a token may be empty)
        page.wait_for_selector(IDLE, timeout=60_000)
        assert page.locator(".mrtpo .legend .ev").first.is_visible()
        for j in range(1, 4):  # the responses whose checkers found something to point at are outlined
            if page.locator(".mrtpo .toks .ev").count():
                break
            box = page.get_by_role("combobox", name="Response")  # a react-aria combobox: type, then Enter
            box.click()
            box.fill(f"#{j}")
            page.get_by_role("option").first.wait_for(timeout=10_000)
            page.keyboard.press("Enter")
            page.wait_for_timeout(300)
            page.wait_for_selector(IDLE, timeout=60_000)
        outline = page.locator(".mrtpo .toks .ev")
        assert outline.count() > 0 and outline.first.is_visible()
        box = outline.first.bounding_box()
        assert box and box["width"] > 0
        assert page.get_by_text("AUROC", exact=False).first.is_visible()
        assert page.locator("[data-testid='stException']").count() == 0
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=f"{shots}/e2e_evidence.png", full_page=True)


def _idle(page) -> None:
    page.wait_for_timeout(300)
    page.wait_for_selector(IDLE, timeout=60_000)


@pytest.mark.parametrize("path, title", [("training", "Train"), ("teach-mrtpo", "Teach")])
def test_a_link_to_a_page_on_a_fresh_server(server, path, title):
    """The first visitor of a fresh server who follows a link straight to a page gets that page, sidebar and all, and
    no "Page not found" dialog: a page's link is its file name in pages/ (Streamlit's documented multipage layout)."""
    with chromium_page(f"{server}/{path}") as page:
        _idle(page)
        # (on a slow machine the first run of a fresh server may still be drawing when the app first reads idle)
        page.get_by_role("heading", name=title).first.wait_for(state="visible", timeout=60_000)
        page.get_by_label("Model").first.wait_for(state="visible", timeout=60_000)  # app.py's sidebar ran
        assert page.get_by_label("Model").first.is_visible()
        assert page.get_by_text("Page not found").count() == 0
        assert page.url.startswith(f"{server}/{path}")
        assert page.locator("[data-testid='stException']").count() == 0


def test_scale_switch_table_row_and_topk_in_chromium(server):
    """tea-note, seed 1 (no_comma varies): the scale switch changes the legend, GDPO and MRTPO sit side by side,
    a click on a table row selects that response, and the top-k view draws its bars."""
    shots = os.environ.get("MRTPO_SHOTS")
    with chromium_page(f"{server}/?family=instructions&example=tea-note") as page:
        seed = page.get_by_role("spinbutton", name="Seed")  # (the box; its help is a button)
        seed.fill("1")
        seed.press("Enter")
        _idle(page)
        page.get_by_role("button", name="Sample group").click()
        page.wait_for_selector(".mrtpo .legend", state="visible", timeout=90_000)
        _idle(page)
        legend = page.locator(".mrtpo .legend").first
        assert "colors scaled to this response" in legend.inner_text()
        first_label = page.get_by_role("combobox", name="Response").input_value()
        assert first_label.startswith("#0 —")
        assert page.get_by_text("moved by MRTPO").first.is_visible()
        gdpo, mrtpo = (page.locator(".mrtpo .pair").first.locator(".row").nth(j).bounding_box() for j in (0, 1))
        assert abs(gdpo["y"] - mrtpo["y"]) < 1 and mrtpo["x"] > gdpo["x"] + gdpo["width"]  # side by side
        page.get_by_role("radio", name="shared by the group").click()
        _idle(page)
        assert "colors shared by the group" in page.locator(".mrtpo .legend").first.inner_text()
        # the responses table: a click on row 2's selection cell (left edge; header and rows 35 px high)
        box = page.locator("[data-testid='stDataFrame']").first.bounding_box()
        page.mouse.click(box["x"] + 12, box["y"] + 35 + 2 * 35 + 17)
        _idle(page)
        assert page.get_by_role("combobox", name="Response").input_value().startswith("#2 —")
        page.get_by_text("Show p_t and q_t at a token").click()
        _idle(page)
        page.wait_for_selector("[data-testid='stPlotlyChart'] .bars path", timeout=30_000)
        assert page.locator("[data-testid='stPlotlyChart'] .bars path").count() >= 20  # p_t and q_t bars
        assert page.get_by_text("token t = ").first.is_visible()
        # another group (seed 2): the picker starts again at #0, with the new group's text
        seed = page.get_by_role("spinbutton", name="Seed")
        seed.fill("2")
        seed.press("Enter")
        _idle(page)
        page.get_by_role("button", name="Sample group").click()
        _idle(page)
        # the old group's legend and picker stay on the page while the new group is sampled (the work runs in the
        # model's queue, and the page is idle between its polls): wait for the picker to change
        picker = page.get_by_role("combobox", name="Response")
        deadline = time.monotonic() + 120
        while picker.input_value() in (first_label, "") or picker.input_value().startswith("#2 —"):
            assert time.monotonic() < deadline, picker.input_value()
            page.wait_for_timeout(500)
        page.wait_for_selector(".mrtpo .legend", state="visible", timeout=90_000)
        label = picker.input_value()
        assert label.startswith("#0 —") and label != first_label
        assert page.locator("[data-testid='stException']").count() == 0
        assert page.locator("[data-testid='stAlertContentError']").count() == 0
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=f"{shots}/e2e_scale_topk.png", full_page=True)
