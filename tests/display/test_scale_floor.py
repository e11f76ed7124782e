"""A group whose two responses trade two rewards off exactly: GDPO's per-reward shares Â_ik / s are over a batch
scale s that fell to ε, so they read ±7,070; every view that shows them says why (the scale floor, METHOD.md step 5),
and a group whose scale is at least the floor shows no such note."""
from __future__ import annotations

import html
import re

import numpy as np
import pytest

from mrtpo.display import notes as N
from mrtpo.display import overview as O
from mrtpo.display import page as P
from mrtpo.display import render, token_view

WHY = "below the floor 1: the reward sums s normalizes vary little"


def _group(rewards):
    from bench.views import synthetic_group

    g, rep = synthetic_group(len(rewards), 40, 2)
    g.rewards = np.array(rewards, dtype=float)
    return g, rep


def _notes(body: str) -> list[str]:
    return [html.unescape(n) for n in re.findall(r'class="why floor">(.*?)</(?:div|p)>', body)]


def test_a_trade_off_says_why_its_shares_are_huge():
    g, rep = _group([[1, 0], [0, 1]])
    v = token_view(g, rep, "mrtpo", 0.5)
    # by hand: each reward's z-score ±0.5 / (0.70711 + 1e-4) = ±0.70700; the sums are 0 and 0, so s = 0 + 1e-4
    z = 0.5 / (0.5 ** 0.5 + 1e-4)
    np.testing.assert_allclose(v.per_reward, [[z / 1e-4, -z / 1e-4], [-z / 1e-4, z / 1e-4]], rtol=1e-4)
    assert v.per_reward[0, 0] == pytest.approx(7070.07, abs=0.05) and v.final.tolist() == [0.0, 0.0]
    note = ("Each reward's share Â_ik / s is over the scale s = 0.0001, below the floor 1: the reward sums s "
            "normalizes vary little (rewards that trade off cancel in them), so every share is multiplied by 10,000; "
            "what MRTPO moves between tokens is divided by max(s, 1) = 1 instead (METHOD.md step 5, the scale floor).")
    assert N.floor_note(v, 0) == N.floor_note(v, 1) == note
    for body in (render.response_html(v, 0, group=g), O.overview_html(v, 1), O.full_html(v, 0, "reward_0"),
                 O.full_html(v, 0, O.COMBINED), P.response_data(v, 1)["legend"]):
        assert _notes(body) == [note]
    assert _notes(render.rewards_table(v)) == ["Â of every response: e" + note[1:]]
    page = P.page_html(v, g)
    assert "+7070.068" in page and note in html.unescape(page)
    # a response-level method moves nothing: the note says only why the shares are large
    assert N.floor_note(token_view(g, rep, "gdpo", 0.5), 0).endswith("multiplied by 10,000 (METHOD.md step 5, "
                                                                         "the scale floor).")


def test_a_scale_below_the_floor_but_not_collapsed_and_one_above_it():
    R = np.array([[0, 1], [1, 0], [1, 1], [0, 1]], dtype=float)
    g, rep = _group(R)
    v = token_view(g, rep, "mrtpo", 0.5)
    z = (R - R.mean(0)) / (R.std(0, ddof=1) + 1e-4)  # by hand: GDPO's z-scores, their sums' Bessel std + ε
    s = z.sum(1).std(ddof=1) + 1e-4
    assert s == pytest.approx(0.9193, abs=1e-4) and v.divisor == pytest.approx([s] * 4, rel=1e-5)
    np.testing.assert_allclose(v.per_reward, z / s, rtol=1e-4)
    assert "s = 0.919, below the floor 1" in N.floor_note(v, 2) and "multiplied by 1.1;" in N.floor_note(v, 2)
    g, rep = _group([[1, 1], [0, 0], [1, 0], [0, 1]])  # sums 2z, −2z, 0, 0: s = 2z·sqrt(2/3) + ε ≥ 1
    v = token_view(g, rep, "mrtpo", 0.5)
    assert v.divisor[0] > 1 and not any(N.floor_note(v, i) for i in range(4))
    assert _notes(P.page_html(v, g)) == [] and "floor" not in render.rewards_table(v)
