"""mrtpo.render: color limits per response / shared by the group (hand-worked), the "moved by MRTPO" row, the side
by side pairs, and the exported page's reasons and verifier information (escaped)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from mrtpo.display import TokenView, render, stored_step_view
from mrtpo.display.page import page_html
from mrtpo.groups import ScoredGroup
from mrtpo.tasks.base import Example

LEGEND = re.compile(r"advantage <span[^>]*></span> −([0-9.e+-]+) .*?moved <span[^>]*></span> ±([0-9.e+-]+)"
                    r".*?relevance <span[^>]*></span> 0 … ([0-9.e+-]+)", re.S)
ROW = re.compile(r'<div class="row"><div class="lab">(.*?)</div><div class="toks">(.*?)</div></div>', re.S)
BG = re.compile(r'<span class="tok" style="background:([^"]*)"')


def _view() -> TokenView:
    """Two responses, two rewards a and b, two tokens each (numbers chosen by hand, β = 1)."""
    a = np.array
    toks = [[{"text": "x", "start": 0, "end": 1}, {"text": "y", "start": 1, "end": 2}]] * 2
    return TokenView(
        method="mrtpo", beta=1.0, reward_names=["a", "b"], rewards=a([[1.0, 0.0], [0.0, 1.0]]),
        per_reward=a([[0.5, -1.0], [-0.5, 1.0]]), final=a([-0.3, 0.3]), tokens=toks, texts=["xy", "xy"],
        relevance=[{"a": a([0.4, 1.6]), "b": a([1.5, 0.5])}, {"a": a([1.5, 0.5]), "b": a([2.0, 0.0])}],
        js=[{"a": a([0.1, 0.4]), "b": a([0.3, 0.1])}, {"a": a([0.3, 0.1]), "b": a([0.2, 0.0])}],
        token_adv_per_reward=[{"a": a([0.2, 0.8]), "b": a([-1.5, -0.5])},
                              {"a": a([-0.25, -0.75]), "b": a([2.0, 0.0])}],
        token_adv=[a([-1.2, 0.6]), a([1.0, -0.4])])


def test_limits_per_response_and_shared_by_hand():
    v = _view()
    # response 0: |adv| over 0.5, 1.0 (uniform), 0.2, 0.8, 1.5, 0.5 (token rows), 0.3, 1.2, 0.6 (combined) → 1.5;
    # moved: a: 0.2 − 0.5, 0.8 − 0.5 = ∓0.3; b: −1.5 + 1, −0.5 + 1 = ∓0.5 → 0.5; ρ max 1.6
    assert render.limits(v, "response", 0) == render.Limits(1.5, 0.5, 1.6)
    # response 1: adv max(0.5, 1, 0.25, 0.75, 2.0, 0, 0.3, 1.0, 0.4) = 2; moved a ±0.25, b: 2 − 1, 0 − 1 → 1; ρ 2
    assert render.limits(v, "response", 1) == render.Limits(2.0, 1.0, 2.0)
    assert render.limits(v, "group") == render.Limits(2.0, 1.0, 2.0)
    # only reward a's rows (and the combined ones): adv max(0.5, 0.2, 0.8, 0.3, 1.2, 0.6) = 1.2, moved 0.3, ρ 1.6
    assert render.limits(v, "response", 0, rewards=["a"]) == render.Limits(1.2, pytest.approx(0.3), 1.6)
    assert render.scales(v) == (2.0, 2.0)
    np.testing.assert_allclose(v.moved(0, "b"), [-0.5, 0.5])
    with pytest.raises(ValueError, match="scale must be one of"):
        render.limits(v, "page", 0)


def test_zero_limits_become_one():
    v = _view()
    z = TokenView(method="gdpo", beta=0.0, reward_names=["a"], rewards=np.zeros((1, 1)), per_reward=np.zeros((1, 1)),
                  final=np.zeros(1), tokens=v.tokens[:1], texts=["xy"], relevance=[{"a": np.zeros(2)}],
                  js=[{"a": np.zeros(2)}], token_adv_per_reward=[{"a": np.zeros(2)}], token_adv=[np.zeros(2)])
    assert render.limits(z, "response", 0) == render.Limits(1.0, 1.0, 1.0)


def test_response_html_scale_sets_the_colors_and_the_legend():
    v = _view()
    own, shared = render.response_html(v, 0, scale="response"), render.response_html(v, 0, scale="group")
    assert LEGEND.search(own).groups() == ("1.5", "0.5", "1.6")
    assert LEGEND.search(shared).groups() == ("2", "1", "2")
    assert "colors scaled to this response" in own and "colors shared by the group" in shared
    # b's token row (the 6th): −1.5 on the ±1.5 scale is full red (alpha 0.85); on the shared ±2 scale 0.75 · 0.85
    (lab, own_b), (_, shared_b) = ROW.findall(own)[5], ROW.findall(shared)[5]
    assert lab == "mrtpo β=1"
    assert BG.findall(own_b)[0] == "rgba(178,24,43,0.850)" and BG.findall(shared_b)[0] == "rgba(178,24,43,0.637)"


def test_moved_row_and_pairs():
    v = _view()
    body = render.response_html(v, 0, scale="response")
    labels = [lab for lab, _ in ROW.findall(body)]
    assert labels == ["GDPO (uniform) +0.500", "mrtpo β=1", "moved by MRTPO: A − Â (±0.5)", "relevance ρ",
                      "GDPO (uniform) −1.000".replace("−", "-"), "mrtpo β=1", "moved by MRTPO: A − Â (±0.5)",
                      "relevance ρ", "GDPO (uniform) -0.300", "mrtpo β=1"]
    moved_a = BG.findall(ROW.findall(body)[2][1])  # a moved −0.3, +0.3 on ±0.5: red, blue at 0.6 · 0.85
    assert moved_a == ["rgba(178,24,43,0.510)", "rgba(33,102,172,0.510)"]
    # side by side: GDPO | MRTPO and moved | ρ in one grid each, per reward, and the combined pair
    assert body.count('<div class="pair">') == 5
    # a response-level method has no moved row
    g = TokenView(**{**v.__dict__, "method": "gdpo"})
    assert "moved by" not in render.response_html(g, 0)


def test_moved_sums_to_zero_over_each_response():
    """The reallocation preserves each reward's total (METHOD.md: Σ_t A_ikt = T_i Â_ik), so what MRTPO moved sums
    to 0 over every response's tokens — also under the scale floor, for GD²PO's dropped responses and DARA."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(8):  # two groups of 4, three rewards, ragged lengths
        T = int(rng.integers(3, 9))
        rel = {k: list(T * (x := rng.random(T)) / x.sum()) for k in ("a", "b", "c")}
        rows.append({"rewards": {"a": float(i % 2), "b": float(i % 3 == 0), "c": float(rng.random() > 0.5)},
                     "token_ids": list(range(T)), "tokens": ["t"] * T, "text": "t" * T, "ended": False,
                     "relevance": rel})
    for method in ("mrtpo", "mrtpo+dara", "mrtpo+gd2po", "mrtpo+grpo"):
        v = stored_step_view(rows, method, 4, beta_s=0.7)
        some = 0.0
        for i in range(8):
            for k in v.reward_names:
                m = v.moved(i, k)
                assert abs(m.sum()) < 1e-5, (method, i, k)
                some = max(some, float(np.abs(m).max()))
        assert some > 0.01  # something did move


def _group(view: TokenView, reasons, infos) -> ScoredGroup:
    return ScoredGroup(Example("ex<1>", "Say <b>hi</b>"), "Say <b>hi</b>", [], view.reward_names, view.rewards,
                       reasons, infos)


def test_page_html_carries_reasons_and_verifier_information_escaped():
    v = _view()
    g = _group(v, [{"a": "ok", "b": "found '<script>alert(1)</script>'"}, {"a": "no & yes", "b": ""}],
               [{"a": "Rule <a>", "b": "Return `x` & <y>"}, {"a": "Rule <a>", "b": "Return `x` & <y>"}])
    page = page_html(v, g, title="t <i>", scale="group")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("Return `x` &amp; &lt;y&gt;") == 2 and page.count("Rule &lt;a&gt;") == 2  # per response
    assert "— no &amp; yes" in page and "verifier information v_k" in page
    assert "ex&lt;1&gt;" in page and "<title>t &lt;i&gt;</title>" in page
    assert [m.groups() for m in LEGEND.finditer(page)] == [("2", "1", "2")] * 2  # shared: one scale
    per = page_html(v, g, scale="response")
    assert [m.groups() for m in LEGEND.finditer(per)] == [("1.5", "0.5", "1.6"), ("2", "1", "2")]
    assert "colors per response" in per
    with pytest.raises(ValueError):
        page_html(v, g, scale="bad")
