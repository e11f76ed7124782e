"""Pages bounded by their total size (mrtpo.display.page.layout): a group of many medium responses (each under the
long threshold, so each was drawn in full) and several such groups stay within PAGE_BUDGET, with an overview of every
response, the first ones openable in full on the page and a note saying where the others' numbers are; a page within
the budget is exactly what it was (short responses in full, long ones overview first)."""
from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest

from mrtpo.display import overview as O
from mrtpo.display import page as P
from mrtpo.display import render, token_view

H3 = re.compile(r"<h3>(Response .*?)</h3>")
STRIP = '<div class="strip">'


def _view(G, T, K, seed=0):
    from bench.views import synthetic_group

    group, replay = synthetic_group(G, T, K, seed=seed)
    return group, token_view(group, replay, "mrtpo", 0.5)


def _data(page: str, g: int) -> dict:
    block = re.search(rf'<script type="application/json" id="mrtpo-data-{g}">(.*?)</script>', page, re.S)
    return json.loads(block.group(1)) if block else {}


def test_explain_input_of_64_x_290_tokens_x_3_rewards_stays_within_the_budget():
    group, v = _view(64, 290, 3)
    assert not O.is_long(v)  # every response under the threshold: each alone would be drawn in full
    assert len(render.response_html(v, 0, group=group).encode()) * 64 > 5 * P.PAGE_BUDGET  # drawn so: 50+ MB
    calls = []
    lay = P.page_layout(v, group, rest="every number is in out.json", progress=lambda d, t: calls.append((d, t)))
    page = lay.html
    assert len(page.encode()) <= P.PAGE_BUDGET == 10_000_000
    # an overview of every response, in order, each with its numbers to open it in full on the page
    assert H3.findall(page) == [f"Response {i} — advantage {v.final[i]:+.3f}" for i in range(64)]
    assert page.count(STRIP) == 64 * 3 and page.count('class="mrtpo fullbox"') == 64
    assert sorted(_data(page, 0), key=int) == [str(i) for i in range(64)]
    assert lay.levels == [[P.OPEN] * 64] and lay.tops == [[P.FULL] * 64] and not lay.complete
    assert '<div class="row">' not in page.split("<script")[0]  # no response drawn in full in the markup
    note = ("This page holds at most 10 MB, so not every response is drawn in full: of 64 responses, 64 open in full "
            "from their overview; for the others, every number is in out.json.")
    assert note in html.unescape(page)
    assert calls[-1] == (4 * 64, 4 * 64) and [d for d, _ in calls] == sorted(d for d, _ in calls)  # progress


def test_rollouts_of_4_groups_x_64_x_280_stay_within_the_budget_with_an_overview_of_every_response():
    from mrtpo.integrations import rollout_explain as rx
    from mrtpo.integrations.rollouts import RolloutGroup, RolloutRow

    items = []
    for n in range(4):
        group, v = _view(64, 280, 3, seed=n)
        rows = [RolloutRow("r.jsonl", 64 * n + i + 1, 1, "p", s.text, {}, {}) for i, s in enumerate(group.samples)]
        items.append(rx.ExplainedGroup(RolloutGroup(1, "p", rows), group, v))
    lay = rx.page_layout(items, rest="every number is in out.jsonl, one line per group")
    page = lay.html
    assert len(page.encode()) <= P.PAGE_BUDGET
    flat = [lv for g in lay.levels for lv in g]
    assert len(flat) == 256 and flat == sorted(flat, reverse=True)  # the first responses drawn the most
    assert set(flat) == {P.COMPACT_OPEN, P.COMPACT}  # every one an overview; the first ones openable in full
    opened = flat.count(P.COMPACT_OPEN)
    assert 50 < opened < 256
    assert page.count(STRIP) == 256 * 3  # an overview (3 strips) of every response of every group
    assert len(H3.findall(page)) == 256 and H3.findall(page)[64].startswith("Response 0 (file row 65) — advantage")
    assert sum(len(_data(page, g)) for g in range(4)) == opened == page.count('class="mrtpo fullbox"')
    why = "Not drawn in full here (this page holds at most 10 MB): every number is in out.jsonl, one line per group."
    assert html.unescape(page).count(why) == 256 - opened
    assert f"of 256 responses, {opened} open in full from a compact overview, {256 - opened} as a compact " \
           "overview only" in page
    compact = re.findall(r'<div class="strip">(.*?)</div>', page)[-1]
    assert compact.count("<i ") == P.COMPACT_BINS  # a compact overview's strip


def test_a_page_within_the_budget_is_what_it_was():
    """Short responses drawn in full, long ones overview first, as the page drew them before it had a budget (the
    page rebuilt here from the view's parts)."""
    group, v = _view(3, 120, 2)
    want = P.document("t", [
        "<h2>t</h2>", f"<p><b>Example</b> {group.example.id}</p><pre style='white-space:pre-wrap;background:#f6f6f6;"
        f"padding:6px'>{html.escape(group.prompt)}</pre>",
        "<p>Method <b>mrtpo</b>, β = 0.5, relevance measure <b>js</b>; colors per response (limits in each "
        "legend).</p>",
        render.rewards_table(v, group), render.faithfulness_html(v),
        *[f"<h3>Response {i} — advantage {v.final[i]:+.3f}</h3>{render.response_html(v, i, group=group)}"
          for i in range(3)]])
    lay = P.page_layout(v, group, title="t")
    assert lay.html == want and lay.complete and lay.levels == [[P.FULL] * 3]
    assert "<script" not in want and "holds at most" not in want
    group, v = _view(2, 400, 2)  # long: overview first, opened by the script from its numbers
    lay = P.page_layout(v, group)
    assert lay.complete and lay.levels == [[P.OPEN] * 2] and "holds at most" not in lay.html
    assert _data(lay.html, 0) == json.loads(json.dumps({str(i): P.response_data(v, i, group=group) for i in range(2)}))
    for i in range(2):
        assert f"<h3>Response {i} — advantage {v.final[i]:+.3f}</h3>" + O.overview_html(
            v, i, link=f'data-g="0" data-r="{i}"') + f'<div class="mrtpo fullbox" id="full-0-{i}"></div>' in lay.html


@pytest.mark.parametrize("budget", [300_000, 120_000, 60_000])
def test_every_budget_is_kept_and_filled_in_order(budget):
    group, v = _view(6, 150, 2)
    lay = P.page_layout(v, group, budget=budget)
    assert len(lay.html.encode()) <= budget
    flat = lay.levels[0]
    assert flat == sorted(flat, reverse=True) and not lay.complete
    assert lay.html.count("<h3>Response ") == 6  # every response named, whatever the budget
    if budget >= 120_000:
        assert flat[-1] >= P.COMPACT and lay.html.count(STRIP) == 6 * 2
    assert np.all(np.array(flat) <= P.FULL)
