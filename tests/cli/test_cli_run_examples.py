"""A run stores what it read, not how it was typed (issue 33, item 3): `--examples spider:spider` was stored as
typed, so a resume from another working folder failed, or trained on another folder's data under the same ids
without a word. The path is stored absolute and the examples' fingerprint with the run; a resume that finds other
examples is refused, naming the first one that changed."""
from __future__ import annotations

import json

from mrtpo.cli import main
from mrtpo.store import Store
from mrtpo.tasks.base import sample_data
from mrtpo.train import TrainConfig

ARGS = ["train", "--task", "instructions", "--method", "gdpo", "--model", "tiny-random", "--device", "cpu",
        "--group-size", "2", "--prompts-per-step", "1", "--max-new-tokens", "4", "--probe-size", "0", "--quiet",
        "--run", "r"]
LINES = [json.loads(x) for x in sample_data("instructions", "prompts.jsonl").read_text().splitlines()[:4]]


def _write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _ids(st, step):
    return {s["example_id"] for s in st.samples(st.require_run("r").id, step)}


def test_resume_from_another_folder_reads_the_same_examples(tmp_path, monkeypatch, capsys):
    db = tmp_path / "r.db"
    mine = _write(tmp_path / "a" / "ex.jsonl", LINES[:2])
    _write(tmp_path / "b" / "ex.jsonl", LINES[2:])  # another folder's ex.jsonl: other examples
    monkeypatch.chdir(tmp_path / "a")
    assert main([*ARGS, "--examples", "ex.jsonl", "--steps", "1", "--db", str(db)]) == 0
    st = Store(db)
    run = st.require_run("r")
    assert run.config["examples"] == str(mine)  # absolute
    spec, fp = st.run_examples(run.id)
    assert spec == str(mine) and fp["count"] == 2
    capsys.readouterr()
    assert main([*ARGS, "--examples", "ex.jsonl", "--steps", "2", "--db", str(db)]) == 0
    assert "ignoring" not in capsys.readouterr().err  # the same file, typed the same way: nothing to ignore
    monkeypatch.chdir(tmp_path / "b")
    assert main([*ARGS, "--steps", "4", "--db", str(db)]) == 0
    assert st.require_run("r").steps_done == 4
    assert set().union(*(_ids(st, s) for s in (1, 2, 3, 4))) <= {x["id"] for x in LINES[:2]}


def test_resume_with_changed_examples_is_refused(tmp_path, monkeypatch, capsys):
    db = tmp_path / "r.db"
    mine = _write(tmp_path / "ex.jsonl", LINES[:3])
    assert main([*ARGS, "--examples", str(mine), "--steps", "1", "--db", str(db)]) == 0
    changed = [LINES[0], dict(LINES[1], task="A different question entirely."), LINES[2]]
    _write(mine, changed)
    capsys.readouterr()
    assert main([*ARGS, "--steps", "2", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert f"error: run 'r' was created with other examples than {mine} holds now: example {LINES[1]['id']!r} " \
           f"(number 2) is not the one the run was created with (its id or text changed). Nothing was trained" in err
    st = Store(db)
    assert st.require_run("r").steps_done == 1
    _write(mine, LINES[:3])  # given back: the run goes on
    assert main([*ARGS, "--steps", "2", "--db", str(db)]) == 0 and st.require_run("r").steps_done == 2


def test_older_runs_still_load_and_record_their_examples_on_resume(tmp_path, monkeypatch):
    """A config stored before (a relative path, no fingerprint) loads; its first resume records the examples."""
    monkeypatch.chdir(tmp_path)
    old = TrainConfig.from_dict({"task": "instructions", "examples": "ex.jsonl", "relevance_measure": "js"})
    assert old.examples == str(tmp_path / "ex.jsonl")
    db = tmp_path / "r.db"
    _write(tmp_path / "ex.jsonl", LINES[:2])
    assert main([*ARGS, "--examples", "ex.jsonl", "--steps", "1", "--db", str(db)]) == 0
    st = Store(db)
    run = st.require_run("r")
    st._conn.execute("DELETE FROM run_examples")
    st._conn.execute("UPDATE runs SET config = ?", (json.dumps({**run.config, "examples": "ex.jsonl"}),))
    assert st.run_examples(run.id) is None
    assert main([*ARGS, "--steps", "2", "--db", str(db)]) == 0
    assert st.run_examples(run.id)[1]["count"] == 2 and st.require_run("r").steps_done == 2


def test_a_library_trainer_resumed_on_changed_examples_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """Runs made by the app or by library code are checked too: the Trainer records the examples when it creates the
    run and refuses a resume on other ones before it loads a model."""
    from mrtpo.errors import MrtpoError
    from mrtpo.train import Trainer
    from mrtpo.train import loop as L

    mine = _write(tmp_path / "ex.jsonl", LINES[:3])
    cfg = TrainConfig.from_dict(dict(model="tiny-random", device="cpu", task="instructions", method="gdpo",
                                     group_size=2, prompts_per_step=1, max_new_tokens=4, probe_size=0,
                                     examples=str(mine)))
    st = Store(tmp_path / "r.db")
    tr = Trainer(cfg, st, "r")
    assert st.run_examples(tr.run_id)[1]["count"] == 3  # recorded at creation
    tr.close()
    _write(mine, [LINES[0], dict(LINES[1], task="A different question entirely."), LINES[2]])
    monkeypatch.setattr(L.Policy, "build", lambda *a, **k: (_ for _ in ()).throw(AssertionError("model loaded")))
    try:
        Trainer(None, st, "r")
    except MrtpoError as e:
        assert f"example {LINES[1]['id']!r} (number 2) is not the one the run was created with" in str(e)
    else:
        raise AssertionError("a resume on changed examples was not refused")
