"""Bring-your-own-rollouts: readers, grouping, sandboxed verifier templates, messages, explain, CLI, app page."""
import json
import os
import re

import numpy as np
import pandas as pd
import pytest

from mrtpo.integrations import rollout_explain as rx
from mrtpo.integrations import rollouts as ro
from mrtpo.templates import TemplateError, fill_fields, template_fields

COMPLETIONS = ["Paris is the capital.", "It is Lyon.", "4", "I think 5"]
PROMPTS = (("Name the capital of France.", "Paris"), ("What is 2+2?", "4"))
VT = {"correct": "The answer must contain: {reference}", "short": "Answer in under 10 characters."}


def _rows():
    rows = []
    for step in (1, 2):
        for p, ref in PROMPTS:
            for j, c in enumerate(COMPLETIONS):
                rows.append({"step": step, "prompt": [{"role": "user", "content": p}],
                             "completion": [{"role": "assistant", "content": c}],
                             "correct": float(ref in c), "short": float(len(c) < 10), "reference": ref,
                             "advantage": 0.1 * j})
    return rows


@pytest.fixture()
def trl_file(tmp_path):
    path = tmp_path / "completions_00002.parquet"
    pd.DataFrame(_rows()).to_parquet(path)
    return path


@pytest.fixture()
def verl_file(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    with open(path, "w") as f:
        for r in _rows():
            prompt = f"<|im_start|>user\n{r['prompt'][0]['content']}<|im_end|>\n<|im_start|>assistant\n"
            f.write(json.dumps({"input": prompt,
                                "output": r["completion"][0]["content"], "step": r["step"], "gts": r["reference"],
                                "score": {"correct": r["correct"], "short": r["short"]}}) + "\n")
    return path


def test_fill_fields_is_plain_lookup():
    assert fill_fields("ref {reference} {{literal}}", {"reference": "Paris"}) == "ref Paris {literal}"
    assert template_fields("{a} and {b}") == ["a", "b"]
    for bad in ("{reference.upper}", "{reference[0]}", "{reference!r}", "{reference:>9}", "{__class__}"):
        with pytest.raises(TemplateError, match="unknown placeholder"):
            fill_fields(bad, {"reference": "Paris"})
    with pytest.raises(TemplateError, match="stray"):
        template_fields("a { b")


def test_read_trl_groups_by_step_and_prompt(trl_file):
    rows = ro.read_rollouts(trl_file)
    assert len(rows) == 16 and rows[0].row == 1 and rows[-1].row == 16
    assert rows[0].prompt == "Name the capital of France." and rows[0].completion == COMPLETIONS[0]
    groups = ro.group_rows(rows)
    assert [(g.step, len(g.rows)) for g in groups] == [(1, 4), (1, 4), (2, 4), (2, 4)]
    vt = rx.RolloutVerifierInfo.from_dict(VT)
    sg = rx.scored_group(groups[0], vt)
    np.testing.assert_array_equal(sg.rewards, [[1, 0], [0, 0], [0, 1], [0, 1]])
    assert sg.verifier_info[0] == {"correct": "The answer must contain: Paris", "short": VT["short"]}
    assert rows[2].advantage == pytest.approx(0.2)


def test_read_verl_chat_input_and_score_dict(verl_file):
    rows = ro.read_rollouts(verl_file)
    assert rows[4].prompt == "What is 2+2?" and rows[4].fields["gts"] == "4"
    vt = rx.RolloutVerifierInfo.from_dict({"correct": "Must contain {gts}", "short": "Under 10 characters."})
    sg = rx.scored_group(ro.group_rows(rows)[1], vt)
    np.testing.assert_array_equal(sg.rewards[:, 0], [0, 0, 1, 0])
    assert sg.verifier_info[2]["correct"] == "Must contain 4"


def test_malformed_files_name_row_and_column(tmp_path, trl_file):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "q", "output": "a", "score": 1}\n\n{"input": "q", "output": "a", "score": "high"}\n')
    rows = ro.read_rollouts(bad)
    with pytest.raises(ro.RolloutFileError, match=r"bad.jsonl: row 3: column 'score': must be a number"):
        rx.RolloutVerifierInfo.from_dict({"score": "x"}).rewards_of(rows[1])
    bad.write_text('{"input": "q", "output": "a"}\n{oops\n')
    with pytest.raises(ro.RolloutFileError, match=r"bad.jsonl: row 2: not valid JSON"):
        ro.read_rollouts(bad)
    bad.write_text('{"input": "q", "output": 5}\n')
    with pytest.raises(ro.RolloutFileError, match=r"row 1: column 'output': expected text or a list of chat"):
        ro.read_rollouts(bad)
    rows = ro.read_rollouts(trl_file)
    with pytest.raises(ro.RolloutFileError,
                       match=r"row 1: column 'gold': missing, but the verifier template of reward 'correct'"):
        rx.RolloutVerifierInfo.from_dict({"correct": "{gold}"}).info(rows[0])
    with pytest.raises(ro.RolloutFileError,
                       match=r"row 1: column 'accuracy': missing.*numeric columns: correct, short"):
        rx.RolloutVerifierInfo.from_dict({"accuracy": "x"}).rewards_of(rows[0])
    df = pd.DataFrame(_rows()).drop(columns=["completion"])
    df.to_parquet(tmp_path / "nocomp.parquet")
    with pytest.raises(ro.RolloutFileError, match=r"column 'completion': missing \(columns: step, prompt"):
        ro.read_rollouts(tmp_path / "nocomp.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(ro.RolloutFileError, match="not a readable parquet file"):
        ro.read_rollouts(tmp_path / "junk.parquet")
    with pytest.raises(TemplateError, match="must be a JSON object"):
        rx.RolloutVerifierInfo.from_json("[1, 2]")


def test_explain_group_numbers(tiny, trl_file):
    rows = ro.read_rollouts(trl_file)
    items = rx.explain_rollouts(tiny, rows, rx.RolloutVerifierInfo.from_dict(VT), method="mrtpo", beta=0.5, step=2,
                                max_groups=1)
    assert len(items) == 1 and items[0].group.step == 2
    v = items[0].view
    for i, ta in enumerate(v.token_adv):  # MRTPO redistributes: token mean = response-level GDPO advantage
        assert len(ta) == len(v.tokens[i]) > 0
        assert ta.mean() == pytest.approx(v.final[i], abs=1e-5)
        for k in v.reward_names:
            assert v.relevance[i][k].mean() == pytest.approx(1.0, abs=1e-5)
    assert np.std(v.relevance[0]["correct"]) > 0  # the replayed reward has non-uniform relevance
    out = rx.group_json(items[0])
    assert out["rows"] == [9, 10, 11, 12] and out["step"] == 2
    assert out["logged_advantage"][1] == pytest.approx(0.1)
    page = rx.page_html(items)
    assert page.count('class="tok"') > 50 and "<script" not in page
    # one numbering: the sections are the rewards table's responses 0..3 (numbered from 0, as everywhere), each
    # with the file row it came from
    import re

    assert re.findall(r"<tr><td>(\d+)</td>", page) == ["0", "1", "2", "3"]
    heads = re.findall(r"<h3>(.*?) — advantage", page)
    assert heads == ["Response 0 (file row 9)", "Response 1 (file row 10)", "Response 2 (file row 11)",
                     "Response 3 (file row 12)"] and "Row " not in page
    assert f"Response 1 (file row 10) — advantage {v.final[1]:+.3f} (logged +0.100)</h3>" in page


def test_cli_rollouts(tmp_path, verl_file, capsys):
    from mrtpo.cli import main

    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps({"correct": "Must contain {gts}", "short": "Under 10 characters."}))
    out, page = tmp_path / "o.jsonl", tmp_path / "o.html"
    rc = main(["rollouts", "--input", str(verl_file), "--verifier-template", str(vt), "--output", str(out),
               "--html", str(page), "--model", "tiny-random", "--device", "cpu", "--max-groups", "2"])
    assert rc == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2 and len(lines[0]["responses"]) == 4
    assert lines[0]["prompt"] == "Name the capital of France."
    assert "2 groups (of 4" in capsys.readouterr().err
    assert page.read_text().count('class="tok"') > 50
    vt.write_text(json.dumps({"correct": "Must contain {gold}"}))
    rc = main(["rollouts", "--input", str(verl_file), "--verifier-template", str(vt), "--output", str(out),
               "--model", "tiny-random"])
    err = capsys.readouterr().err
    assert rc == 2 and "row 1: column 'gold': missing" in err and "Traceback" not in err


def test_app_page(trl_file, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("MRTPO_MODEL", "tiny-random")
    at = AppTest.from_file(os.path.join(os.path.dirname(__file__), "..", "..", "pages", "your-rollouts.py"),
                           default_timeout=60)
    at.session_state["rollouts_source"] = "upload"  # (the default view follows a run's log)
    at.run()
    assert not at.exception and "Upload a file" in at.info[0].value
    at.session_state["rollouts_file"] = ("completions_00002.parquet", trl_file.read_bytes())
    at.run()
    assert not at.exception and not at.error
    bodies = [h.proto.body for h in at.get("html")]
    assert sum(b.count('class="tok"') for b in bodies) > 100
    at.session_state["rollouts_file"] = ("bad.jsonl", b'{"input": "q", "output": "a"}\n{oops\n')
    at.run()
    shown = re.sub(r"\\(.)", r"\1", at.error[0].value).replace("\u200b", "")  # the markdown, as displayed
    assert "bad.jsonl: row 2: not valid JSON" in shown and "column '" not in shown
    at.session_state["rollouts_file"] = ("garbage.parquet", bytes(range(256)) * 4)  # the upload
    at.run()
    shown = re.sub(r"\\(.)", r"\1", at.error[0].value).replace("\u200b", "")
    assert shown == ("reading garbage.parquet: garbage.parquet: not a readable parquet file (Parquet magic bytes not "
                     "found in footer. Either the file is corrupted or this is not a parquet file)")
