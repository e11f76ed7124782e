"""Explore's "Compare measures" in a real headless Chromium (issue 36, item 3): tea-note, seed 1 (no_comma varies),
the toggle draws one row per measure, every row's label with its AUROC and seconds, the cost table beside it.
Screenshots go to ``$MRTPO_SHOTS`` when set (skipped without Debian's chromium or Playwright)."""
from __future__ import annotations

import os
from pathlib import Path

from tests.e2e.test_e2e_browser import _idle, chromium_page, server  # noqa: F401 (server: a fixture)


def test_compare_measures_in_chromium(server):  # noqa: F811
    shots = os.environ.get("MRTPO_SHOTS")
    with chromium_page(f"{server}/?family=instructions&example=tea-note", height=1400) as page:
        seed = page.get_by_role("spinbutton", name="Seed")  # (the box; its help is a button)
        seed.fill("1")
        seed.press("Enter")
        _idle(page)
        page.get_by_role("button", name="Sample group").click()
        page.wait_for_selector(".mrtpo .legend", state="visible", timeout=90_000)
        _idle(page)
        page.get_by_text("Compare measures for this response").click()
        page.get_by_text("of each measure on one color scale").wait_for(state="visible", timeout=120_000)
        _idle(page)
        view = page.locator(".mrtpo", has_text="of each measure on one color scale").first
        labels = view.locator(".lab")
        assert labels.count() == 7  # uniform, entropy, KTAE, attention, js, js-support, the oracle
        assert all("AUROC" in labels.nth(j).inner_text() and " s (" in labels.nth(j).inner_text() for j in range(7))
        assert view.locator(".tok:not(:empty)").first.is_visible()
        assert page.get_by_text("Seconds: what each measure costs for this group").first.is_visible()
        assert page.locator("[data-testid='stException']").count() == 0
        assert page.locator("[data-testid='stAlertContentError']").count() == 0
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            view.scroll_into_view_if_needed()
            page.screenshot(path=f"{shots}/e2e_compare.png", full_page=True)
            view.screenshot(path=f"{shots}/e2e_compare_rows.png")
