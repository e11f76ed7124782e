"""The run viewer (Your rollouts, "Follow a run's log") under AppTest: a credit log written by the library's writer
grows between two reruns; the new step shows, the old step files are not read again; other tools' logs and bad
paths."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.testing.v1 import AppTest  # noqa: E402

from tests.creditlog.test_credit_log import _credit, _rows, _writer  # noqa: E402

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "your-rollouts.py")
FIX = Path(__file__).resolve().parents[1] / "integrations" / "fixtures"


@pytest.fixture(autouse=True)
def _logs_root(tmp_path, monkeypatch):
    """The app reads logs under its roots only: these tests' folders are the roots."""
    monkeypatch.setenv("MRTPO_LOGS_ROOT", f"{tmp_path}{os.pathsep}{FIX}")


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _shown(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown).replace("\u200b", "")


def _viewer(path) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["rollouts_log"] = str(path)
    at.run()
    _ok(at)
    return at


def test_viewer_follows_a_growing_credit_log_without_rereading_old_steps(tmp_path, monkeypatch):
    import mrtpo.creditlog.files as F

    R, mask, credit = _credit()
    w = _writer(tmp_path)
    for s in (1, 2):
        w.write_step(s, _rows(s, R, mask, credit))
    read = []
    real = F.read_step_file
    monkeypatch.setattr(F, "read_step_file",
                        lambda p, step=None, bad=None: read.append(Path(p).name) or real(p, step, bad))
    at = _viewer(tmp_path / "log")
    assert read == ["step-000001.jsonl", "step-000002.jsonl"]
    assert at.selectbox(key="rollouts_step").value == 2  # the newest step
    assert any("2 steps" in m.value for m in at.markdown)
    # the step's table: 2 groups × 2 responses, each reward's value and Â as logged (4 decimals)
    table = at.dataframe[0].value
    assert table["group"].tolist() == [0, 0, 1, 1] and table["format"].tolist() == R[:, 0].tolist()
    np.testing.assert_allclose(table["Â format"].to_numpy(), credit.adv.per_reward[:, 0].numpy(), atol=1e-4)
    # the response shown first: the first with a nonzero advantage (group 0's two rewards cancel: advantage 0)
    assert table["advantage"].tolist()[:3] == [0.0, 0.0, pytest.approx(1.2246)]
    assert at.selectbox(key="rollouts_resp_2").value == 2
    # its heatmaps from the logged numbers (no model): 'format' was replayed (GDPO | MRTPO, moved | ρ), 'correct'
    # varies in group 1 but was not replayed (GDPO | MRTPO rows, ρ = 1), then the combined pair
    body = at.get("html")[0].proto.body
    assert body.count('<span class="tok"') == 4 * (4 + 4 + 2) and "GDPO (uniform)" in body and "β=0.5" in body
    # its token table: one row per token with the logged per-reward advantages and ρ
    tokens = at.dataframe[1].value
    assert len(tokens) == 4 and tokens["ρ:format"].tolist() == pytest.approx([2.0, 1.0, 0.5, 0.5])
    np.testing.assert_allclose(tokens["A:format"].to_numpy(), credit.per_reward[2, 0, :4].numpy(), atol=1e-5)
    np.testing.assert_allclose(tokens["A"].to_numpy(), credit.tokens[2, :4].numpy(), atol=1e-5)
    assert tokens["p"].tolist() == pytest.approx([np.exp(-0.5)] * 4)
    # the curves over steps: one line per reward in each panel
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert {t["name"] for t in chart["data"]} == {"format", "correct"}

    # the run writes step 3: a rerun shows it (the picker moves on to it) and reads only its file
    read.clear()
    w.write_step(3, _rows(3, R, mask, credit, texts=("new one", "xyz", "hi!!", "no")))
    at.run()
    _ok(at)
    assert read == ["step-000003.jsonl"]
    assert at.selectbox(key="rollouts_step").value == 3 and any("3 steps" in m.value for m in at.markdown)
    assert at.dataframe[0].value["response"].tolist()[0] == "new one"
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert max(x for t in chart["data"] for x in t["x"]) == 3
    # nothing new: nothing read; an older step picked stays picked when step 4 comes
    read.clear()
    at.selectbox(key="rollouts_step").set_value(1).run()
    _ok(at)
    assert read == [] and at.selectbox(key="rollouts_step").value == 1
    w.write_step(4, _rows(4, R, mask, credit))
    at.run()
    assert read == ["step-000004.jsonl"] and at.selectbox(key="rollouts_step").value == 1
    assert at.selectbox(key="rollouts_step").options == ["1", "2", "3", "4"]


def test_viewer_on_an_openrlhf_board_log_and_a_verl_dump_with_references(tmp_path):
    board = tmp_path / "board.jsonl"
    line = {"prompt": "Rhyme?", "response": "Moon June", "response_tokens": ["Moon", " June"], "logprobs": [-0.1, -2.0],
            "ref_logprobs": [-0.2, -1.0], "values": [0.1, 0.2], "token_rewards": [0.0, 1.0], "reward": 1.0,
            "ref_response": "Moon and June."}
    board.write_text("".join(json.dumps({**line, "step": s}) + "\n" for s in (1, 1, 2)))
    at = _viewer(board)
    assert at.selectbox(key="rollouts_step").options == ["1"]  # step 2 is held back until a later one appears
    body = at.get("html")[0].proto.body
    for label in ("probability p", "KL to the reference", "token reward", "value (critic)"):
        assert label in body
    assert any("Moon and June." in t.value for t in at.text)  # the reference
    assert at.dataframe[1].value["kl"].tolist() == pytest.approx([0.1, -1.0])
    verl = tmp_path / "verl"
    verl.mkdir()
    (verl / "1.jsonl").write_text(json.dumps({"input": "2+2?", "output": "4", "score": 1.0, "step": 1,
                                              "ground_truth": "4"}) + "\n")
    at.text_input(key="rollouts_log").set_value(str(verl)).run()
    _ok(at)
    assert any("verl JSONL dump" in m.value for m in at.markdown)
    assert "ground_truth" in _shown(" ".join(m.value for m in at.markdown)) and any(t.value == "4" for t in at.text)
    assert any("no tokens" in c.value for c in at.caption)


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "nowhere", "no such file or folder"),
    (lambda p: (p / "junk.jsonl").write_text('{"a": 1}\n') and p / "junk.jsonl", "in none of the formats"),
    (lambda p: (p / "bad.jsonl").write_text("{oops\n") and p / "bad.jsonl", "row 1"),
])
def test_viewer_bad_paths_and_files_are_messages(tmp_path, make, message):
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["rollouts_log"] = str(make(tmp_path))
    at.run()
    assert not at.exception
    assert message in _shown(at.error[0].value)


def test_viewer_a_credit_log_with_no_step_yet_and_the_format_picker(tmp_path):
    R, mask, credit = _credit()
    _writer(tmp_path)  # meta.json only: the run has not finished a step
    at = _viewer(tmp_path / "log")
    assert "No complete step" in _shown(at.info[0].value)
    _writer(tmp_path).write_step(1, _rows(1, R, mask, credit))
    at.button(key="rollouts_check").click().run()
    _ok(at)
    assert at.selectbox(key="rollouts_step").options == ["1"]
    at.selectbox(key="rollouts_log_format").set_value("board").run()  # a wrong format, picked by hand: every row
    assert not at.exception and "field 'response': missing" in _shown(at.warning[0].value)  # skipped, each said


@pytest.mark.parametrize("folder, fmt, steps, rows", [
    ("board", "OpenRLHF board JSONL", ["1"], "probability p"),  # the newest step held back (ranks may be writing)
    ("prime_rl", "prime-rl token export", ["1", "2"], "advantage A_t"),  # step 3 has no STABLE yet
])
def test_viewer_on_the_tool_fixtures(folder, fmt, steps, rows, tmp_path):
    import shutil

    shutil.copytree(FIX / folder, tmp_path / folder, copy_function=shutil.copy)  # fresh: a run still writing
    at = _viewer(tmp_path / folder)
    assert any(fmt in _shown(m.value) for m in at.markdown)
    assert at.selectbox(key="rollouts_step").options == steps
    assert rows in at.get("html")[0].proto.body and len(at.dataframe[1].value) > 0  # heatmap rows, token table


def test_viewer_on_a_run_folder_finds_its_log(tmp_path):
    """A TRL output folder: its credit log (a child folder with meta.json) is followed; without one, its
    completions/ parquet files."""
    import pandas as pd

    R, mask, credit = _credit()
    _writer(tmp_path).write_step(1, _rows(1, R, mask, credit))  # tmp_path/log
    (tmp_path / "completions").mkdir()
    pd.DataFrame({"step": [1, 1], "prompt": ["q", "q"], "completion": ["a", "b"], "r": [1.0, 0.0],
                  "advantage": [0.7, -0.7]}).to_parquet(tmp_path / "completions" / "completions_00001.parquet")
    at = _viewer(tmp_path)
    text = _shown(" ".join(m.value for m in at.markdown))
    assert "mrtpo credit log · in " + str(tmp_path / "log") in text
    (tmp_path / "log" / "meta.json").unlink()
    at = _viewer(tmp_path)
    text = _shown(" ".join(m.value for m in at.markdown))
    assert "TRL completions parquet · in " + str(tmp_path / "completions") in text
    assert at.dataframe[0].value["r"].tolist() == [1.0, 0.0]


def test_a_bad_step_file_is_a_warning_above_the_steps_read_before(tmp_path):
    R, mask, credit = _credit()
    w = _writer(tmp_path)
    w.write_step(1, _rows(1, R, mask, credit))
    at = _viewer(tmp_path / "log")
    (tmp_path / "log" / "step-000002.jsonl").write_text("{oops\n")
    at.run()
    assert not at.exception and not at.error
    assert "step-000002.jsonl: row 1: not valid JSON" in _shown(at.warning[0].value)
    assert at.selectbox(key="rollouts_step").options == ["1", "2"]  # step 2: its one row skipped, an empty step
    assert "empty step" in _shown(at.info[0].value)
    at.selectbox(key="rollouts_step").set_value(1).run()
    _ok(at)
    assert at.get("html")  # step 1 still shown
