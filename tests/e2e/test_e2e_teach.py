"""In a real headless Chromium (tiny model): Teach draws p_t and q_t as bars, and an error about user text shows
that text literally (markdown escaped: ``{prompt.__class__}`` keeps its underscores).

Skipped without Debian's chromium or Playwright, like ``test_e2e_browser.py`` (whose server fixture it uses).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.test_e2e_browser import CHROMIUM, IDLE, chromium_page, server  # noqa: F401 - the fixture

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed")


def _idle(page) -> None:
    page.wait_for_timeout(300)
    page.wait_for_selector(IDLE, timeout=90_000)


def test_teach_distributions_and_literal_error_text(server):  # noqa: F811 - the fixture
    shots = os.environ.get("MRTPO_SHOTS")
    with chromium_page(f"{server}/?family=instructions&example=tea-note", height=3000) as page:
        _idle(page)
        seed = page.get_by_role("spinbutton", name="Seed")  # seed 1: the no-comma reward varies (replayed)
        seed.fill("1")
        seed.press("Enter")
        _idle(page)
        page.get_by_role("button", name="Sample group").click()
        page.wait_for_selector(".mrtpo .legend", state="visible", timeout=90_000)  # (a token may be empty)
        _idle(page)
        page.get_by_role("link", name="Teach").click()
        _idle(page)
        chart = page.locator(".stPlotlyChart").last
        chart.scroll_into_view_if_needed()
        page.wait_for_selector(".stPlotlyChart .bars path", timeout=30_000)
        assert chart.locator(".bars path").count() >= 2 * 10  # p_t and q_t bars for the top-10 union
        assert "p_t = π(·|P_all, y<t)" in chart.inner_text()
        assert page.locator("mark").count() == 1  # P_all with v_k highlighted
        assert page.locator("[data-testid='stException']").count() == 0
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=f"{shots}/e2e_teach.png", full_page=True)
        page.get_by_role("link", name="Templates").click()
        _idle(page)
        box = page.get_by_label("prompt", exact=True)
        box.fill("{prompt.__class__} {verifier_info}")
        box.press("Control+Enter")
        _idle(page)
        page.wait_for_selector("[data-testid='stAlertContentError']", timeout=30_000)  # a loaded machine: wait
        errors = [e.inner_text() for e in page.locator("[data-testid='stAlertContentError']").all()]
        assert any("{prompt.__class__}" in e for e in errors), errors
