"""Explore on a long group (8 responses × 2,000 tokens × 3 rewards, synthetic: no model) under AppTest: the overview
comes first (a strip per response × reward, the hottest spans in a table), one response × one reward is drawn in
full, a selected hottest span opens its response × reward, and β re-colors from the session's memo."""
from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from bench.views import synthetic_group
from mrtpo.display import overview as O
from mrtpo.display import render, token_view
from tests.app.long_group import explore_with, long_credit_log
from tests.app.test_app import APP, _ok

ROW = re.compile(r'<div class="row"><div class="lab">(.*?)</div><div class="toks">(.*?)</div></div>', re.S)


@pytest.fixture(scope="module")
def group():
    return synthetic_group(8, 2000, 3)


def _bodies(at: AppTest) -> list[str]:
    return [h.proto.body for h in at.get("html")]


def test_explore_long_group_overview_first_then_one_response_in_full(group):
    at = explore_with(AppTest.from_file(APP, default_timeout=120), group)
    _ok(at)
    bodies = _bodies(at)
    overview = next(b for b in bodies if 'class="strip"' in b)
    assert overview.count('<div class="strip">') == 8 * 3  # every response × reward
    assert '<div class="row">' not in overview and overview.count("<h3>") == 8
    # the hottest spans, as a table: 5 per response × reward, with their text
    table = at.dataframe[1].value  # (the group's table comes first)
    assert list(table.columns) == ["response", "reward", "#", "characters", "moved Σ", "ρ mean", "text"]
    assert len(table) == 8 * 3 * O.HOT_SPANS
    v = token_view(*group, "mrtpo", 0.5)
    h = O.hot_spans(v, 0, "reward_0")[0]
    first = table.iloc[0]
    assert (first["reward"], first["#"], first["text"]) == ("reward_0", 1, " ".join(h.text.split()))
    assert first["moved Σ"] == pytest.approx(h.moved, abs=1e-4)
    # one response × one reward in full: response 0, reward_0 — MRTPO, moved, ρ, the oracle's ρ; no uniform row
    full = [b for b in bodies if '<div class="row">' in b]
    assert len(full) == 1
    labels = [html.unescape(lab).split("<")[0] for lab, _ in ROW.findall(full[0])]
    assert labels[:3] == ["mrtpo β=0.5", f"moved by MRTPO: A − Â (±{render.limits(v, 'response', 0).moved:.3g})",
                          "relevance ρ"]
    assert "GDPO (uniform) <span class=\"chip\"" in full[0] and "title=" not in full[0]
    cells = len(render.token_cells(v.tokens[0]))
    assert full[0].count('<span class="tok') == len(labels) * cells  # a character's tokens drawn once
    # a hottest span of another response, selected in the table, opens that response × reward in full
    row = int(np.flatnonzero((table["reward"] == "reward_1").to_numpy() & table["response"].str.startswith("#5"))[0])
    at.session_state["explore_long_hot"] = {"selection": {"rows": [row], "columns": []}}
    at.run()
    _ok(at)
    assert at.selectbox(key="explore_response_1").value == 5
    assert at.selectbox(key="explore_long_reward").value == "reward_1"
    full = [b for b in _bodies(at) if '<div class="row">' in b][0]
    rows = ROW.findall(full)
    assert re.search(r"<b>reward_1</b> = ", full) and "reward reward_1 | JS" in html.unescape(rows[0][1])
    assert full.count('<span class="tok') == len(rows) * len(render.token_cells(v.tokens[5]))
    # β re-colors: at β = 0 the MRTPO row is GDPO's uniform share on every token (a cell: its tokens' sum)
    at.slider(key="explore_beta").set_value(0.0).run()
    _ok(at)
    full0 = [b for b in _bodies(at) if '<div class="row">' in b][0]
    v0 = token_view(*group, "mrtpo", 0.0)
    lim, uni = render.limits(v0, "response", 5), float(v0.per_reward[5, 1])
    want = [render.diverging_color(uni * len(c), lim.adv) for c in render.token_cells(v0.tokens[5])]
    assert re.findall(r'background:([^"]*)"', ROW.findall(full0)[0][1]) == want


def test_explore_long_group_combined_rows_and_downloads(group):
    at = explore_with(AppTest.from_file(APP, default_timeout=120), group)
    at.selectbox(key="explore_long_reward").set_value(O.COMBINED).run()
    _ok(at)
    full = [b for b in _bodies(at) if '<div class="row">' in b][0]
    assert "<b>combined</b>" in full and len(ROW.findall(full)) == 1
    assert len(at.get("download_button")) == 2


VIEWER = str(Path(__file__).resolve().parents[2] / "pages" / "your-rollouts.py")


def test_run_viewer_long_response_overview_then_one_reward_in_full(tmp_path, monkeypatch):
    from mrtpo.creditlog import read_credit_log
    from mrtpo.display.log_view import log_view

    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(tmp_path))
    folder, group, _ = long_credit_log(tmp_path / "log")
    at = AppTest.from_file(VIEWER, default_timeout=120)
    at.session_state["rollouts_log"] = str(folder)
    at.run()
    _ok(at)
    i = at.selectbox(key="rollouts_resp_1").value
    bodies = _bodies(at)
    overview = next(b for b in bodies if 'class="strip"' in b)
    assert overview.count('<div class="strip">') == 3 and overview.count("<h3>") == 1  # this response × 3 rewards
    rows = read_credit_log(folder).steps[0].rows
    v, _ = log_view(rows, "mrtpo")
    hot = at.dataframe[1].value
    assert len(hot) == 3 * O.HOT_SPANS
    assert hot["text"].iloc[0] == " ".join(O.hot_spans(v, i, "reward_0")[0].text.split())
    full = [b for b in bodies if '<div class="row">' in b]
    assert len(full) == 1 and "GDPO (uniform) <span class=\"chip\"" in full[0]
    assert full[0].count('<span class="tok') == len(ROW.findall(full[0])) * len(render.token_cells(v.tokens[i]))
    # another reward of the same response, from the hottest spans' table
    row = int(np.flatnonzero((hot["reward"] == "reward_2").to_numpy())[0])
    at.session_state[f"rollouts_long_1_{i}_hot"] = {"selection": {"rows": [row], "columns": []}}
    at.run()
    _ok(at)
    assert at.selectbox(key=f"rollouts_long_1_{i}_reward").value == "reward_2"
    full = [b for b in _bodies(at) if '<div class="row">' in b][0]
    assert re.search(r"<b>reward_2</b> = ", full)


def test_upload_long_rollouts_overview_first(tmp_path, monkeypatch):
    """8 completions of 2,000 characters (2,000 tokens for the tiny model's byte tokenizer), 3 rewards, replayed
    with the tiny model: the rows' overview, then one row × one reward in full."""
    import json

    from bench.views import synthetic_text

    rng = np.random.default_rng(1)
    lines = []
    for n in range(8):
        text = synthetic_text(2600, rng)[0].encode("ascii", "ignore").decode()[:2000]
        lines.append(json.dumps({"input": "Write a long answer.", "output": text, "step": 1,
                                 "score": {"a": float(n % 2), "b": float(n % 3 == 0), "c": float(n < 4)}}))
    at = AppTest.from_file(VIEWER, default_timeout=300)
    at.session_state["rollouts_source"] = "upload"
    at.session_state["rollouts_file"] = ("long.jsonl", ("\n".join(lines) + "\n").encode())
    at.session_state["rollouts_vt"] = json.dumps({"a": "Be right.", "b": "Be short.", "c": "Be kind."})
    at.run()
    _ok(at)
    bodies = _bodies(at)
    overview = next(b for b in bodies if 'class="strip"' in b)
    assert overview.count('<div class="strip">') == 8 * 3 and overview.count("<h3>Row ") == 0
    assert [f"<h3>#{i} (file row {i + 1}) — advantage " in overview for i in range(8)] == [True] * 8  # as the table
    assert len(at.dataframe[0].value) == 8 * 3 * O.HOT_SPANS
    full = [b for b in bodies if '<div class="row">' in b]
    assert len(full) == 1 and "<b>a</b> = " in full[0]
    at.selectbox(key="rollouts_long_response").set_value(6).run()
    at.selectbox(key="rollouts_long_reward").set_value("c").run()
    _ok(at)
    full = [b for b in _bodies(at) if '<div class="row">' in b][0]
    assert "<b>c</b> = 0" in full and not at.expander  # no row of every response drawn in full


def test_upload_many_medium_rows_overview_first_past_the_page_budget(monkeypatch):
    """12 rows of ~250 characters (each under the long threshold) whose heatmaps together would pass the page budget
    (scaled down to 1 MB): the rows' overview and one row × one reward in full, not every row drawn in full."""
    import json

    from mrtpo.display import page

    monkeypatch.setattr(page, "PAGE_BUDGET", 1_000_000, raising=False)
    rng = np.random.default_rng(0)
    words = "the cup of green tea is warm and kind to the reader who sips it slowly".split()
    lines = [json.dumps({"input": "Write about tea.", "output": " ".join(rng.choice(words, 60)), "step": 1,
                         "score": {"a": float(n % 2), "b": float(n % 3 == 0), "c": float(n < 6)}}) for n in range(12)]
    at = AppTest.from_file(VIEWER, default_timeout=300)
    at.session_state["rollouts_source"] = "upload"
    at.session_state["rollouts_file"] = ("medium.jsonl", ("\n".join(lines) + "\n").encode())
    at.session_state["rollouts_vt"] = json.dumps({"a": "Be right.", "b": "Be short.", "c": "Be kind."})
    at.run()
    _ok(at)
    bodies = _bodies(at)
    overview = next(b for b in bodies if 'class="strip"' in b)
    assert overview.count('<div class="strip">') == 12 * 3 and not at.expander
    assert sum(len(b.encode()) for b in bodies) < 2_000_000  # every row in full: several MB
    assert len([b for b in bodies if '<div class="row">' in b]) == 1  # one row × one reward in full
    assert any("These rows drawn in full would pass 1 MB: an overview first." in c.value for c in at.caption)
