"""The pipeline's seams: relevance as one (N, K, T) tensor, groups built, subset and tabulated in one place."""
import math

import numpy as np
import pytest

from mrtpo.core.advantages import parse_method
from mrtpo.core.credit import relevance_tensor
from mrtpo.display import group_table, relevance_change, token_view
from mrtpo.errors import MrtpoError
from mrtpo.groups import ScoredGroup
from mrtpo.model import Sample
from mrtpo.replay import ReplayResult, ResponseRelevance
from mrtpo.tasks.base import Example


def test_relevance_tensor_pads_and_fills_missing_rewards_with_ones():
    rel = [{"a": [2.0, 0.0, 1.0], "b": [1.0, 1.0, 1.0]}, {"b": [0.5, 1.5]}, {}]
    rho, mask = relevance_tensor(rel, ["a", "b"], [3, 2, 1], T=4)
    assert rho.shape == (3, 2, 4) and mask.shape == (3, 4)
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]]
    assert rho[0, 0].tolist() == [2.0, 0.0, 1.0, 1.0]
    assert rho[1, 0].tolist() == [1.0, 1.0, 1.0, 1.0]  # 'a' not replayed for response 1: uniform
    assert rho[1, 1, :2].tolist() == [0.5, 1.5]
    with pytest.raises(MrtpoError, match="reward 'a' for response 0 has 2 values for 3 tokens"):
        relevance_tensor([{"a": [1.0, 1.0]}], ["a"], [3])


def _group(R):
    ex = Example("e", "Say something.")
    samples = [Sample([1, 2, 3][: i + 1], "xyz"[: i + 1]) for i in range(len(R))]
    return ScoredGroup.unscored(ex, samples, ["a", "b"], {"a": "check a", "b": "check b"}, R)


def test_unscored_and_subset():
    g = _group([[1, 0], [0, 1], [1, 1]])
    assert g.prompt == "Say something." and g.reasons == [{"a": "", "b": ""}] * 3
    assert g.verifier_info[2] == {"a": "check a", "b": "check b"} and g.verifier_info[0] is not g.verifier_info[1]
    s = g.subset([2, 0])
    assert [x.text for x in s.samples] == ["xyz", "x"] and s.rewards.tolist() == [[1, 1], [1, 0]]
    assert ScoredGroup.unscored(g.example, g.samples, ["a", "b"], {"a": "", "b": ""}).rewards.tolist() == [[0, 0]] * 3


def _replay(g, rel):
    resp = [ResponseRelevance(s.text, s.token_ids, [(i, i + 1) for i in range(len(s.token_ids))],
                              {k: np.ones(len(s.token_ids)) for k in r},
                              {k: np.asarray(v, float) for k, v in r.items()})
            for s, r in zip(g.samples, rel)]
    return ReplayResult(resp, [{}] * len(resp), ["a", "b"], [])


def test_group_table_numbers():
    g = _group([[1, 0], [0, 1], [1, 1]])
    rep = _replay(g, [{"a": [1.0]}, {"a": [0.5, 1.5]}, {"a": [1.0, 1.0, 1.0]}])
    rows = group_table(g, rep, "mrtpo")
    # reward a: values 1, 0, 1: mean 2/3, Bessel std 0.57735 → Â = (1 − 2/3) / (0.57735 + 1e-4)
    za = (1 - 2 / 3) / (math.sqrt(1 / 3) + 1e-4)
    assert rows[0]["a"] == 1.0 and rows[0]["Â a"] == round(za, 3) and rows[1]["Â a"] == round(-2 * za, 3)
    view = token_view(g, rep, "mrtpo", 0.5)
    assert [r["GDPO A"] for r in rows] == [round(float(x), 3) for x in view.final]
    assert [r["mrtpo A"] for r in rows] == [r["GDPO A"] for r in rows]  # MRTPO's token mean is GDPO's advantage
    assert "gdpo A" not in group_table(g, rep, "gdpo")[0]


def test_relevance_change():
    b = ResponseRelevance("ab", [1, 2], [(0, 1), (1, 2)], {"a": np.array([0.1, 0.3])}, {"a": np.array([0.5, 1.5])})
    a = ResponseRelevance("ab", [1, 2], [(0, 1), (1, 2)], {"a": np.array([0.2, 0.2])}, {"a": np.array([1.5, 0.5])})
    (row,) = relevance_change(b, a, ["a"])
    assert row["mean JS before"] == pytest.approx(0.2) and row["mean JS after"] == pytest.approx(0.2)
    assert row["max |Δρ|"] == pytest.approx(1.0) and row["corr(ρ before, ρ after)"] == pytest.approx(-1.0)


def test_method_labels_from_the_registry():
    assert [parse_method(m).label for m in ("gdpo", "mrtpo", "mrtpo+dara", "gd2po-snr", "grpo")] == \
        ["GDPO", "MRTPO", "MRTPO+DARA", "GD²PO-SNR", "GRPO"]
    assert parse_method("mrtpo+gd2po").estimator_label == "GD²PO"


def test_a_view_parses_its_method_once_however_much_of_it_is_drawn(monkeypatch):
    """The method name is parsed once per view (by the credit step that builds it): drawing the view (the page with
    every response, the overview and one response × reward in full, the short rows) reads ``view.parsed``."""
    import sys

    from bench.views import synthetic_group
    from mrtpo.core import advantages
    from mrtpo.display import overview, page, render
    from mrtpo.display.notes import floor_note

    real, calls = advantages.parse_method, []

    def counted(name):
        calls.append(name)
        return real(name)

    for mod in list(sys.modules.values()):  # every module that holds the function, under any name
        for attr, value in list(vars(mod).items()) if mod is not None and mod.__name__.startswith("mrtpo") else ():
            if value is real:
                monkeypatch.setattr(mod, attr, counted)
    group, replay = synthetic_group(3, overview.LONG_TOKENS + 50, 2)
    view = token_view(group, replay, "mrtpo+dara", 0.5)
    drawn = [page.page_html(view, group), overview.group_overview_html(view), render.rewards_table(view, group),
             overview.full_html(view, 1, "reward_0", group=group), overview.full_html(view, 1, overview.COMBINED),
             render.response_html(view, 2, group=group), floor_note(view, 0)]
    assert calls == ["mrtpo+dara"] and all(isinstance(d, str) for d in drawn) and "MRTPO+DARA" in drawn[0]
    assert view.parsed == real("mrtpo+dara")
