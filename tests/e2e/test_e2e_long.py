"""Long groups in a real headless Chromium (8 responses × 2,000 tokens × 3 rewards, synthetic: no model needed for
the numbers): the exported page (overview, a click on a hottest span draws that response × reward in full, exactly as
the library draws it, hover shows a token's numbers) and the run viewer on such a credit log (overview, a hottest
span selected in the table opens its reward in full, hover).  Each test prints the times it measured (no timing is
asserted: they depend on the machine).  Screenshots go to ``$MRTPO_SHOTS`` when set, else to a temporary folder."""
from __future__ import annotations

import html
import os
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.test_e2e_browser import (  # (skipped there without chromium)
    CHROMIUM,
    CHROMIUM_ARGS,
    IDLE,
    chromium_page,
    pytestmark,  # noqa: F401 - the same skip
    running_app,
)

CELLS = """(sel) => [...document.querySelectorAll(sel)].map(r => [...r.querySelectorAll('.tok')].map(
    t => [t.style.background, t.getAttribute('data-i'), t.getAttribute('data-tip'), t.textContent]))"""


def _shots() -> Path:
    p = Path(os.environ.get("MRTPO_SHOTS") or Path(tempfile.gettempdir()) / "mrtpo-shots")
    p.mkdir(parents=True, exist_ok=True)
    return p


def _python_cells(body: str) -> list[list[tuple[str, str, str, str]]]:
    """What the library's full view draws, per row: (background, data-i, data-tip, text) of each cell (parsed the
    way a browser reads the markup)."""
    import re

    rows = re.findall(r'<div class="row"><div class="lab">.*?</div><div class="toks">(.*?)</div></div>', body, re.S)
    tok = re.compile(r'<span class="tok[^"]*" style="background:([^"]*)" data-i="(\d+)" data-tip="([^"]*)">'
                     r'((?:[^<]|<span class="nl">↵</span><br>)*)</span>')
    return [[(bg, i, html.unescape(tip), html.unescape(re.sub(r"<[^>]+>", "", text))) for bg, i, tip, text in
             tok.findall(r)] for r in rows]


def _rgba(bg: str) -> tuple[int, int, int, float]:
    """A background as (r, g, b, alpha): render's ``rgba(33,102,172,0.850)`` or the browser's ``rgba(33, 102, 172,
    0.85)``; transparent is alpha 0."""
    if bg in ("transparent", "rgba(0, 0, 0, 0)"):
        return (0, 0, 0, 0.0)
    parts = bg[bg.index("(") + 1:-1].split(",")
    r, g, b = (int(float(x)) for x in parts[:3])
    return (r, g, b, float(parts[3]) if len(parts) > 3 else 1.0)


def _same_colors(got: list[str], want: list[str]) -> bool:
    """The same colors, alphas within the browser's 8-bit rounding."""
    return len(got) == len(want) and all(
        (a[3] == b[3] == 0) or (a[:3] == b[:3] and abs(a[3] - b[3]) < 0.006)
        for a, b in ((_rgba(x), _rgba(y)) for x, y in zip(got, want)))


def _css_tip(page, cell) -> str:
    """The CSS tooltip (``::after``) a hovered cell shows; hovered again while the app may still be redrawing (a
    hover on an element being replaced shows nothing)."""
    shown = ""
    for _ in range(5):
        page.wait_for_selector(IDLE, timeout=60_000)
        cell.scroll_into_view_if_needed()
        cell.hover()
        page.wait_for_timeout(300)
        shown = page.evaluate("(el) => getComputedStyle(el, '::after').content", cell.element_handle())
        if shown not in ("", "none", "normal"):
            break
    return shown


def test_exported_page_of_a_long_group_in_chromium(tmp_path):
    from bench.views import synthetic_group
    from mrtpo.display import overview as O
    from mrtpo.display import token_view
    from mrtpo.display.page import page_html

    sync_api = pytest.importorskip("playwright.sync_api")
    group, replay = synthetic_group(8, 2000, 3)
    v = token_view(group, replay, "mrtpo", 0.5)
    page_file = tmp_path / "long.html"
    page_file.write_text(page_html(v, group, title="long group"), encoding="utf-8")
    size = page_file.stat().st_size
    shots = _shots()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            t0 = time.perf_counter()
            page.goto(page_file.as_uri(), wait_until="load")
            page.locator(".mrtpo .strip").first.wait_for(state="visible")
            t_load = time.perf_counter() - t0
            assert page.locator(".mrtpo .strip").count() == 8 * 3 and page.locator(".mrtpo .row").count() == 0
            page.screenshot(path=str(shots / "e2e_long_export_overview.png"))
            # response 2, reward_1: its second hottest span, clicked
            spans = page.locator("#full-0-2").locator("xpath=preceding-sibling::div[1]").locator(
                '.hs.open[data-k="reward_1"]')
            assert spans.count() == O.HOT_SPANS
            t0 = time.perf_counter()
            spans.nth(1).click()
            page.locator("#full-0-2 .row").first.wait_for(state="visible")
            t_open = time.perf_counter() - t0
            assert "Response 2 × reward_1 in full" in page.locator("#full-0-2 .fullhead").inner_text()
            # the script drew what the library draws: the same rows, cells, colors and tooltips
            want = _python_cells(O.full_html(v, 2, "reward_1"))
            got = page.evaluate(CELLS, "#full-0-2 .row")
            assert len(got) == len(want) == 3  # MRTPO, moved, ρ (no evidence for reward_1: no oracle row)
            for g_row, w_row in zip(got, want):
                assert len(g_row) == len(w_row)
                assert [c[1] for c in g_row] == [c[1] for c in w_row]  # data-i: the cells' first tokens
                assert [c[3].replace("↵", "\n") for c in g_row] == [c[3].replace("↵", "\n") for c in w_row]
                assert _same_colors([c[0] for c in g_row], [c[0] for c in w_row])
                assert [c[2] for c in g_row] == [c[2] for c in w_row]  # every tooltip, digit for digit
            # the clicked span is in view, outlined and numbered
            c = spans.nth(1).get_attribute("data-c")
            badge = page.locator("#full-0-2 .row").first.locator(f'b.rk[data-c="{c}"]')
            assert badge.inner_text() == "2" and badge.is_visible()
            top = badge.bounding_box()["y"]
            assert 0 < top < 1000  # scrolled into the window
            assert page.locator("#full-0-2 .row").first.locator(".tok.hot").count() > 0
            page.screenshot(path=str(shots / "e2e_long_export_full.png"))
            # hover a token: one tooltip with its numbers, inside the window
            cell = page.locator("#full-0-2 .row").first.locator(".tok.hot").first
            cell.hover()
            tip = page.locator(".mrtpo-tip")
            tip.wait_for(state="visible")
            assert "reward reward_1 | JS " in tip.inner_text() and "relevance " in tip.inner_text()
            box = tip.bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 1400
            page.screenshot(path=str(shots / "e2e_long_export_hover.png"))
            # the combined rows, then close
            page.locator('button.open[data-r="5"][data-k="combined"]').click()
            page.locator("#full-0-5 .row").first.wait_for(state="visible")
            assert page.locator("#full-0-5 .row").count() == 1
            page.locator("#full-0-5 button.close").click()
            assert page.locator("#full-0-5 .row").count() == 0
            assert errors == []
        finally:
            browser.close()
    print(f"\nexport {size / 1e6:.2f} MB; load → overview {t_load:.2f} s; click → full view {t_open:.2f} s")


def test_exported_page_says_js_not_computed_in_chromium(tmp_path):
    """A view whose JS no replay computed (a replay-free measure): the script's full view says "JS not computed" in
    every tooltip, digit for digit what the library draws."""
    from bench.views import synthetic_group
    from mrtpo.display import overview as O
    from mrtpo.display import token_view
    from mrtpo.display.page import page_html

    sync_api = pytest.importorskip("playwright.sync_api")
    group, replay = synthetic_group(2, 400, 2)
    for r in replay.responses:
        r.js = {}  # as ktae or entropy give it: no replay ran
    v = token_view(group, replay, "mrtpo", 0.5)
    page_file = tmp_path / "no-js.html"
    page_file.write_text(page_html(v, group), encoding="utf-8")
    want = _python_cells(O.full_html(v, 1, "reward_1"))
    assert want and all("| reward reward_1 | JS not computed | relevance " in c[2] for row in want for c in row)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_file.as_uri(), wait_until="load")
            page.locator('button.open[data-r="1"][data-k="reward_1"]').click()
            page.locator("#full-0-1 .row").first.wait_for(state="visible")
            got = page.evaluate(CELLS, "#full-0-1 .row")
            assert [[c[2] for c in row] for row in got] == [[c[2] for c in row] for row in want]
            assert errors == []
        finally:
            browser.close()


def test_a_page_over_its_budget_opens_its_compact_overviews_in_chromium(tmp_path):
    """A page laid out within a small budget: its first responses open in full from a compact overview, drawn by the
    script exactly as the library draws them; the rest are compact overviews that say where their numbers are."""
    from bench.views import synthetic_group
    from mrtpo.display import overview as O
    from mrtpo.display import page as P
    from mrtpo.display import token_view

    sync_api = pytest.importorskip("playwright.sync_api")
    group, replay = synthetic_group(6, 150, 2)
    v = token_view(group, replay, "mrtpo", 0.5)
    lay = P.page_layout(v, group, budget=160_000)
    assert P.COMPACT_OPEN in lay.levels[0] and P.COMPACT in lay.levels[0]
    i = lay.levels[0].index(P.COMPACT_OPEN)
    page_file = tmp_path / "budget.html"
    page_file.write_text(lay.html, encoding="utf-8")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_file.as_uri(), wait_until="load")
            assert page.locator(".mrtpo .strip").count() == 6 * 2 and page.locator(".mrtpo .row").count() == 0
            assert page.locator("p.why.budget").count() == 1 + lay.levels[0].count(P.COMPACT)
            page.locator(f'button.open[data-r="{i}"][data-k="reward_0"]').click()
            page.locator(f"#full-0-{i} .row").first.wait_for(state="visible")
            want = _python_cells(O.full_html(v, i, "reward_0"))
            got = page.evaluate(CELLS, f"#full-0-{i} .row")
            assert [[c[2] for c in row] for row in got] == [[c[2] for c in row] for row in want]
            assert errors == []
        finally:
            browser.close()


def test_run_viewer_on_a_long_credit_log_in_chromium(tmp_path, monkeypatch):
    from tests.app.long_group import long_credit_log

    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(tmp_path))
    folder, _, _ = long_credit_log(tmp_path / "log")
    shots = _shots()
    with running_app() as (url, _), chromium_page(f"{url}/your-rollouts", height=1200) as page:
        t0 = time.perf_counter()  # (the server is up and warm: from here, reading the log and drawing it)
        page.goto(f"{url}/your-rollouts?log={folder}", wait_until="domcontentloaded")
        page.locator(".mrtpo .strip").first.wait_for(state="visible", timeout=90_000)
        page.locator(".mrtpo.full .row").first.wait_for(state="visible", timeout=90_000)
        page.wait_for_selector(IDLE, timeout=60_000)
        t_first = time.perf_counter() - t0
        assert page.locator(".mrtpo .strip").count() == 3  # the response shown × 3 rewards
        assert page.locator(".mrtpo.full .row").count() == 3  # reward_0: MRTPO, moved, ρ (a log has no evidence)
        assert page.get_by_text("GDPO (uniform)").first.is_visible()
        overview = page.locator(".mrtpo.ov").first
        overview.scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "e2e_long_viewer_overview.png"))
        # the hottest spans' table (the second table): a click on its 6th row (reward_1's first span)
        table = page.locator("[data-testid='stDataFrame']").nth(1)
        table.scroll_into_view_if_needed()
        box = table.bounding_box()
        t0 = time.perf_counter()
        page.mouse.click(box["x"] + 12, box["y"] + 35 + 5 * 35 + 17)
        # every full view on the page is reward_1's: Streamlit keeps the rerun's stale elements (reward_0's full view)
        # in the page for a moment after the new ones appear, so "some" would pick the stale one
        # in one check, so that no rerun's intermediate page passes it: the script idle, and reward_1's full view drawn
        page.wait_for_function(
            "idle => { const b = [...document.querySelectorAll('.mrtpo.full .reward b')];"
            " return document.querySelector(idle) !== null && b.length > 0"
            " && b.every(e => e.textContent === 'reward_1')"
            " && document.querySelectorAll('.mrtpo.full .row').length === 3; }", arg=IDLE, timeout=60_000)
        t_open = time.perf_counter() - t0
        full = page.locator(".mrtpo.full").filter(has=page.locator(".reward b", has_text="reward_1")).first
        assert full.locator(".row").count() == 3
        # hover a hottest span's token: its numbers in the tooltip (the CSS rule over data-tip)
        shown = _css_tip(page, full.locator(".tok.hot").first)
        assert "reward reward_1 | relevance " in shown and "MRTPO advantage " in shown  # (a log has no JS)
        page.screenshot(path=str(shots / "e2e_long_viewer_full.png"))
        # a token at the right edge of a line: the tooltip stays in the window (anchored, flipped where supported)
        xs = page.evaluate("() => [...document.querySelectorAll('.mrtpo.full .row .tok')].slice(0, 300).map("
                           "t => t.getBoundingClientRect().right)")
        edge = full.locator(".row").first.locator(".tok").nth(max(range(len(xs)), key=xs.__getitem__))
        edge.scroll_into_view_if_needed()
        edge.hover()
        page.wait_for_timeout(300)
        page.screenshot(path=str(shots / "e2e_long_viewer_hover_edge.png"))
        assert page.locator("[data-testid='stException']").count() == 0
        assert page.locator("[data-testid='stAlertContentError']").count() == 0
    print(f"\nrun viewer: link → log read, overview and full view drawn {t_first:.2f} s; table click → another "
          f"reward in full {t_open:.2f} s")
