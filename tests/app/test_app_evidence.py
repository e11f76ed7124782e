"""The app shows the verifiers' evidence: Explore underlines it in each reward's rows (class "ev"), gives that
response's AUROC and lift beside the relevance row and a faithfulness table for the group, with a measure picker;
Templates compares the metrics before and after an edit; Teach explains the outline. AppTest, tiny model, a group
of hand-written responses (so that the evidence is known)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.testing.v1 import AppTest  # noqa: E402

from mrtpo.core.faith_metrics import pair_metrics  # noqa: E402
from mrtpo.display import faithfulness_table, token_view  # noqa: E402
from mrtpo.groups import score_group, template_for
from mrtpo.model import Sample, tokenize_response  # noqa: E402
from mrtpo.replay import replay_scored
from mrtpo.tasks import get_family  # noqa: E402
from mrtpo_app import (
    caches,  # noqa: E402
    state,  # noqa: E402
)

APP = str(Path(__file__).resolve().parents[2] / "app.py")
RESPONSES = ["Tea, green tea, and a cup.", "Green tea in a cup is calm.", "Black tea, hot.", "Tea is nice."]
ROW = re.compile(r'<div class="row"><div class="lab">(.*?)</div><div class="toks">(.*?)</div></div>', re.S)


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.fixture()
def app(tiny) -> AppTest:

    fam = get_family("instructions")
    ex = fam.example("tea-note")  # punctuation:no_comma, keywords:existence (green, cup)
    group = score_group(fam, ex, [Sample(tokenize_response(tiny, t)[0], t) for t in RESPONSES], info="quoted")
    template = template_for(fam).to_dict()
    replay = replay_scored(tiny, group, template_for(fam))
    ch = state.Choices("tiny-random", "auto", "instructions", "tea-note")
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["mrtpo_family"], at.session_state["mrtpo_example"] = "instructions", "tea-note"
    at.session_state["explore_info"] = "quoted"  # the group's regime: told what the checker read
    at.session_state["mrtpo_group"] = state.SessionGroup("task", ch, group, replay, template, {"id": 1}, {})
    at.run()
    _ok(at)
    return at


def test_explore_outlines_evidence_and_shows_auroc_and_lift(app: AppTest):
    at = app
    run = at.session_state["mrtpo_group"]
    assert run.group.rewards.tolist() == [[0, 1], [1, 1], [0, 0], [1, 0]]  # both rewards vary: both replayed
    body = at.get("html")[0].proto.body
    assert "evidence: the characters the reward" in body  # the legend says what the underline means
    rows = ROW.findall(body)
    # response 0: "Tea, green tea, and a cup." — no_comma read its two commas; each comma is underlined in the
    # reward's MRTPO, moved and relevance rows
    comma_rows = rows[:4]  # the no_comma reward's rows: GDPO uniform, MRTPO, moved by MRTPO, relevance
    assert [len(re.findall(r'<span class="ev"><span class="tok"[^>]*>,</span></span>', t)) for _, t in comma_rows] \
        == [0, 2, 2, 2]  # not on GDPO's uniform row
    v = token_view(run.group, run.replay, beta=0.5)
    m = pair_metrics(v.relevance[0]["punctuation:no_comma"], [(t["start"], t["end"]) for t in v.tokens[0]],
                     run.group.evidence[0]["punctuation:no_comma"], RESPONSES[0])
    assert f"AUROC {m.auroc:.2f} · lift {m.lift:.2f}" in comma_rows[3][0]
    assert comma_rows[3][0].startswith("relevance ρ")
    # the group's faithfulness table: one row per replayed reward, pairs counted as the library does
    df = next(d.value for d in at.dataframe if "token AUROC" in d.value.columns)
    assert df["reward"].tolist() == ["punctuation:no_comma", "keywords:existence"]
    assert df["pairs"].tolist() == [2, 2]  # commas in responses 0 and 2; keywords found in 0 and 1
    assert df["left out (whole / none / all)"].tolist() == ["0 / 2 / 0", "0 / 2 / 0"]


def test_measure_picker_rederives_relevance(app: AppTest):
    at = app
    at.selectbox(key="explore_measure").set_value("js-word").run()
    _ok(at)
    body = at.get("html")[0].proto.body
    assert "relevance ρ (js-word)" in body
    df = next(d.value for d in at.dataframe if "token AUROC" in d.value.columns)
    assert set(df["measure"]) == {"js-word"}
    run = at.session_state["mrtpo_group"]
    want = token_view(run.group, run.replay, measure="js-word")
    got = [float(x) for x in df["token AUROC"]]
    np.testing.assert_allclose(got, [r["token AUROC"] for r in faithfulness_table(want)], atol=1e-6)


def test_templates_before_after_and_teach_sentence(app: AppTest):
    at = app
    at.switch_page("pages/template-editor.py").run()
    _ok(at)
    at.text_area(key="tpl_text_0_punctuation:no_comma_quoted").set_value("Never use a comma (,) anywhere.").run()
    at.button(key="tpl_rerun").click().run()
    _ok(at)
    df = next(d.value for d in at.dataframe if "AUROC before" in d.value.columns)
    assert df["reward"].tolist() == ["punctuation:no_comma", "keywords:existence"]
    after = at.session_state["tpl_after"]
    run = at.session_state["mrtpo_group"]
    want = [r["token AUROC"] for r in faithfulness_table(token_view(run.group, after["replay"]))]
    np.testing.assert_allclose(df["AUROC after"].astype(float), want, atol=1e-6)
    at.switch_page("pages/teach-mrtpo.py").run()
    _ok(at)
    assert any("Underlined tokens are the reward's evidence" in c.value for c in at.caption)
    assert any('<span class="ev">' in h.proto.body for h in at.get("html"))


def test_templates_compare_regimes(app: AppTest):
    """The regime picker starts the texts from the checkers' rule alone (no quotes of what they read), for every
    response, and the before → after table compares the two."""
    at = app
    at.switch_page("pages/template-editor.py").run()
    _ok(at)
    run = at.session_state["mrtpo_group"]
    assert 'The checker read: "Tea,"' in run.group.verifier_info[0]["punctuation:no_comma"]  # the quotes are there
    at.segmented_control(key="tpl_info").set_value("rule").run()
    _ok(at)
    fam = get_family("instructions")
    rule = fam.rule_info(run.group.example)
    assert at.text_area(key="tpl_text_0_punctuation:no_comma_rule").value == rule["punctuation:no_comma"]
    at.button(key="tpl_rerun").click().run()
    _ok(at)
    after = at.session_state["tpl_after"]
    assert after["infos"] == [rule] * len(RESPONSES)
    assert all("The checker read" not in p for p in after["replay"].prompts[0].values())
    df = next(d.value for d in at.dataframe if "AUROC before" in d.value.columns)
    want = [r["token AUROC"] for r in faithfulness_table(token_view(run.group, after["replay"]))]
    np.testing.assert_allclose(df["AUROC after"].astype(float), want, atol=1e-6)
    before = [r["token AUROC"] for r in faithfulness_table(token_view(run.group, run.replay))]
    np.testing.assert_allclose(df["AUROC before"].astype(float), before, atol=1e-6)


def test_explore_regime_switch_and_oracle_row(app: AppTest):
    """Switching Explore's regime re-derives v_k for the same responses (P_all changes, the responses do not); under
    each reward's replayed ρ the oracle's row (ρ from what the checker read) shows, with the replayed ρ's AUROC; the
    oracle as the measure makes the relevance row the oracle's."""
    at = app
    run = at.session_state["mrtpo_group"]
    texts = [s.text for s in run.group.samples]
    at.segmented_control(key="explore_info").set_value("rule").run()
    _ok(at)
    now = at.session_state["mrtpo_group"]
    fam = get_family("instructions")
    assert now.group.info == "rule" and [s.text for s in now.group.samples] == texts
    assert now.group.verifier_info == [fam.rule_info(now.group.example)] * len(texts)
    assert all("The checker read" not in p for p in now.replay.prompts[0].values())
    rows = ROW.findall(at.get("html")[0].proto.body)
    labels = [re.sub("<.*?>", " ", lab) for lab, _ in rows]
    oracle = [j for j, lab in enumerate(labels) if lab.startswith("evidence (oracle) ρ")]
    assert oracle and labels[oracle[0] - 1].startswith("relevance ρ")  # right under the replayed ρ
    assert "ρ above vs this: AUROC" in labels[oracle[0]]
    at.selectbox(key="explore_measure").set_value("evidence").run()
    _ok(at)
    body = at.get("html")[0].proto.body
    assert "relevance ρ (evidence)" in body and "evidence (oracle) ρ" not in body  # not twice
    df = next(d.value for d in at.dataframe if "token AUROC" in d.value.columns)
    assert set(df["measure"]) == {"evidence"} and (df["token AUROC"].astype(float) > 0.99).all()


def test_templates_use_the_measure_picked_on_explore(app: AppTest):
    """The measure picked on Explore is kept when the page changes (the widget's own key is not) and Templates
    compares relevance and faithfulness under it; back on Explore the picker shows it."""
    at = app
    at.selectbox(key="explore_measure").set_value("js-support").run()
    _ok(at)
    at.switch_page("pages/template-editor.py").run()
    _ok(at)
    at.text_area(key="tpl_text_0_punctuation:no_comma_quoted").set_value("Never use a comma (,) anywhere.").run()
    at.button(key="tpl_rerun").click().run()
    _ok(at)
    assert any("measure js\\-support" in s.value for s in at.subheader)  # markdown-escaped
    after = at.session_state["tpl_after"]
    run = at.session_state["mrtpo_group"]
    df = next(d.value for d in at.dataframe if "AUROC before" in d.value.columns)
    want = faithfulness_table(token_view(run.group, after["replay"], measure="js-support"))
    np.testing.assert_allclose(df["AUROC after"].astype(float), [r["token AUROC"] for r in want], atol=1e-6)
    at.switch_page("app.py").run()
    _ok(at)
    assert at.selectbox(key="explore_measure").value == "js-support"


def _picked_measure_replays_again(at: AppTest, measure: str, input_of, **extra):
    """Picks ``measure`` in Explore, whose input (``input_of(response)``) the group's replay did not read: the page
    shows ρ of the replay with it (``extra``: replay_for's switch; cached), its AUROC table is the library's for that
    replay, and the session's replay is left as it was. Returns (the session's group, that replay)."""
    at.selectbox(key="explore_measure").set_value(measure).run()
    _ok(at)
    assert f"relevance ρ ({measure})" in at.get("html")[0].proto.body
    run = at.session_state["mrtpo_group"]
    assert not any(input_of(r) for r in run.replay.responses)
    again = caches.replay_for(run.choices, run.group, run.template, **extra)  # the cached replay the page used
    assert all(set(input_of(r)) == set(r.js) for r in again.responses)
    df = next(d.value for d in at.dataframe if "token AUROC" in d.value.columns)
    want = faithfulness_table(token_view(run.group, again, measure=measure))
    np.testing.assert_allclose(df["token AUROC"].astype(float), [r["token AUROC"] for r in want], atol=1e-6)
    return run, again


def test_js_reworded_replays_once_more_and_templates_follow(app: AppTest):
    """js-reworded reads P_k′ (v_k in other words), which the group's replay did not run: picking it replays the
    group once more with the rewordings (cached), and ρ is the library's for that replay; Templates replays with
    them too."""
    at = app
    _picked_measure_replays_again(at, "js-reworded", lambda r: r.js_reworded, reword=True)
    at.switch_page("pages/template-editor.py").run()
    _ok(at)
    at.button(key="tpl_rerun").click().run()
    _ok(at)
    after = at.session_state["tpl_after"]
    assert all(r.js_reworded for r in after["replay"].responses if r.js)
    assert any("measure js\\-reworded" in s.value for s in at.subheader)


def test_attn_contrast_replays_once_more_with_the_attention(app: AppTest):
    """attn-contrast reads P_all's attention to each v_k, which the group's replay did not read: picking it replays
    the group once more with the attention (cached), and ρ is the library's for that replay."""
    run, again = _picked_measure_replays_again(app, "attn-contrast", lambda r: r.attn, attention=True)
    assert caches.lacks_inputs(run.replay, "attn-contrast") and not caches.lacks_inputs(again, "attn-contrast")
