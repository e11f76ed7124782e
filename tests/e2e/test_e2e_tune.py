"""Templates → Tune in headless Chromium (the tiny model): sample a group on Explore, open Templates, switch to Tune,
run a small search, see the held-out judgement, the ranking and the two heatmaps side by side, then make the choice
this session's configuration.  Screenshots go to ``$MRTPO_SHOTS`` when set."""
from __future__ import annotations

import os
from pathlib import Path

from tests.e2e.test_e2e_browser import _idle, chromium_page, server  # noqa: F401 - the fixture


def _number(page, label: str, value: int) -> None:
    box = page.get_by_role("spinbutton", name=label)
    box.fill(str(value))
    box.press("Enter")
    _idle(page)


def test_tune_in_chromium(server):  # noqa: F811
    shots = os.environ.get("MRTPO_SHOTS")
    with chromium_page(f"{server}/?family=sql", height=1400) as page:
        _number(page, "Max new tokens", 16)
        page.get_by_role("button", name="Sample group").click()
        page.wait_for_selector(".mrtpo .legend", state="visible", timeout=120_000)
        _idle(page)
        page.get_by_role("link", name="Templates").first.click()
        _idle(page)
        page.get_by_role("radio", name="Tune").click()  # the page's mode
        _idle(page)
        for label, value in (("Tuning examples", 2), ("Held-out examples", 2), ("Group size G", 2),
                             ("Max new tokens", 12)):
            _number(page, label, value)
        page.get_by_role("button", name="Tune", exact=True).last.click()
        page.get_by_text("One group under both configurations").wait_for(timeout=300_000)
        _idle(page)
        assert page.get_by_text("judged on the held-out draw").first.is_visible()
        assert page.get_by_text("The ranking per reward kind").first.is_visible()
        assert page.get_by_text("Today: the family's template").first.is_visible()
        heat = page.locator(".mrtpo .toks")
        assert heat.count() >= 2
        assert page.locator("[data-testid='stException']").count() == 0
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=f"{shots}/e2e_tune.png", full_page=True)
            page.get_by_text("Today: the family's template").first.scroll_into_view_if_needed()
            page.screenshot(path=f"{shots}/e2e_tune_heatmaps.png")
        page.get_by_role("button", name="Use the tuned configuration").click()
        _idle(page)
        page.get_by_text("This is your configuration").wait_for(timeout=60_000)
        if shots:
            page.screenshot(path=f"{shots}/e2e_tune_adopted.png", full_page=True)
