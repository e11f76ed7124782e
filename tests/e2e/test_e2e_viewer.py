"""The run viewer in a real headless Chromium: Your rollouts opened on a credit log (``?log=PATH``) that grows between
two looks; with Follow on, the new step shows without a reload.  Screenshots go to ``$MRTPO_SHOTS`` when set."""
from __future__ import annotations

import os
from pathlib import Path

from tests.creditlog.test_credit_log import _credit, _rows, _writer
from tests.e2e.test_e2e_browser import (  # (skipped there without chromium)
    IDLE,
    chromium_page,
    pytestmark,  # noqa: F401 - the same skip
    running_app,
)

NEW = ("ab, c", "xyz", "fresh words here", "no")  # response 2: the first shown (advantage ≠ 0)


def test_viewer_follows_a_growing_log_in_chromium(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(tmp_path))  # the app reads logs under its root only
    R, mask, credit = _credit()
    w = _writer(tmp_path)
    w.write_step(1, _rows(1, R, mask, credit))
    shots = os.environ.get("MRTPO_SHOTS")
    with running_app() as (url, _), chromium_page(f"{url}/your-rollouts?log={tmp_path / 'log'}") as page:
        page.get_by_text("1 step", exact=False).first.wait_for(state="visible", timeout=60_000)
        page.wait_for_selector(".mrtpo .legend", state="visible", timeout=60_000)
        assert page.get_by_text("GDPO (uniform)").first.is_visible()
        # the curves' chart comes before the heatmaps in the page, but Plotly draws it once its script has loaded
        # (lazily, in the browser): wait for it rather than look once
        page.locator("[data-testid='stPlotlyChart']").first.wait_for(state="visible", timeout=30_000)
        first = page.locator(".mrtpo .toks").first.inner_text()
        assert first == "hi!!"  # response 2 of step 1: the first with a nonzero advantage
        # the run writes step 2: Follow (on by default) shows it without a reload, the picker on the new step
        w.write_step(2, _rows(2, R, mask, credit, texts=NEW))
        page.get_by_text("2 steps", exact=False).first.wait_for(state="visible", timeout=30_000)
        page.wait_for_function("() => [...document.querySelectorAll('.mrtpo .toks')].some("
                               "e => e.innerText.includes('fresh words here'))", timeout=30_000)
        page.wait_for_selector(IDLE, timeout=60_000)
        assert page.get_by_role("combobox", name="Step").input_value() == "2"
        # a click on the table's first row (its selection cell; header and rows 35 px high) shows that response
        table = page.locator("[data-testid='stDataFrame']").first
        table.scroll_into_view_if_needed()
        box = table.bounding_box()
        page.mouse.click(box["x"] + 12, box["y"] + 35 + 17)
        page.wait_for_function("() => [...document.querySelectorAll('.mrtpo .toks')].some("
                               "e => e.innerText === 'ab, c')", timeout=30_000)
        assert page.get_by_role("combobox", name="Response (or select a row above)").input_value().startswith(
            "group 0 · #0")
        assert page.locator("[data-testid='stException']").count() == 0
        assert page.locator("[data-testid='stAlertContentError']").count() == 0
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=f"{shots}/e2e_viewer.png", full_page=True)
