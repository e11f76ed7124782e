"""Teach shows the library's own numbers (issue 35): with rewards that cancel (every response's sum the same, so GDPO's
scale is eps ≪ 1) its A_it is the app's value, the floored formula of METHOD.md step 5; and its captions describe
the regime of the group shown.  AppTest, tiny model, hand-written responses to instructions/tea-note."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.testing.v1 import AppTest  # noqa: E402

from mrtpo.groups import score_group, template_for  # noqa: E402
from mrtpo.model import Sample, tokenize_response  # noqa: E402
from mrtpo.replay import replay_scored  # noqa: E402
from mrtpo.tasks import get_family  # noqa: E402
from mrtpo_app import state  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "app.py")
# rewards (no_comma, keywords:existence): (0, 1), (1, 0), (0, 1), (1, 0) — every sum is 1, so std(a) = 0
RESPONSES = ["Tea, green tea, and a cup.", "Tea is nice.", "A cup, then green tea.", "Tea is calm."]
A_IT = re.compile(r"A_it = [^*]* = \*\*(-?[\d.]+)\*\* \(the app's value: (-?[\d.]+)\)")  # the page's, the app's


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _teach(tiny, info: str) -> AppTest:
    """The Teach page on the group of RESPONSES with the verifier information of regime ``info``."""
    fam = get_family("instructions")
    ex = fam.example("tea-note")
    group = score_group(fam, ex, [Sample(tokenize_response(tiny, t)[0], t) for t in RESPONSES], info=info)
    replay = replay_scored(tiny, group, template_for(fam))
    ch = state.Choices("tiny-random", "auto", "instructions", "tea-note")
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["mrtpo_family"], at.session_state["mrtpo_example"] = "instructions", "tea-note"
    at.session_state["explore_info"] = info
    at.session_state["mrtpo_group"] = state.SessionGroup("task", ch, group, replay, template_for(fam).to_dict(),
                                                         {"id": 1}, {})
    at.run()
    _ok(at)
    at.switch_page("pages/teach-mrtpo.py").run()
    _ok(at)
    return at


def test_teach_with_cancelling_rewards_shows_the_apps_token_advantages(tiny):
    """GDPO's scale is std(a) + eps = 1e-4 here: (Σ_k A_ikt − center) / scale (what the page computed itself) gave
    ±thousands beside the app's value; the page now shows the floored A_it = final_i + Σ_k Â_ik β (ρ_ikt − 1) / 1."""
    at = _teach(tiny, "rule")
    run = at.session_state["mrtpo_group"]
    assert run.group.rewards.tolist() == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert sorted(run.replay.rewards) == sorted(run.group.reward_names)  # both vary: both replayed
    z = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # Â of a (0, 1, 0, 1) column: ±0.5 / (Bessel std + eps)
    a_hat = [-z, z]  # response 0: no comma 0, keywords 1
    rho = run.replay.responses[0].relevance
    T = len(run.replay.responses[0].token_ids)
    step4 = next(d.value for d in at.dataframe if "A_ikt" in d.value.columns)
    assert step4["Â_ik"].tolist() == pytest.approx(a_hat, abs=1e-5)
    assert step4["Σ_t A_ikt"].tolist() == pytest.approx([T * a for a in a_hat], abs=1e-4)
    for t in (0, 1, T - 1):
        at.slider(key="teach_token").set_value(t).run()
        _ok(at)
        text = next(m.value for m in at.markdown if "the app's value" in m.value)
        page, app = A_IT.search(text).groups()
        assert page == app  # the page's A_it is the app's
        assert "scale s = std(a)+ε = **0.0001**" in text and "f_0 = 1 / max(s, 1) = **1.0000**" in text
        want = sum(a * 0.5 * (float(rho[k][t]) - 1) for a, k in zip(a_hat, run.group.reward_names))
        assert float(page) == pytest.approx(want, abs=1e-4)  # GDPO's A_0 = 0 plus the reallocated part, floored
        assert float(app) == pytest.approx(float(state.view(run, "mrtpo", 0.5).token_adv[0][t]), abs=1e-4)
    assert any("The scale is below 1 here" in c.value for c in at.caption)


@pytest.mark.parametrize("info", ["rule", "findings", "quoted"])
def test_teach_caption_follows_the_groups_regime(tiny, info):
    """Under the response: what its verifier information holds in the group's regime — "The checker read: …" is
    quoted only under ``quoted`` (the default regime is ``rule``)."""
    at = _teach(tiny, info)
    caption = next(c.value for c in at.caption if "Underlined tokens are the reward's evidence" in c.value)
    assert f"(regime **{info}**" in caption
    assert ("The checker read" in caption) == (info == "quoted")
    v_k = at.session_state["mrtpo_group"].group.verifier_info[0]["punctuation:no_comma"]
    assert ('The checker read: "Tea,"' in v_k) == (info == "quoted")  # what the caption says is what P_all holds


@pytest.mark.parametrize("result", [None, "null", "gain"])
def test_teach_and_train_show_the_credit_sweep(tiny, monkeypatch, result):
    """The argument, the sweep's figure and its verdict (or why there is none), on Teach and on Train's experiments."""
    from mrtpo.experiment import sweep as SW
    from mrtpo_app import sweep_panel

    rows = {"null": [{"k": 2, "arm": SW.ORACLE, "delta": 0.01, "ci95": [-0.01, 0.03]},
                     {"k": 8, "arm": SW.ORACLE, "delta": 0.02, "ci95": [-0.01, 0.05]}],
            "gain": [{"k": 8, "arm": SW.ORACLE, "delta": 0.04, "ci95": [0.01, 0.07]}]}.get(result)
    data = None if rows is None else {"rows": rows, "settings": {"model": "default", "seeds": 6, "steps": 20},
                                      "cpu": "AMD AVX512-BF16", "date": "2026-12-06"}
    monkeypatch.setattr(sweep_panel, "load_sweep", lambda: data)
    at = _teach(tiny, "rule")
    text = " ".join(m.value for m in at.markdown)
    assert "reward k's signal there shrinks roughly as 1/√K" in text
    if rows is None:
        assert any("credit sweep has not been run" in i.value for i in at.info)
        assert not [c for c in at.get("plotly_chart") if "K (items" in c.proto.spec]
    else:
        assert SW.verdict(rows) in text
        charts = [c for c in at.get("plotly_chart") if "K (items" in c.proto.spec]
        assert len(charts) == 1
        assert any("6 seeds × 20 steps" in c.value and "AMD AVX512-BF16" in c.value for c in at.caption)
        link = "(training?experiment=credit-matters-k8-tiny-random)"  # Teach links the Train page's preset
        assert (link in text) == (result == "gain")
    at.switch_page("pages/training.py").run()
    _ok(at)
    at.radio(key="train_view").set_value("Experiments").run()
    _ok(at)
    assert "reward k's signal there shrinks roughly as 1/√K" in " ".join(m.value for m in at.markdown)
