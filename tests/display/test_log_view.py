"""A logged group as the run viewer draws it (mrtpo.display.log_view), hand-worked on small rows; the curves built
step by step equal those built at once."""
import math
import re

import numpy as np
import pytest

from mrtpo.creditlog import CreditRow, CreditStep
from mrtpo.display import render
from mrtpo.display.log_view import (
    first_informative,
    group_of,
    has_credit,
    log_view,
    reference,
    series_html,
    step_table,
    token_series,
)
from mrtpo.display.run_stats import add_step, component_curves
from mrtpo.errors import MrtpoError


def _row(index, rewards, adv, tok, rel, final, group=0, text="ab", scale=2.0):
    return CreditRow(step=1, group=group, index=index, prompt="p", completion=text, rewards=rewards,
                     tokens=[text[0], text[1:]], offsets=[(0, 1), (1, len(text))], token_ids=[5, 6],
                     reward_advantages=adv, scale=scale, center=0.0, advantage=final,
                     token_advantages=[final, final], reward_token_advantages=tok, relevance=rel, beta=0.5,
                     reasons={"a": "why a"})


def _group():
    # reward a replayed (ρ logged), reward b constant in the group and not replayed (ρ null)
    return [_row(0, {"a": 1.0, "b": 1.0}, {"a": 0.8, "b": 0.0}, {"a": [0.6, 0.2], "b": [0.0, 0.0]},
                 {"a": [1.5, 0.5], "b": None}, 0.2),
            _row(1, {"a": 0.0, "b": 1.0}, {"a": -0.8, "b": 0.0}, {"a": [-0.1, -0.7], "b": [0.0, 0.0]},
                 {"a": [0.25, 1.75], "b": None}, -0.2)]


def test_log_view_hand_worked():
    rows = _group()
    v, lg = log_view(rows, "mrtpo", "js")
    assert v.reward_names == ["a", "b"] and v.method == "mrtpo" and v.beta == 0.5
    np.testing.assert_allclose(v.rewards, [[1, 1], [0, 1]])
    np.testing.assert_allclose(v.per_reward, [[0.4, 0.0], [-0.4, 0.0]])  # Â / scale = 0.8 / 2
    np.testing.assert_allclose(v.final, [0.2, -0.2])
    np.testing.assert_allclose(v.relevance[1]["a"], [0.25, 1.75])
    np.testing.assert_allclose(v.relevance[0]["b"], [1.0, 1.0])  # null: uniform credit
    np.testing.assert_allclose(v.moved(0, "a"), [0.2, -0.2])  # A' − Â / scale: sums to 0 over the tokens
    assert v.skipped == ["b"] and lg.reasons[0] == {"a": "why a"}
    assert [t["text"] for t in v.tokens[0]] == ["a", "b"]
    body = render.response_html(v, 0, group=lg)
    # a: GDPO | MRTPO, moved | ρ (4 rows of 2 tokens); b: one line, not replayed; combined: 2 rows
    assert body.count('<span class="tok"') == 2 * (4 + 2) and "not replayed" in body and "why a" in body
    # without a method in the meta: mrtpo when something was replayed, and an unknown name falls back too
    assert log_view(rows)[0].method == "mrtpo" and log_view(rows, "ppo?")[0].method == "mrtpo"
    assert has_credit(rows) and not has_credit([CreditRow(1, 0, 0, "p", "c", {"r": 1.0})])
    with pytest.raises(MrtpoError, match="no per-reward token advantages"):
        log_view([CreditRow(1, 0, 0, "p", "c", {"r": 1.0})])


def test_step_table_groups_and_reference():
    rows = _group() + [_row(0, {"a": 0.5}, {"a": 0.0}, {"a": [0.0, 0.0]}, {"a": None}, 0.0, group=1, text="xyz")]
    rows[2].extra["ground_truth"] = "  the answer "
    step = CreditStep(1, "f", rows)
    t = step_table(step)
    assert [(d["group"], d["#"]) for d in t] == [(0, 0), (0, 1), (1, 0)]
    assert t[0]["a"] == 1.0 and t[0]["Â a"] == 0.8 and t[0]["advantage"] == 0.2 and t[0]["tokens"] == 2
    assert math.isnan(t[2]["b"]) and t[2]["reference"] == "the answer" and "reference" not in t[0]
    assert reference(rows[2]) == ("ground_truth", "  the answer ") and reference(rows[0]) is None
    assert group_of(step, 2) == ([rows[2]], 0) and group_of(step, 1) == (rows[:2], 1)
    assert first_informative(step) == 0 and first_informative(CreditStep(1, "f", rows[2:] + rows[:2])) == 1


def test_series_of_a_log_without_credit():
    r = CreditRow(1, 0, 0, "p", "Moon June", {"reward": 1.0}, tokens=["Moon", " June"], logprob=[0.0, math.log(0.25)],
                  kl=[0.1, None], extra={"values": [0.1, -0.4], "token_rewards": [0.0, 1.0], "other": [1, 2]})
    s = {label: vals for label, _, vals in token_series(r)}
    assert list(s) == ["probability p", "KL to the reference", "token reward", "value (critic)"]
    assert s["probability p"] == pytest.approx([1.0, 0.25]) and s["KL to the reference"][0] == 0.1
    assert math.isnan(s["KL to the reference"][1])
    body = series_html(r)
    labels = re.findall(r'<div class="lab">(.*?)</div>', body)
    assert labels == ["probability p (0 … 1)", "KL to the reference (±0.1)", "token reward (±1)",
                      "value (critic) (±0.4)"]
    assert body.count('<span class="tok"') == 8 and "rgba(178,24,43,0.850)" in body  # value −0.4: full red
    assert series_html(CreditRow(1, 0, 0, "p", "c", {"r": 1.0})) == ""  # no tokens
    ids = CreditRow(1, 0, 0, None, None, {"r": 1.0}, token_ids=[7, 8], entropy=[0.5, 1.0])  # prime-rl, no decode
    assert ">⟨7⟩</span>" in series_html(ids) and "entropy (0 … 1)" in series_html(ids)


def test_curves_step_by_step_equal_the_curves_at_once():
    s1 = CreditStep(1, "f", _group())
    s2 = CreditStep(2, "f", [_row(0, {"a": 0.0}, {"a": 0.0}, {"a": [0.0, 0.0]}, {"a": None}, 0.0)])
    c = {}
    add_step(c, s1)
    add_step(c, s2)
    assert c == component_curves([s1, s2])
    assert c["a"]["mean"] == {1: 0.5, 2: 0.0} and c["b"]["constant"] == {1: 1.0}
