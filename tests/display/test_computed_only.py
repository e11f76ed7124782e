"""Numbers never computed are never reported: for every relevance measure, on a group with one reward that varies
(replayed) and one constant in the group (skipped), the JSON of the view holds the JS distance only where a replay
computed it and ρ only where a measure computed it (as ``relevance`` writes them), and the tooltips say "JS not
computed" where there is none, never "JS 0.0000"."""
from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest

from mrtpo.core.measures import ORACLE, measure_names, needs_replay
from mrtpo.display import overview as O
from mrtpo.display import page as P
from mrtpo.display import render, token_view, view_to_json

TEXTS = ["Dear cup, green tea, warm.", "hello green cup", "A cup of green tea is warm"]
VARIED, CONSTANT = "punctuation:no_comma", "keywords:existence"


@pytest.fixture(scope="module")
def group(tiny):
    from mrtpo.groups import score_group
    from mrtpo.model import Sample, tokenize_response
    from mrtpo.tasks import get_family

    fam = get_family("instructions")
    g = score_group(fam, fam.example("tea-note"), [Sample(tokenize_response(tiny, t)[0], t) for t in TEXTS])
    assert g.reward_names == [VARIED, CONSTANT]
    assert np.ptp(g.rewards[:, 0]) > 0 and np.ptp(g.rewards[:, 1]) == 0  # replayed, skipped
    return g


def _tips(body: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r'data-tip="([^"]*)"', body)]


@pytest.mark.parametrize("measure", measure_names())
def test_json_and_tooltips_hold_only_computed_numbers(tiny, group, measure):
    from mrtpo.replay import replay_scored
    from mrtpo.templates import Template

    rep = replay_scored(tiny, group, Template(), measure=measure)
    v = token_view(group, rep)
    assert v.skipped == [CONSTANT]
    replayed = needs_replay(measure) or measure == ORACLE  # the oracle is shown beside the replay's JS
    data = json.loads(json.dumps(view_to_json(v, group), allow_nan=False))
    for i, r in enumerate(data["responses"]):
        T = len(r["tokens"])
        assert set(r["js"]) == ({VARIED} if replayed else set())  # the skipped reward has none, nor a replay-free one
        assert set(r["relevance"]) == {VARIED}  # ρ of the skipped reward was never computed (it is 1 by definition)
        if replayed:
            np.testing.assert_allclose(r["js"][VARIED], rep.responses[i].js[VARIED], atol=1e-6)
            assert len(r["js"][VARIED]) == T and max(r["js"][VARIED]) > 0
        np.testing.assert_allclose(r["relevance"][VARIED], rep.responses[i].relevance[VARIED], atol=1e-6)
        # what was computed for the skipped reward: its advantage, 0 on every token
        assert r["token_advantage_per_reward"][CONSTANT] == [0.0] * T
    # the tooltips: the replayed reward's JS where it was computed, "not computed" where not; never a made-up 0
    for i in range(len(TEXTS)):
        tips = [t for t in _tips(render.response_html(v, i)) + _tips(O.full_html(v, i, VARIED))
                if f"reward {VARIED}" in t and "oracle relevance" not in t]  # (the oracle's row has no JS)
        assert tips and not any(f"reward {CONSTANT}" in t for t in _tips(render.response_html(v, i)))
        if replayed:
            js = rep.responses[i].js[VARIED]
            assert all("JS not computed" not in t for t in tips)
            assert tips[0].startswith(f"{v.tokens[i][0]['text']!r} | reward {VARIED} | JS {js[0]:.4f} |")
        else:
            assert all(f"reward {VARIED} | JS not computed | relevance" in t for t in tips)
        d = P.response_data(v, i)  # the page's numbers for its script: null where not computed
        assert (d["rewards"][VARIED]["js"] is None) == (not replayed)
        assert d["rewards"][CONSTANT] == {"skipped": True, "head": d["rewards"][CONSTANT]["head"]}


def test_template_editors_panels_say_not_computed():
    """The Templates page's before / after (one replay computed the JS, the other ran a replay-free measure):
    "not computed", never a mean of 0 or ``JS 0.0000``."""
    from mrtpo.display import panels, relevance_change
    from mrtpo.replay import ResponseRelevance

    b = ResponseRelevance("ab", [1, 2], [(0, 1), (1, 2)], {"a": np.array([0.1, 0.3])}, {"a": np.array([0.5, 1.5])})
    a = ResponseRelevance("ab", [1, 2], [(0, 1), (1, 2)], {}, {"a": np.array([1.5, 0.5])})
    (row,) = relevance_change(b, a, ["a"])
    assert row["mean JS before"] == pytest.approx(0.2) and row["mean JS after"] is None
    tips = _tips(panels.relevance_diff_html(b, a, ["a"]))
    assert tips[0] == "'a' | a | before: JS 0.1000, ρ 0.500 | after: JS not computed, ρ 1.500 | Δρ +1.000"
