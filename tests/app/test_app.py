"""The Streamlit app under AppTest with the tiny random model (no browser): every page runs and shows real numbers."""
from __future__ import annotations

import contextlib
import html
import json
import os
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.testing.v1 import AppTest  # noqa: E402

from mrtpo.core.advantages import compute  # noqa: E402
from mrtpo.errors import MrtpoError  # noqa: E402
from mrtpo.model import SamplingConfig  # noqa: E402
from mrtpo_app import (
    caches,  # noqa: E402
    models,  # noqa: E402
    state,  # noqa: E402
)
from mrtpo_app.timer import Timer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
ROW = re.compile(r'<div class="row"><div class="lab">(.*?)</div><div class="toks">(.*?)</div></div>', re.S)
BG = re.compile(r'<span class="tok" style="background:([^"]*)"')


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def shown(markdown: str) -> str:
    """What a markdown message shows (backslash escapes and zero-width spaces gone; checked in Chromium)."""
    return re.sub(r"\\(.)", r"\1", markdown).replace("\u200b", "")


def _rows(body: str) -> list[tuple[str, list[str]]]:
    """(label, [background per token]) for every heatmap row."""
    return [(lab, BG.findall(toks)) for lab, toks in ROW.findall(body)]


@pytest.fixture()
def sampled() -> AppTest:
    """Explore after sampling G = 4 × 96 tokens for instructions/tea-note (seed 1: the no-comma reward varies)."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    _ok(at)
    at.selectbox(key="mrtpo_family").set_value("instructions").run()
    at.selectbox(key="mrtpo_example").set_value("tea-note").run()
    at.number_input(key="explore_seed").set_value(1).run()
    at.button(key="explore_sample").click().run()
    _ok(at)
    return at


def test_sidebar_defaults_from_env_and_sql_first():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    _ok(at)
    assert at.selectbox(key="mrtpo_model").value == "tiny-random"
    assert at.selectbox(key="mrtpo_family").value == "sql"
    assert at.selectbox(key="mrtpo_example").value == "shop-01"
    assert any("Press **Sample group**" in i.value for i in at.info)


def test_explore_table_heatmap_spans_and_beta(sampled: AppTest):
    at = sampled
    run = at.session_state["mrtpo_group"]
    R = run.group.rewards
    assert R.shape == (4, 2) and np.ptp(R[:, 0]) > 0  # no_comma varies, so its advantage is not 0
    # the table holds GDPO's per-reward advantages and final advantage, equal to the library's
    df = at.dataframe[0].value
    gd = compute("gdpo", torch.tensor(R, dtype=torch.float32), 4)
    np.testing.assert_allclose(df["GDPO A"].to_numpy(), gd.final.numpy(), atol=1e-3)
    np.testing.assert_allclose(df["Â punctuation:no_comma"].to_numpy(), gd.diagnostics["zscore"][:, 0].numpy(),
                               atol=1e-3)
    # heatmap of response 0: per replayed reward 4 rows (GDPO uniform, MRTPO, moved by MRTPO, relevance), + the
    # oracle's row where the checker read specific characters, + 2 combined rows, one span per token; the keywords
    # reward is constant in the group (advantage 0), so it is not replayed: one line with its value and reason
    assert run.replay.rewards == ["punctuation:no_comma"] and run.replay.skipped == ["keywords:existence"]
    from mrtpo.display.render import token_cells

    cells = len(token_cells(run.replay.responses[0].tokens()))  # cells: a character's byte tokens drawn as one
    body = at.get("html")[0].proto.body
    oracle = int(run.group.evidence[0]["punctuation:no_comma"] is not None)  # commas: a list of spans, [] if none
    assert oracle == 1 and body.count("evidence (oracle) ρ") == oracle
    assert body.count('<span class="tok"') == cells * (4 * 1 + oracle + 2)
    rows = _rows(body)
    assert len(rows) == 6 + oracle and all(len(bg) == cells for _, bg in rows)
    reason = html.escape(run.group.reasons[0]["keywords:existence"])
    assert reason and "<b>keywords:existence</b> = 0" in body and reason in body and "not replayed" in body
    assert any("keywords:existence = 0" in shown(w.value).replace("*", "") for w in at.warning)  # named above
    assert "GDPO (uniform)" in rows[0][0] and "mrtpo β=0.5" in rows[1][0] and "moved by MRTPO" in rows[2][0]
    cells = token_cells(run.replay.responses[0].tokens())
    # GDPO: the same share on every token (a cell of n byte tokens: their sum, n × the share)
    assert len({bg for bg, c in zip(rows[0][1], cells) if len(c) == 1}) == 1
    assert len({(bg, len(c)) for bg, c in zip(rows[0][1], cells)}) == len({len(c) for c in cells})
    # side by side: GDPO | MRTPO, moved | ρ, (the oracle's ρ under ρ,) and the combined pair
    assert body.count('<div class="pair">') == 3 + oracle
    assert 'data-tip="' in body and 'title="' not in body and "JS " in body and "relevance " in body  # tooltips
    assert "legend" in body
    # β re-colors (fragment, no model call): β = 0 → MRTPO row equals GDPO's uniform row; β = 1 differs
    at.slider(key="explore_beta").set_value(0.0).run()
    _ok(at)
    rows0 = _rows(at.get("html")[0].proto.body)
    assert rows0[1][1] == rows0[0][1]
    at.slider(key="explore_beta").set_value(1.0).run()
    rows1 = _rows(at.get("html")[0].proto.body)
    assert rows1[1][1] != rows0[1][1] and len(set(rows1[1][1])) > 1
    assert at.session_state["mrtpo_group"] is not None and len(at.get("download_button")) == 2


LEGEND = re.compile(r"advantage <span[^>]*></span> −([0-9.e+-]+) .*?moved <span[^>]*></span> ±([0-9.e+-]+)"
                    r".*?relevance <span[^>]*></span> 0 … ([0-9.e+-]+)", re.S)


def _lim(lim) -> tuple[str, str, str]:
    return f"{lim.adv:.3g}", f"{lim.moved:.3g}", f"{lim.rel:.3g}"


def test_explore_scale_switch_sets_the_color_limits_and_the_export(sampled: AppTest, monkeypatch):
    from mrtpo.display import page, render, token_view

    at = sampled
    exported = []
    real = page.page_html
    monkeypatch.setattr(page, "page_html", lambda *a, **k: exported.append((k.get("scale"), real(*a, **k)))
                        or exported[-1][1])
    run = at.session_state["mrtpo_group"]
    v = token_view(run.group, run.replay, method="mrtpo", beta=0.5)
    group = render.limits(v, "group")
    # a response whose own largest |advantage| is below the group's: its colors differ between the two scales
    i = next(j for j in range(4) if render.limits(v, "response", j).adv < group.adv - 1e-6)
    at.selectbox(key=f"explore_response_{run.settings['id']}").set_value(i).run()
    _ok(at)
    assert at.button_group(key="explore_scale").value == "response"  # the default
    own_body = at.get("html")[0].proto.body
    assert LEGEND.search(own_body).groups() == _lim(render.limits(v, "response", i))
    scale, page = exported[-1]
    assert scale == "response"
    assert [m.groups() for m in LEGEND.finditer(page)] == [_lim(render.limits(v, "response", j)) for j in range(4)]
    at.button_group(key="explore_scale").set_value("group").run()
    _ok(at)
    body = at.get("html")[0].proto.body
    assert LEGEND.search(body).groups() == _lim(group) and "colors shared by the group" in body
    assert _rows(body)[1][1] != _rows(own_body)[1][1]  # the MRTPO row is paler on the shared scale
    scale, page = exported[-1]
    assert scale == "group" and [m.groups() for m in LEGEND.finditer(page)] == [_lim(group)] * 4
    # what MRTPO moved sums to 0 over the response (tooltips: "moved ±x.xxxx" per token)
    moved = [float(x) for x in re.findall(r"moved ([+-][0-9.]+)", ROW.findall(body)[2][1])]
    assert len(moved) == len(v.tokens[i]) and abs(sum(moved)) < 1e-3 and max(map(abs, moved)) > 0
    np.testing.assert_allclose(moved, v.moved(i, "punctuation:no_comma"), atol=1e-4)


def test_explore_topk_view_matches_the_library(sampled: AppTest):
    from mrtpo.model import load_model
    from mrtpo.replay import next_token_topk
    from mrtpo.templates import Template

    at = sampled
    assert not [c for c in at.get("plotly_chart") if "explore_dist_chart" in c.proto.id]  # off until asked
    run = at.session_state["mrtpo_group"]
    at.selectbox(key=f"explore_response_{run.settings['id']}").set_value(2).run()
    at.toggle(key="explore_topk").set_value(True).run()
    _ok(at)
    k = "punctuation:no_comma"
    resp = run.replay.responses[2]
    t = int(np.argmax(resp.js[k]))  # the view starts at the largest JS distance
    ref = next_token_topk(load_model("tiny-random", "cpu"), run.group.prompt, run.group.verifier_info[2],
                          list(resp.token_ids), k, t, 10, Template.from_dict(run.template))
    chart = json.loads(next(c.proto.spec for c in at.get("plotly_chart") if "explore_dist_chart" in c.proto.id))
    p_bars, q_bars = chart["data"]
    n = len(p_bars["y"])
    assert n >= 10 and p_bars["y"][:len(ref["rows"])] == pytest.approx([r["p"] for r in ref["rows"]])
    assert q_bars["y"][:len(ref["rows"])] == pytest.approx([r["q"] for r in ref["rows"]])
    assert f"={ref['js']:.5f}" in at.latex[-1].value
    assert any(f"token t = {t}" in h.proto.body for h in at.get("html"))
    slider = next(s for s in at.slider if s.key.startswith("explore_topk_t_"))
    slider.set_value(0 if t else 1).run()
    _ok(at)
    t2 = 0 if t else 1
    ref2 = next_token_topk(load_model("tiny-random", "cpu"), run.group.prompt, run.group.verifier_info[2],
                           list(resp.token_ids), k, t2, 10, Template.from_dict(run.template))
    assert f"={ref2['js']:.5f}" in at.latex[-1].value


def test_constant_group_warns_and_samples_until_the_rewards_vary():
    """tea-note, 16 tokens, seed 0: both rewards constant (a warning naming them, with the button); the button
    tries seeds 1, 2, 3 and keeps seed 3, where the no-comma reward varies (as the library's helper finds)."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.selectbox(key="mrtpo_family").set_value("instructions").run()
    at.selectbox(key="mrtpo_example").set_value("tea-note").run()
    at.number_input(key="explore_max").set_value(16).run()
    at.button(key="explore_sample").click().run()
    _ok(at)
    first = at.session_state["mrtpo_group"]
    warn = shown(at.warning[0].value).replace("*", "")
    assert "No reward varies in this group" in warn
    assert "punctuation:no_comma = 1" in warn and "keywords:existence = 0" in warn
    at.button(key="explore_until").click().run()
    _ok(at)
    from mrtpo.groups import sample_until_varied
    from mrtpo.model import load_model
    from mrtpo.tasks import get_family

    fam = get_family("instructions")  # the library's helper, from seed 1, is the reference
    want, ref = sample_until_varied(load_model("tiny-random", "cpu"), fam, fam.example("tea-note"), 5, n=4,
                                    max_new_tokens=16, seed=1)
    run = at.session_state["mrtpo_group"]
    assert run is not first and run.settings["seed"] == 3 and at.number_input(key="explore_seed").value == 3
    assert [t.seed for t in ref] == [1, 2, 3] and [t["seed"] for t in run.settings["tries"]] == [1, 2, 3]
    assert [t["kept"] for t in run.settings["tries"]] == [False, False, True]
    np.testing.assert_array_equal(run.group.rewards, want.rewards)
    assert np.ptp(run.group.rewards[:, 0]) > 0 and run.replay.rewards == ["punctuation:no_comma"]
    tries = next(d.value for d in at.dataframe if "seed" in d.value.columns)
    assert tries["seed"].tolist() == [1, 2, 3] and tries["kept"].tolist() == [False, False, True]
    assert tries["varies"].tolist() == ["none", "none", "punctuation:no_comma"]
    assert tries["mean punctuation:no_comma"].tolist() == pytest.approx([t.means["punctuation:no_comma"] for t in ref],
                                                                       abs=1e-3)
    warn = shown(at.warning[0].value).replace("*", "")  # only the keywords reward is left constant
    assert warn.startswith("This reward is the same") and "keywords:existence = 0" in warn
    assert "no_comma" not in warn


@pytest.mark.parametrize("key, value, says", [("explore_temp", 0.0, "greedy sampling (temperature 0) gives the same "
                                                "group for every seed, so raise the temperature"),
                                               ("explore_g", 1, "a group of one response has no reward that varies "
                                                "within it, so sample a larger group")])
def test_the_constant_warning_offers_other_seeds_only_where_they_can_help(key, value, says):
    """tea-note, 16 tokens: every reward constant. Greedy, or a group of one: other seeds give no other rewards, so
    the warning says what can, and there is no "Sample until the rewards vary" button."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.selectbox(key="mrtpo_family").set_value("instructions").run()
    at.selectbox(key="mrtpo_example").set_value("tea-note").run()
    at.number_input(key="explore_max").set_value(16).run()
    at.number_input(key=key).set_value(value).run()
    at.button(key="explore_sample").click().run()
    _ok(at)
    warn = shown(at.warning[0].value).replace("*", "")
    assert "No reward varies in this group" in warn and says in warn
    assert "Sample until the rewards vary" not in warn and "another seed" not in warn
    assert not [b for b in at.button if b.key == "explore_until"]


def test_sample_until_varied_keeps_the_group_when_none_is_better():
    """shop-01 on the random model: no reward ever varies; the 5 tries are listed and the group stays."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.number_input(key="explore_max").set_value(8).run()
    at.button(key="explore_sample").click().run()
    _ok(at)
    first = at.session_state["mrtpo_group"]
    at.button(key="explore_until").click().run()
    _ok(at)
    assert at.session_state["mrtpo_group"] is first and at.number_input(key="explore_seed").value == 0
    tries = next(d.value for d in at.dataframe if "seed" in d.value.columns)
    assert tries["seed"].tolist() == [1, 2, 3, 4, 5] and not tries["kept"].any()
    assert (tries["varies"] == "none").all()
    assert any("none had more varying rewards" in e.proto.label for e in at.expander)


def test_selecting_a_table_row_selects_that_response():
    """The responses table's selection moves the response picker, only when the selection changes (a picker
    changed by hand afterwards keeps its value)."""
    session = {"explore_response": 0}
    state.follow_table(session, [], "explore_response", "seen")
    assert session == {"explore_response": 0, "seen": None}
    state.follow_table(session, [2], "explore_response", "seen")
    assert session["explore_response"] == 2
    session["explore_response"] = 1  # picked by hand; the row stays selected
    state.follow_table(session, [2], "explore_response", "seen")
    assert session["explore_response"] == 1
    state.follow_table(session, [3], "explore_response", "seen")
    assert session["explore_response"] == 3


def test_explore_method_choice_and_combined(sampled: AppTest):
    at = sampled
    assert "mrtpo+dara" in at.selectbox(key="explore_method").options
    at.selectbox(key="explore_method").set_value("mrtpo+gd2po").run()
    _ok(at)
    assert "mrtpo+gd2po A" in at.dataframe[0].value.columns
    assert "combined" in at.get("html")[0].proto.body


def test_methods_page(sampled: AppTest):
    at = sampled
    at.switch_page("pages/method-comparison.py").run()
    _ok(at)
    text = " ".join(m.value for m in at.markdown)
    assert "distinct reward combinations" in text and "Hard filter" in text
    assert len(at.get("plotly_chart")) == 2
    frames = [d.value for d in at.dataframe]
    dara = next(f for f in frames if "density π_k" in f.columns)
    assert dara["density π_k"].tolist() == [1.0, 0.0]  # no_comma varies in the group, keywords does not
    assert dara["weight w_k"].tolist() == [1.0, 1.0]
    demo = next(f for f in frames if "group" in f.columns)
    assert demo["GRPO A"].tolist() == [-0.707, 0.707] * 3  # all groups collapse (shown as one pair)
    assert demo["GDPO A"].tolist() == [-0.645, 0.645, -1.291, 1.291, -0.645, 0.645]  # the (0,2) group stands apart
    assert "3 distinct reward combinations → 2 distinct GRPO advantages, 4 distinct GDPO advantages." in text
    assert at.get("html")[0].proto.body.count('<span class="tok"') > 0


def test_teach_page(sampled: AppTest):
    at = sampled
    at.switch_page("pages/teach-mrtpo.py").run()
    _ok(at)
    codes = [c.value for c in at.code]
    run = at.session_state["mrtpo_group"]
    assert run.replay.rewards == ["punctuation:no_comma"]  # the constant keywords reward is skipped
    v = run.group.verifier_info[0]["punctuation:no_comma"]
    assert len(codes) == 2 and codes[0].count(v) == codes[1].count(v) + 1  # P_all has v_k, P_\k leaves it out
    assert len(at.latex) >= 5
    text = " ".join(m.value for m in at.markdown)
    assert "= GDPO's A_0" in text


def test_teach_shows_the_two_distributions_behind_js(sampled: AppTest):
    from mrtpo.model import load_model
    from mrtpo.replay import next_token_topk
    from mrtpo.templates import Template

    at = sampled
    at.switch_page("pages/teach-mrtpo.py").run()
    _ok(at)
    run = at.session_state["mrtpo_group"]
    k, t = "punctuation:no_comma", at.slider(key="teach_token").value
    resp = run.replay.responses[0]
    ref = next_token_topk(load_model("tiny-random", "cpu"), run.group.prompt, run.group.verifier_info[0],
                          list(resp.token_ids), k, t, 10, Template.from_dict(run.template))
    chart = json.loads(next(c.proto.spec for c in at.get("plotly_chart") if "teach_dist_chart" in c.proto.id))
    p_bars, q_bars = chart["data"]
    y_t = ref["token"]
    bars = ref["rows"] + ([] if any(r["id"] == y_t["id"] for r in ref["rows"]) else [y_t])  # y_t always shown
    assert p_bars["y"] == pytest.approx([r["p"] for r in bars])  # p_t (P_all) and q_t (P_\k) side by side
    assert q_bars["y"] == pytest.approx([r["q"] for r in bars])
    bold = [j for j, x in enumerate(chart["layout"]["xaxis"]["ticktext"]) if x.startswith("<b>y_t = ")]
    assert bold == [[r["id"] for r in bars].index(y_t["id"])]
    assert len(p_bars["y"]) >= 10 and chart["layout"]["barmode"] == "group"
    assert chart["layout"]["xaxis"]["ticktext"][0] == html.escape(repr(ref["rows"][0]["text"])[1:-1].replace(" ", "␣")
                                                                  or "∅", quote=False)
    assert f"={ref['js']:.5f}" in at.latex[-1].value  # the JS built from the two full distributions
    assert abs(ref["js"] - float(resp.js[k][t])) < 2e-3  # the replay's d at t (bf16 replay on AMX CPUs)
    bodies = [h.proto.body for h in at.get("html")]
    pos = next(b for b in bodies if f"token t = {t}" in b)  # the token highlighted in the response
    cells = BG.findall(pos)
    from mrtpo.display.render import token_cells

    groups = token_cells(resp.tokens())  # a character's byte tokens are one cell
    assert len(cells) == len(groups) and [c != "transparent" for c in cells].index(True) == next(
        n for n, g in enumerate(groups) if t in g)
    assert sum(c != "transparent" for c in cells) == 1
    diff = next(b for b in bodies if "<mark" in b)  # P_all with what P_\k lacks highlighted: v_k's item
    added = re.findall(r"<mark[^>]*>(.*?)</mark>", diff, re.S)
    assert len(added) == 1 and run.group.verifier_info[0][k] in html.unescape(added[0])
    # another token: the view follows
    at.slider(key="teach_token").set_value(0 if t else 1).run()
    _ok(at)
    assert f"token t = {0 if t else 1}" in " ".join(h.proto.body for h in at.get("html"))


def test_methods_charts_token_methods_and_token_axis(sampled: AppTest):
    at = sampled
    at.switch_page("pages/method-comparison.py").run()
    _ok(at)
    run = at.session_state["mrtpo_group"]
    adv = json.loads(next(c.proto.spec for c in at.get("plotly_chart") if "methods_adv_chart" in c.proto.id))
    bars = {b["name"]: b for b in adv["data"]}
    R = torch.tensor(run.group.rewards, dtype=torch.float32)
    for m, base in (("mrtpo", "gdpo"), ("mrtpo+dara", "dara"), ("mrtpo+gd2po", "gd2po")):
        b = bars[f"{m} (token mean)"]
        assert b["y"] == pytest.approx(compute(base, R, 4).final.numpy().round(4).tolist(), abs=2e-4)
        v = state.view(run, m, 0.5)  # whiskers: the lowest and the highest token advantage of each response
        assert b["error_y"]["array"] == pytest.approx([float(a.max() - a.mean()) for a in v.token_adv], abs=2e-4)
    prof = json.loads(next(c.proto.spec for c in at.get("plotly_chart") if "methods_rel_chart" in c.proto.id))
    toks = [t["text"] for t in run.replay.responses[0].tokens()]
    x = prof["layout"]["xaxis"]
    assert x["title"]["text"] == "token (position t)"
    step = x["tickvals"][1] - x["tickvals"][0]
    assert [html.unescape(s) for s in x["ticktext"]] == [repr(toks[n])[1:-1].replace(" ", "␣") or "∅"
                                                         for n in range(0, len(toks), step)]


def test_error_messages_show_user_text_literally(sampled: AppTest):
    at = sampled
    at.switch_page("pages/template-editor.py").run()
    at.text_area(key="tpl_prompt").set_value("{prompt.__class__} {verifier_info}").run()
    assert not at.exception
    err = next(e.value for e in at.error if "class" in e.value)
    assert "{prompt.__class__}" in shown(err)  # what the browser shows
    assert "prompt.__class__" not in err and "\\_\\_class\\_\\_" in err  # escaped: no bold, no lost underscores


def test_timer_tells_a_cache_hit_from_work():

    caches.sample_cached.clear()
    t = {}
    with Timer(t, "sample") as first:
        caches.sample_cached("tiny-random", "cpu", "Say hi.", SamplingConfig(2, 4, seed=12345))
    with Timer(t, "sample") as again:
        caches.sample_cached("tiny-random", "cpu", "Say hi.", SamplingConfig(2, 4, seed=12345))
    with Timer(t, "score") as other:  # no cached function called: not "cached"
        sum(range(10))
    assert (first.cached, again.cached, other.cached) == (False, True, False)
    assert again.text == "cached" and first.text.endswith(" s") and t["sample"] >= 0


def test_state_sample_until_varied_uses_the_cached_sampler():
    from mrtpo.tasks import get_family
    from mrtpo_app import state

    fam = get_family("instructions")
    ex = fam.example("tea-note")
    ch = state.Choices("tiny-random", "cpu", "instructions", "tea-note")
    seen = []
    with Timer({}, "sample") as first:
        group, tries = caches.sample_until_varied(ch, fam, ex, 6, SamplingConfig(4, 16), on_try=seen.append)
    assert [t.seed for t in tries] == [0, 1, 2, 3] and seen == tries and tries[-1].varied == ["punctuation:no_comma"]
    with Timer({}, "sample") as again:  # the same seeds again: every group from the cache
        group2, _ = caches.sample_until_varied(ch, fam, ex, 6, SamplingConfig(4, 16))
    assert not first.cached and again.cached and again.text == "cached"
    np.testing.assert_array_equal(group.rewards, group2.rewards)


def test_sample_until_varied_wants_more_varying_rewards():
    """want = 2: stops at the first group where both rewards vary; with too few tries, keeps the group where the most
    varied (marked kept)."""
    from mrtpo.groups import sample_until_varied
    from mrtpo.model import Sample
    from mrtpo.tasks import get_family

    fam = get_family("instructions")
    ex = fam.example("tea-note")  # no comma; keywords green and cup
    texts = {0: ["tea", "tea"], 1: ["tea, hot", "tea"], 2: ["tea, hot", "green cup"], 3: ["a, b", "green cup"]}
    fn = lambda c: [Sample([1], t) for t in texts[c.seed]]  # noqa: E731
    group, tries = sample_until_varied(None, fam, ex, 4, n=2, seed=0, sample_fn=fn, want=2)
    assert [(t.seed, len(t.varied), t.kept) for t in tries] == [(0, 0, False), (1, 1, False), (2, 2, True)]
    assert [s.text for s in group.samples] == texts[2]
    group, tries = sample_until_varied(None, fam, ex, 2, n=2, seed=0, sample_fn=fn, want=2)
    assert [t.kept for t in tries] == [False, True] and [s.text for s in group.samples] == texts[1]
    group, tries = sample_until_varied(None, fam, ex, 4, n=2, seed=0, sample_fn=fn)  # want 1: the first that varies
    assert [t.seed for t in tries] == [0, 1] and tries[-1].kept
    with pytest.raises(MrtpoError, match="want must be"):
        sample_until_varied(None, fam, ex, 2, sample_fn=fn, want=0)


def test_first_load_of_the_default_model_says_it_converts(monkeypatch):

    said = []

    @contextlib.contextmanager
    def spinner(text):
        said.append(text)
        yield

    monkeypatch.setattr(models.st, "spinner", spinner)
    monkeypatch.setattr(models, "_model", lambda name, device="auto": f"model {name}")
    monkeypatch.setattr("mrtpo.model.default_model_cached", lambda: False)
    assert models.get_model("default") == "model default" and said == [models.CONVERTING]
    assert "Converting the default model" in said[0] and "20 s" in said[0]
    monkeypatch.setattr("mrtpo.model.default_model_cached", lambda: True)
    models.get_model("default")
    models.get_model("tiny-random")
    assert len(said) == 1


def test_templates_page_malformed_then_rerun(sampled: AppTest):
    at = sampled
    at.switch_page("pages/template-editor.py").run()
    _ok(at)
    at.text_area(key="tpl_prompt").set_value("{prompt} {oops}").run()
    assert any("unknown placeholder '{oops}'" in shown(e.value) for e in at.error)
    assert not at.exception
    at.text_area(key="tpl_prompt").set_value("").run()
    assert any("is empty" in shown(e.value) for e in at.error)
    at.text_area(key="tpl_prompt").set_value("{prompt}\n\nRules:\n{verifier_info}").run()
    at.text_area(key="tpl_text_0_punctuation:no_comma_rule").set_value("Do not write the letter e.").run()
    at.checkbox(key="tpl_every").check().run()
    at.button(key="tpl_rerun").click().run()
    _ok(at)
    body = at.get("html")[0].proto.body
    labels = [lab for lab, _ in _rows(body)]
    assert len(labels) == 6  # both rewards replayed (the constant one too): before, after, difference
    assert labels[:2] == ["ρ before", "ρ after"] and labels[2].startswith("Δρ")
    diff = BG.findall(ROW.findall(body)[2][1])
    assert any(c != "transparent" for c in diff)  # the edited text changes relevance somewhere
    after = at.session_state["tpl_after"]
    assert all(info["punctuation:no_comma"] == "Do not write the letter e." for info in after["infos"])
    assert "Rules:" in after["replay"].prompts[0]["__all__"]


def test_explore_says_cached_for_a_group_sampled_before(sampled: AppTest):
    at = sampled
    caches.sample_cached.clear()  # (an earlier test in this process may have sampled the same group)
    caches.replay_cached.clear()
    at.button(key="explore_sample").click().run()
    first = at.session_state["mrtpo_group"].timings
    assert first["sample"].endswith(" s") and first["replay"].endswith(" s")
    assert [s.label for s in at.status][0].endswith(" s)")
    at.button(key="explore_sample").click().run()  # the same inputs again: every heavy step from the caches
    _ok(at)
    t = at.session_state["mrtpo_group"].timings
    assert (t["model"], t["sample"], t["replay"]) == ("cached", "cached", "cached") and t["score"].endswith(" s")
    assert [s.label for s in at.status] == ["Group ready (cached)"]
    assert any(c.value.startswith("model cached · sample cached · score ") for c in at.caption)


def test_templates_page_shows_reward_names_literally(sampled: AppTest):
    at = sampled
    at.switch_page("pages/template-editor.py").run()
    _ok(at)
    line = next(m.value for m in at.markdown if m.value.startswith("Group "))
    assert "punctuation\\:\u200bno\\_comma" in line  # escaped: no emoji shortcode, no italics
    assert shown(line).endswith("rewards: punctuation:no_comma, keywords:existence")
    assert shown(at.text_area(key="tpl_text_0_punctuation:no_comma_rule").label) == "punctuation:no_comma"


def test_custom_prompt_rewards_default_zero():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.radio(key="explore_mode").set_value("Your own prompt").run()
    at.number_input(key="explore_max").set_value(16).run()
    at.button(key="explore_sample").click().run()
    _ok(at)
    run = at.session_state["mrtpo_group"]
    assert run.mode == "custom" and run.group.reward_names == ["no_comma", "mentions_green"]
    assert (run.group.rewards == 0).all() and sorted(run.replay.rewards) == sorted(run.group.reward_names)
    assert any("every advantage is 0" in i.value for i in at.info)
    table = next(d.value for d in at.dataframe if "GDPO A" in d.value.columns)
    assert (table["GDPO A"] == 0).all()


def test_bad_model_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MRTPO_MODEL", "/no/such/model")  # (AppTest cannot type a new option into the selectbox)
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert at.selectbox(key="mrtpo_model").value == "/no/such/model"
    at.button(key="explore_sample").click().run()
    assert not at.exception
    assert any("cannot load model" in shown(e.value) for e in at.error)


def test_a_non_causal_model_is_refused_by_name_before_sampling(monkeypatch, tmp_path):
    """A BERT folder (an encoder: its "next-token" distributions see later tokens) as the app's model: the error
    names it and why, and no group is made."""
    from tests.model.test_causal import SMALL, saved

    folder = saved(tmp_path, "BertConfig", "BertForMaskedLM", **SMALL)
    monkeypatch.setenv("MRTPO_MODEL", str(folder))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.button(key="explore_sample").click().run()
    assert not at.exception
    errors = [shown(e.value) for e in at.error]
    assert any(f"model '{folder}' (BertLMHeadModel, saved as BertForMaskedLM) is not a causal language model" in e
               for e in errors), errors
    assert "mrtpo_group" not in at.session_state or at.session_state["mrtpo_group"] is None


def test_pages_without_a_group_say_what_to_do():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/method-comparison.py").run()
    assert not at.exception
    assert any("No group yet" in i.value for i in at.info)


def test_config_hides_error_details():
    cfg = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert cfg["client"]["showErrorDetails"] == "none"
    assert cfg["server"]["fileWatcherType"] == "none"  # the watcher slowed sampling ~8× (bench/app.py)


def test_custom_empty_prompt_is_a_clear_error():
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.radio(key="explore_mode").set_value("Your own prompt").run()
    at.text_area(key="explore_prompt").set_value("   ").run()
    at.button(key="explore_sample").click().run()
    assert not at.exception
    assert any("the prompt is empty" in shown(e.value) for e in at.error)
    assert "mrtpo_group" not in at.session_state


def test_explore_sampling_is_one_sampling_config_with_the_fields_bounds(sampled: AppTest):
    """Issue 35, item 2: Explore's group size, temperature, tokens and seed are the SamplingConfig fields' widgets
    (their bounds and defaults: the CLI's and the library's), the group keeps the config's flat form (the seed in it),
    and every β slider has CreditConfig's bounds and default."""
    import dataclasses

    from mrtpo.config import to_flat
    from mrtpo.core.credit import CreditConfig
    from mrtpo.model import MAX_GROUP_SIZE

    at = sampled
    g, tokens, temp, seed = (at.number_input(key=k) for k in ("explore_g", "explore_max", "explore_temp",
                                                                "explore_seed"))
    assert (g.min, g.max, g.value) == (1, MAX_GROUP_SIZE, 4)  # was 2–32
    assert (tokens.min, tokens.max, tokens.value) == (1, None, 96)  # was 4–1024
    assert (temp.min, temp.max, temp.value) == (0.0, None, 1.0)
    assert (seed.min, seed.max, seed.value) == (0, 2 ** 53 - 1, 1)  # the fixture's seed (seeds are 0 … 2^63 − 1)
    run = at.session_state["mrtpo_group"]
    assert {k: v for k, v in run.settings.items() if k != "id"} == to_flat(SamplingConfig(seed=1))
    beta = next(f for f in dataclasses.fields(CreditConfig) if f.name == "beta")
    s = at.slider(key="explore_beta")
    assert (s.min, s.max, s.value) == (beta.metadata["lo"], beta.metadata["hi"], beta.default) == (0.0, 1.0, 0.5)
    at.number_input(key="explore_g").set_value(1).run()  # a group of one: allowed, as the CLI allows it
    assert not at.exception and at.number_input(key="explore_g").value == 1


def test_checklist_items_picker_sets_the_rewards_of_the_group():
    """The checklist task's K: the sidebar's items box picks the first K items, the group has K rewards."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    _ok(at)
    assert not [n for n in at.number_input if n.key == "mrtpo_items"]  # sql: no items box
    at.selectbox(key="mrtpo_family").set_value("checklist").run()
    at.selectbox(key="mrtpo_example").set_value("soup").run()
    assert at.number_input(key="mrtpo_items").value == 8
    at.number_input(key="mrtpo_items").set_value(3).run()
    _ok(at)
    labels = [shown(e.label) for e in at.expander]
    assert "Example **soup** (checklist) — rewards: mention:basil, mention:pepper, avoid:onion" in labels
    at.number_input(key="explore_max").set_value(8).run()
    at.button(key="explore_sample").click().run()
    _ok(at)
    run = at.session_state["mrtpo_group"]
    assert run.group.reward_names == ["mention:basil", "mention:pepper", "avoid:onion"]
    assert run.group.example.prompt.count("\n") == 3
