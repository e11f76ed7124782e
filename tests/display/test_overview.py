"""mrtpo.display.overview and the export (mrtpo.display.page): hottest spans on hand-made ρ, the strips' marks, GDPO's
uniform row collapsed to a number, short responses still in full, and the size of the export of a synthetic group of
8 responses × 2,000 tokens × 3 rewards."""
from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest

from mrtpo.display import TokenView, render, token_view
from mrtpo.display import overview as O
from mrtpo.display import page as P
from mrtpo.display.page import page_html

STRIP = re.compile(r'<div class="strip">(.*?)</div>', re.S)
MARK = re.compile(r'<i style="background:([^"]*)" data-tip="([^"]*)"></i>')
ROW = re.compile(r'<div class="row"><div class="lab">(.*?)</div><div class="toks">(.*?)</div></div>', re.S)
TOK = re.compile(r'<span class="tok[^"]*" style="background:([^"]*)" data-i="(\d+)" data-tip="([^"]*)">'
                 r'((?:[^<]|<span class="nl">↵</span><br>)*)</span>')


def hand_view(rho: np.ndarray, uni: float = 0.5, beta: float = 1.0, method: str = "mrtpo") -> TokenView:
    """One response of len(ρ) one-character tokens "a", "b", … and one reward "r" with uniform share ``uni``; the
    token row A'_t = uni · (1 − β + β ρ_t) (MRTPO's reallocation), so what moved is uni · β (ρ_t − 1)."""
    T = len(rho)
    text = "".join(chr(97 + t % 26) for t in range(T))
    toks = [{"text": text[t], "start": t, "end": t + 1} for t in range(T)]
    a = np.asarray(rho, dtype=float)
    ta = uni * (1 - beta + beta * a) if method.startswith("mrtpo") else np.full(T, uni)
    return TokenView(method=method, beta=beta, reward_names=["r"], rewards=np.array([[1.0]]),
                     per_reward=np.array([[uni]]), final=np.array([uni]), tokens=[toks], texts=[text],
                     relevance=[{"r": a}], js=[{"r": a / 100}], token_adv_per_reward=[{"r": ta}], token_adv=[ta])


def bumps(T: int = 40) -> np.ndarray:
    """ρ over T tokens: 5 on tokens 10–13, 3 on 30–31, the rest equal so that the mean is 1."""
    rho = np.zeros(T)
    rho[10:14], rho[30:32] = 5.0, 3.0
    rest = [t for t in range(T) if rho[t] == 0]
    rho[rest] = (T - rho.sum()) / len(rest)
    assert rho.mean() == pytest.approx(1.0)
    return rho


def test_hottest_spans_by_hand():
    s = [0, 1, 2, -1, 3, 0, 0, -5, 4, 0]
    # up to 3 cells: Σ 4 for [8, 9) and [2, 5) (2 − 1 + 3), the shorter first; then every run with Σ 3 overlaps
    # [2, 5) and the best left is [1, 2) (Σ 1); runs of 0s never count
    assert O.hottest_spans(s, n=5, width=3) == [(8, 9), (2, 5), (1, 2)]
    # one cell each: the positive cells, largest first
    assert O.hottest_spans(s, n=3, width=1) == [(8, 9), (4, 5), (2, 3)]
    # up to 2 cells: [8, 9) (Σ 4; [8, 10) too, but longer), then Σ 3: [4, 5) before [1, 3) (shorter)
    assert O.hottest_spans(s, n=5, width=2) == [(8, 9), (4, 5), (1, 3)]
    assert O.hottest_spans([-1.0, 0.0, -2.0], width=2) == []  # no heat, no span
    assert O.hottest_spans([], width=3) == [] and O.hottest_spans([np.nan, 2.0], width=5) == [(1, 2)]


def test_hot_spans_of_a_hand_made_rho():
    v = hand_view(bumps())
    spans = O.hot_spans(v, 0, "r", n=5, width=12)
    # the bump of 5s, then the 3s; the flat rest (ρ < 1) took credit away: no span there
    assert [(h.rank, h.tokens, h.chars, h.text) for h in spans] == [(1, (10, 14), (10, 14), "klmn"),
                                                                   (2, (30, 32), (30, 32), "ef")]
    assert spans[0].moved == pytest.approx(0.5 * 4 * 4) and spans[0].rho == pytest.approx(5.0)  # Σ 0.5 (5 − 1)
    assert spans[1].moved == pytest.approx(0.5 * 2 * 2) and spans[1].rho == pytest.approx(3.0)
    # a negative advantage moves the other way; the spans where the credit went are the same
    neg = O.hot_spans(hand_view(bumps(), uni=-0.5), 0, "r")
    assert [h.tokens for h in neg] == [(10, 14), (30, 32)] and neg[0].moved == pytest.approx(-8.0)
    # a response-level method moves nothing: the spans come from ρ − 1 itself
    assert [h.tokens for h in O.hot_spans(hand_view(bumps(), method="gdpo"), 0, "r")] == [(10, 14), (30, 32)]
    assert O.hot_spans(hand_view(np.ones(40)), 0, "r") == []  # uniform ρ: nothing hot


def test_strip_bins_and_peaks_by_hand():
    # 10 cells in 4 stretches: edges 0, 2.5, 5, 7.5, 10 rounded half to even
    assert O.strip_bins(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert O.strip_bins(3, 160) == [(0, 1), (1, 2), (2, 3)] and O.strip_bins(0) == []
    vals = [0.1, -0.3, 0.2, 0.0, 0.1, np.nan, -0.4, 0.3, 0.05, 0.0]
    np.testing.assert_allclose(O.peaks(vals, O.strip_bins(10, 4)), [-0.3, 0.2, -0.4, 0.05])


def test_overview_strip_marks_are_the_peaks_on_the_full_views_scale():
    v = hand_view(bumps())
    body = O.overview_html(v, 0)
    marks = MARK.findall(STRIP.search(body).group(1))
    assert len(marks) == 40  # fewer cells than STRIP_BINS: one mark per cell
    lim = render.limits(v, "response", 0)
    moved = v.moved(0, "r")
    assert [bg for bg, _ in marks] == [render.diverging_color(float(x), lim.moved) for x in moved]
    assert marks[10][0] == "rgba(33,102,172,0.850)"  # the 5s moved the most: the strongest blue
    tip = html.unescape(marks[10][1])
    assert tip == "characters 10–11, tokens 10–10 | moved Σ +2.0000 | ρ mean 5.000, max 5.000 | mark (moved) +2.0000"
    # numbered marks under the strip, at the spans' middles; the spans with their text and numbers
    assert re.findall(r'class="mk" style="left:([0-9.]+)%;top:1px">(\d)', body) == [("30.00", "1"), ("77.50", "2")]
    assert "characters 10–14 · moved Σ +8.0000 · ρ mean 5.00" in body
    # GDPO's uniform share is one number (a chip), not a row
    assert 'GDPO (uniform) <span class="chip" style="background:rgba(33,102,172,0.' in body and "+0.500" in body
    assert '<div class="row">' not in body
    # with 200 cells the strip has STRIP_BINS marks, each the peak of its stretch
    long = hand_view(np.concatenate([bumps(100), bumps(100)]))
    marks = MARK.findall(STRIP.search(O.overview_html(long, 0)).group(1))
    assert len(marks) == O.STRIP_BINS


def test_full_view_collapses_the_uniform_row_and_outlines_the_hottest_spans():
    v = hand_view(bumps())
    body = O.full_html(v, 0, "r")
    labels = [html.unescape(lab) for lab, _ in ROW.findall(body)]
    assert labels == ["mrtpo β=1", "moved by MRTPO: A − Â (±2)", "relevance ρ"]  # no "GDPO (uniform)" row
    assert body.count('<span class="tok') == 3 * 40
    assert re.search(r'GDPO \(uniform\) <span class="chip"[^>]*>\+0\.500</span> on every token', body)
    for _, toks in ROW.findall(body):  # the hottest spans: their cells outlined, numbered at their first cell
        hot = [int(i) for i in re.findall(r'<span class="tok hot"[^>]*data-i="(\d+)"', toks)]
        assert hot == [10, 11, 12, 13, 30, 31]
        assert re.findall(r'<b class="rk" data-c="(\d+)">(\d)</b>', toks) == [("10", "1"), ("30", "2")]
    # every number on hover, in the one data-tip (no title per cell)
    bg, i, tip, text = TOK.findall(ROW.findall(body)[0][1])[10]
    assert (i, text) == ("10", "k") and "title=" not in body
    assert html.unescape(tip) == ("'k' | reward r | JS 0.0500 | relevance 5.000 | MRTPO advantage +2.5000 | GDPO "
                                  "advantage +0.5000 | moved +2.0000")
    comb = O.full_html(v, 0, O.COMBINED)
    assert [html.unescape(lab) for lab, _ in ROW.findall(comb)] == ["mrtpo β=1"]


def _synthetic(G=8, T=2000, K=3):
    from bench.views import synthetic_group

    group, replay = synthetic_group(G, T, K)
    return group, token_view(group, replay, "mrtpo", 0.5)


def test_export_of_8_x_2000_x_3_is_under_5_mb_and_holds_every_number_once():
    group, v = _synthetic()
    page = page_html(v, group)
    size = len(page.encode())
    assert size <= 5_000_000, size
    assert page.count('<h3>Response ') == 8 and page.count('class="mrtpo fullbox"') == 8  # all long: overviews
    assert "<script>" in page and "http" not in page.split("<body")[0]  # self-contained, no CDN
    data = json.loads(re.search(r'<script type="application/json" id="mrtpo-data-0">(.*?)</script>', page,
                                re.S).group(1))
    assert sorted(data, key=int) == [str(i) for i in range(8)]
    d = data["3"]
    T = len(v.tokens[3])
    assert d["text"] == [t["text"] for t in v.tokens[3]] and sum(d["n"]) == T  # the cells (split characters)
    assert d["n"] == [len(c) for c in render.token_cells(v.tokens[3])] and max(d["n"]) > 1
    for k in v.reward_names:
        np.testing.assert_allclose(d["rewards"][k]["rho"], v.relevance[3][k], rtol=1e-5)
        np.testing.assert_allclose(d["rewards"][k]["a"], v.token_adv_per_reward[3][k], rtol=1e-5, atol=1e-9)
        assert d["rewards"][k]["hot"] == [list(h.cells) for h in O.hot_spans(v, 3, k)]
    np.testing.assert_allclose(d["comb"], v.token_adv[3], rtol=1e-5, atol=1e-9)
    lim = render.limits(v, "response", 3)
    assert d["lim"] == [lim.adv, lim.moved, lim.rel]
    # the per-token numbers are in the JSON, not in the markup: the page draws no full row of any response
    markup = page.split("<script")[0]
    assert markup.count('<div class="row">') == 0 and markup.count('<span class="tok') < 8 * 3 * 5 * 40


def test_short_responses_stay_in_full_and_the_threshold_is_per_response(monkeypatch):
    v = hand_view(bumps())
    page = page_html(v)
    assert 'class="mrtpo fullbox"' not in page and "<script>" not in page and len(ROW.findall(page)) == 6  # as before
    monkeypatch.setattr(O, "LONG_TOKENS", 39)  # 40 tokens is now long
    page = page_html(v)
    assert 'id="full-0-0"' in page and "<script>" in page and len(ROW.findall(page.split("<script")[0])) == 0
    assert O.is_long(v) and not O.is_long(hand_view(bumps(39)))


def cell_text(raw: str) -> str:
    """The characters a drawn cell shows (a line break is drawn as ↵ and a <br>)."""
    return html.unescape(raw.replace('<span class="nl">↵</span><br>', "\n"))


def test_full_view_of_a_split_character_draws_it_once():
    _, v = _synthetic(G=2, T=400, K=2)
    k = v.reward_names[0]
    groups = render.token_cells(v.tokens[0])
    assert any(len(c) > 1 for c in groups)
    lim = render.limits(v, "response", 0)
    moved = v.moved(0, k)
    rows = ROW.findall(O.full_html(v, 0, k))
    assert len(rows) == 4  # MRTPO, moved, ρ, the oracle's ρ (the first reward has evidence)
    for _, toks in rows:
        cells = TOK.findall(toks)
        assert [int(c[1]) for c in cells] == [g[0] for g in groups]
        assert [cell_text(c[3]) for c in cells] == ["".join(v.tokens[0][t]["text"] for t in g) for g in groups]
    # a split character's cell: what moved summed over its tokens, its tooltip listing each token
    n = next(n for n, g in enumerate(groups) if len(g) > 1)
    bg, _, tip, _ = TOK.findall(rows[1][1])[n]
    assert bg == render.diverging_color(float(sum(moved[t] for t in groups[n])), lim.moved)
    assert html.unescape(tip).count("\ntoken ") == len(groups[n])


def test_a_reward_not_replayed_is_one_line():
    from bench.views import synthetic_group

    group, replay = synthetic_group(2, 400, 3, constant=True)
    v = token_view(group, replay, "mrtpo", 0.5)
    assert v.skipped == ["reward_2"]
    assert "reward_2</b> = 1" in O.overview_html(v, 0) and "not replayed" in O.overview_html(v, 0)
    assert "not replayed" in O.full_html(v, 0, "reward_2") and "<div class=\"row\">" not in O.full_html(v, 0,
                                                                                                       "reward_2")
    d = P.response_data(v, 0)
    assert d["rewards"]["reward_2"]["skipped"] and "a" not in d["rewards"]["reward_2"]
