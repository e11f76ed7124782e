"""Inputs are never outputs, reading never creates, and flags that cannot go together are refused (issue 33, items
2, 13, 14, 15): every command that writes refuses an output that is, or is inside, one of its inputs — before any
work, leaving the input as it was."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from mrtpo.cli import main
from tests.experiment.test_experiment_claims import experiment_args, no_work

TINY = ["--model", "tiny-random", "--device", "cpu"]
VT = {"correct": "The answer must contain: {reference}"}


def _run(capsys, *argv):
    rc = main([str(x) for x in argv])
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and "internal error" not in cap.err
    return rc, cap.out, cap.err


def _trl_folder(folder):
    folder.mkdir()
    rows = [{"step": 20, "prompt": [{"role": "user", "content": "Capital of France?"}],
             "completion": [{"role": "assistant", "content": c}], "correct": float(c == "Paris"),
             "reference": "Paris"} for c in ("Paris", "Lyon")]
    pd.DataFrame(rows).to_parquet(folder / "completions_00020.parquet")
    return folder / "completions_00020.parquet"


def test_rollouts_output_inside_the_input_folder_is_refused(tmp_path, capsys):
    """The issue's command: `rollouts --input DIR --output DIR/completions_00020.parquet` exited 0 and replaced
    that input file with JSONL."""
    data = tmp_path / "completions"
    parquet = _trl_folder(data)
    before = parquet.read_bytes()
    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps(VT))
    for out, html in ((parquet, None), (data / "new.jsonl", None), (tmp_path / "o.jsonl", data / "page.html")):
        extra = ["--html", html] if html else []
        rc, _, err = _run(capsys, "rollouts", "--input", data, "--verifier-template", vt, "--output", out, *extra,
                          *TINY)
        flag, path = ("--html", html) if html else ("--output", out)
        assert rc == 2 and err.strip() == (f"error: {flag} {path} is inside the --input folder {data}: writing there "
                                           f"would change your input; give a {flag} outside it")
    assert parquet.read_bytes() == before and sorted(p.name for p in data.iterdir()) == ["completions_00020.parquet"]
    assert not (tmp_path / "o.jsonl").exists()


def test_links_to_an_input_are_the_input(tmp_path, capsys):
    """A symbolic link to the input folder, a hard link to the input file, a path through `..`: all refused."""
    data = tmp_path / "completions"
    parquet = _trl_folder(data)
    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps(VT))
    (tmp_path / "alias").symlink_to(data, target_is_directory=True)
    os.link(vt, tmp_path / "vt-hard.json")
    for out, says in ((tmp_path / "alias" / "x.jsonl", f"is inside the --input folder {data}"),
                      (tmp_path / "alias" / ".." / "completions" / "y.jsonl", f"is inside the --input folder {data}"),
                      (tmp_path / "vt-hard.json", "is the --verifier-template file: writing it would replace your "
                                                  "input")):
        rc, _, err = _run(capsys, "rollouts", "--input", data, "--verifier-template", vt, "--output", out, *TINY)
        assert rc == 2 and says in err, err
    assert parquet.exists() and json.loads(vt.read_text()) == VT


def test_every_writer_refuses_an_output_inside_its_model_folder(tmp_path, capsys, monkeypatch):
    """A local --model folder is an input too: relevance, explain, faithfulness, rollouts, train and experiment never
    write into it (checked before the model loads)."""
    no_work(monkeypatch)
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    case = tmp_path / "cases.jsonl"
    case.write_text(json.dumps({"id": "a", "prompt": "p", "verifier_info": {"k": "v"}, "response": "r"}) + "\n")
    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps({"score": "right"}))
    verl = tmp_path / "r.jsonl"
    verl.write_text('{"input": "q", "output": "a", "score": 1, "step": 1}\n')
    target = model / "config.json"
    commands = {
        "relevance --output": ["relevance", "--input", case, "--output", target],
        "explain --html": ["explain", "--task", "instructions", "--html", target],
        "explain --json": ["explain", "--task", "instructions", "--html", tmp_path / "e.html", "--json", target],
        "faithfulness --output": ["faithfulness", "--task", "instructions", "--output", target],
        "rollouts --output": ["rollouts", "--input", verl, "--verifier-template", vt, "--output", target],
        "train --db": ["train", "--task", "instructions", "--steps", "1", "--db", model / "runs.db"],
        "experiment --out": replace(experiment_args(tmp_path), "--out", model / "results"),
        "experiment --db": replace(experiment_args(tmp_path), "--db", model / "r.db"),
    }
    for what, argv in commands.items():
        flag = what.split()[1]
        argv = replace(argv, "--model", model) if "--model" in argv else [*argv, "--model", model]
        rc, _, err = _run(capsys, *argv)
        assert rc == 2 and f"error: {flag} " in err and f"inside the --model folder {model}" in err, (what, err)
    assert sorted(p.name for p in model.iterdir()) == ["config.json"] and target.read_text() == "{}"
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "e.html").exists()


def replace(args, flag, value):
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


def test_advantages_and_relevance_output_through_a_link(tmp_path, capsys):
    inp = tmp_path / "r.json"
    inp.write_text(json.dumps({"rewards": [[1], [0]]}))
    (tmp_path / "link.json").symlink_to(inp)
    rc, _, err = _run(capsys, "advantages", "--method", "gdpo", "--group-size", "2", "--input", inp,
                      "--output", tmp_path / "link.json")
    assert rc == 2 and "is the --input file: writing it would replace your input" in err
    assert json.loads(inp.read_text()) == {"rewards": [[1], [0]]}


def test_experiment_files_never_replace_the_store(tmp_path, capsys, monkeypatch):
    """`--db OUT/summary.json` made the store there, trained, then wrote the summary over the store."""
    no_work(monkeypatch)
    out = tmp_path / "out"
    rc, _, err = _run(capsys, *replace(experiment_args(tmp_path), "--db", out / "summary.json"))
    assert rc == 2 and f"--out {out / 'summary.json'} is the --db file: writing it would replace your input" in err
    assert not out.exists()


def test_train_store_inside_the_examples_folder_is_refused(tmp_path, capsys, monkeypatch):
    no_work(monkeypatch)
    spider = tmp_path / "spider"
    (spider / "database").mkdir(parents=True)
    (spider / "dev.json").write_text("[]")
    rc, _, err = _run(capsys, "train", "--task", "sql", "--examples", f"spider:{spider}", "--steps", "1",
                      "--db", spider / "database" / "runs.db", *TINY)
    assert rc == 2 and f"--db {spider / 'database' / 'runs.db'} is inside the --examples folder" in err
    assert sorted(p.name for p in (spider / "database").iterdir()) == []


# ---------------------------------------------------------------------------------------------- reading creates nothing
@pytest.mark.parametrize("argv", [["runs"], ["runs", "--json"], ["compare", "a", "b"]])
def test_reading_commands_never_create_a_store(tmp_path, capsys, argv):
    for db in (tmp_path / "typo.db", tmp_path / "missing" / "deeper" / "r.db"):
        rc, out, err = _run(capsys, *argv, "--db", db)
        assert rc == 2 and out == "" and err.startswith(f"error: no run store at {db}"), err
    assert list(tmp_path.iterdir()) == []


def test_runs_default_store_missing_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MRTPO_RUNS", raising=False)
    rc, _, err = _run(capsys, "runs")
    assert rc == 2 and "no run store at runs/mrtpo.db" in err and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------- flags that clash
def test_explain_input_with_task_is_refused(tmp_path, capsys, monkeypatch):
    """`explain --input g.json --task sql` ignored --input and sampled the sql example."""
    no_work(monkeypatch)
    g = tmp_path / "g.json"
    g.write_text(json.dumps({"prompt": "x", "verifier_info": {"a": "t"}, "responses": ["y"], "rewards": [[1]]}))
    rc, _, err = _run(capsys, "explain", "--input", g, "--task", "sql", "--html", tmp_path / "e.html", *TINY)
    assert rc == 2 and f"--input {g} is a group to explain as it is, --task sql samples one of the task's examples: " \
                       "give one of them" in err
    rc, _, err = _run(capsys, "explain", "--input", g, "--example", "3", "--html", tmp_path / "e.html", *TINY)
    assert rc == 2 and "--example goes with --task" in err
    assert not (tmp_path / "e.html").exists()


@pytest.mark.parametrize("task, spec, owner", [("sql", "bfcl:parallel", "tools"), ("tools", "spider:dev", "sql"),
                                               ("instructions", "bird:x", "sql"), ("sql", "ifeval:in.jsonl",
                                                                                   "instructions")])
def test_examples_of_another_task_name_their_task(capsys, task, spec, owner):
    """`score --task sql --examples bfcl:parallel` said "cannot read: file not found"."""
    rc, _, err = _run(capsys, "score", "--task", task, "--examples", spec, "--responses", "-")
    prefix = spec.split(":")[0]
    assert rc == 2 and err.strip().startswith(f"error: {spec}: {prefix}: examples belong to the {owner} task "
                                              f"(--task {owner}), not to '{task}'"), err


def test_empty_examples_file_is_blamed_on_the_examples(tmp_path, capsys):
    """An empty examples file was reported as "unknown id" on every line of the responses."""
    ex = tmp_path / "ex.jsonl"
    ex.write_text("\n")
    resp = tmp_path / "r.jsonl"
    resp.write_text(json.dumps({"example_id": "q1", "response": "SELECT 1"}) + "\n")
    rc, out, err = _run(capsys, "score", "--task", "sql", "--examples", ex, "--responses", resp)
    assert rc == 2 and out == "" and err.strip() == f"error: {ex}: the examples file is empty (no examples in it)"


# ---------------------------------------------------------------------------------------------- relevance as given
def test_advantages_normalizes_relevance_and_says_so(tmp_path, capsys):
    """`{"rewards":[[1],[0]],"relevance":[{"a":[0.1,0.9]},…]}` gave token advantages [0.389, 0.672] (mean 0.53, not
    the response advantage 0.707), and ρ = [0, 0] halved the other response's."""
    inp = tmp_path / "r.json"
    inp.write_text(json.dumps({"rewards": [[1], [0]], "reward_names": ["a"],
                               "relevance": [{"a": [0.1, 0.9]}, {"a": [0, 0]}]}))
    rc, out, err = _run(capsys, "advantages", "--method", "mrtpo", "--group-size", "2", "--input", inp)
    res = json.loads(out)
    assert rc == 0 and res["advantages"] == pytest.approx([0.707036, -0.707036], abs=1e-6)
    assert res["token_advantages"] == [pytest.approx([0.424233, 0.989839], abs=1e-6),
                                       pytest.approx([-0.707036, -0.707036], abs=1e-6)]
    assert sum(res["token_advantages"][0]) / 2 == pytest.approx(res["advantages"][0], abs=1e-6)
    assert err.strip() == (f"warning: {inp}: relevance is normalized to token mean 1 over each response (METHOD.md, "
                           f"MRTPO step 3): relevance[0].a has token mean 0.5: scaled to mean 1 (ρ · T / Σρ); "
                           f"relevance[1].a sums to 0: uniform credit (ρ = 1 on every token)")
    inp.write_text(json.dumps({"rewards": [[1], [0]], "relevance": [{"r0": [0.5, 1.5]}, {"r0": [1, 1]}]}))
    rc, _, err = _run(capsys, "advantages", "--method", "mrtpo", "--group-size", "2", "--input", inp)
    assert rc == 0 and err == ""  # mean 1 already: nothing to say
