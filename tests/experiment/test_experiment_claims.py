"""An experiment claims itself and its runs at once; every input is checked before any work.

From the issue "a class on one server, many runs in one folder": two ``experiment`` processes on one --out trained
a run past --steps (the step count was read before the run's lock) or failed with a misleading "a run named …
already exists"; ``--seeds 99999999999999999999`` grew the store to 15 GB; ``--methods gdpo,GDPO`` compared a method
with itself; ``--out FILE/sub`` and ``faithfulness --output FOLDER`` failed only after all the work; ``--name other``
with the same --out replaced the first experiment's summary.json."""
from __future__ import annotations

import json
import threading
import time

import pytest

from mrtpo import experiment as X
from mrtpo.cli import main
from mrtpo.errors import MrtpoError
from mrtpo.store import Store
from mrtpo.train import Trainer
from tests.experiment.test_experiment import exp_config
from tests.store.test_store import put_lock
from tests.train.test_train import ToyFamily, cfg

TINY = ["--model", "tiny-random", "--device", "cpu", "--group-size", "2", "--prompts-per-step", "1",
        "--max-new-tokens", "4", "--probe-size", "0", "--quiet"]


def test_two_experiments_at_once_never_train_a_run_past_its_steps(tmp_path):
    """Two runners of one experiment (one store file, started together): one trains, the other is refused at once
    with a message that says the experiment is being run; every run ends with exactly the experiment's steps."""
    path, exp = tmp_path / "r.db", exp_config(steps=2)
    outcomes: list = [None, None]
    barrier = threading.Barrier(2, timeout=120)  # a runner that fails before it must not leave the other waiting

    def runner(i):
        try:
            st = Store(path)  # both open the new store at once: this once failed with "database is locked"
            barrier.wait()
            X.run_experiment(st, exp, family=ToyFamily())
            outcomes[i] = "ran"
        except MrtpoError as e:
            outcomes[i] = str(e)

    threads = [threading.Thread(target=runner, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    if any(t.is_alive() for t in threads):  # fail with every thread's stack rather than hang
        import faulthandler
        import sys

        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        pytest.fail("the two runners did not finish within 300 s (a deadlock): stacks on stderr")
    assert "ran" in outcomes, outcomes
    for o in outcomes:
        assert o == "ran" or ("experiment 'toyexp' is being run: its run 'toyexp." in o and "already exists" not in o)
    st = Store(path)
    assert {n: st.get_run(n).steps_done for n in st.run_names()} == {n: 2 for _, _, n in exp.runs()}
    assert X.experiment_summary(X.read_experiment(st, exp), n_boot=100)["methods"]["gdpo"]["steps_done"] == [2, 2]
    X.run_experiment(st, exp, family=ToyFamily())  # again: nothing to do, nothing past the steps
    assert {st.get_run(n).steps_done for n in st.run_names()} == {2}


def test_steps_to_train_are_counted_under_the_lock(tmp_path):
    """A trainer made while the run had 0 steps, then stepped after another trainer brought the run to 3: asked to
    train until 3, it trains nothing (it used to train 3 more: 6 of 3)."""
    st = Store(tmp_path / "r.db")
    early = Trainer(cfg(probe_size=0, checkpoint_every=1), st, "r", family=ToyFamily())
    Trainer(None, st, "r", family=ToyFamily()).train(until=3, checkpoint_last=True)
    assert early.steps_done == 0 and early.train(until=3) == []
    assert st.get_run("r").steps_done == 3
    assert len(early.train(until=4)) == 1 and st.get_run("r").steps_done == 4


def test_a_run_held_by_another_trainer_refuses_the_whole_experiment_untouched(tmp_path):
    st = Store(tmp_path / "r.db")
    X.run_experiment(st, exp_config(steps=1), family=ToyFamily())
    before = {n: (st.get_run(n).steps_done, st.get_run(n).updated) for n in st.run_names()}
    info = st.get_experiment("toyexp")
    put_lock(st, st.get_run("toyexp.mrtpo.s1").id, pid=1)  # a live process (pid 1) trains one of its runs
    three = X.ExperimentConfig("toyexp", ["gdpo", "mrtpo"], 3, 2, exp_config().base)
    with pytest.raises(MrtpoError, match=r"experiment 'toyexp' is being run: its run 'toyexp.mrtpo.s1' is being "
                                         r"trained by pid 1 .*nothing was changed"):
        X.run_experiment(st, three, family=ToyFamily())
    assert {n: (st.get_run(n).steps_done, st.get_run(n).updated) for n in st.run_names()} == before  # no s2 runs
    assert st.get_experiment("toyexp") == info and st._q("SELECT owner FROM locks") == [("someone-else",)]


# ---------------------------------------------------------------------------------------------- inputs
def experiment_args(tmp_path, *extra):
    return ["experiment", "--task", "instructions", "--methods", "gdpo,mrtpo", "--seeds", "1", "--steps", "1",
            "--out", str(tmp_path / "out"), "--db", str(tmp_path / "r.db"), *TINY, *extra]


def replace_flag(args, flag, value):
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


@pytest.mark.parametrize("seeds", ["99999999999999999999", "1000000", "1001", "0"])
def test_seeds_and_steps_are_bounded_before_anything_is_written(tmp_path, seeds, capsys):
    t0 = time.perf_counter()
    assert main(replace_flag(experiment_args(tmp_path), "--seeds", seeds)) == 2
    assert "argument --seeds: must be an integer in [1, 1000]" in capsys.readouterr().err
    assert main(replace_flag(experiment_args(tmp_path), "--steps", "10000000")) == 2
    assert "argument --steps: must be an integer in [1, 1000000]" in capsys.readouterr().err
    assert time.perf_counter() - t0 < 20 and list(tmp_path.iterdir()) == []
    with pytest.raises(MrtpoError, match=r"--seeds in \[1, 1000\], not 99999999999999999999"):
        X.ExperimentConfig("e", ["gdpo", "mrtpo"], 99999999999999999999, 1, {})


def test_methods_are_compared_after_normalizing_their_names(tmp_path, capsys):
    with pytest.raises(MrtpoError, match=r"given twice in --methods / --arms: gdpo \(as gdpo, GDPO\)"):
        X.ExperimentConfig("e", ["gdpo", "GDPO"], 1, 1, {})
    e = X.ExperimentConfig("e", ["GDPO", "MRTPO+Dara"], 1, 1, {})
    assert e.methods == ["gdpo", "mrtpo+dara"] and [r[2] for r in e.runs()] == ["e.gdpo.s0", "e.mrtpo+dara.s0"]
    assert main(replace_flag(experiment_args(tmp_path), "--methods", "gdpo,GDPO")) == 2
    assert "given twice in --methods / --arms: gdpo (as gdpo, GDPO)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def no_work(monkeypatch):
    """Loading a model fails the test: the checks must come before any work."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the output path was checked")

    monkeypatch.setattr("mrtpo.model.load_model", refuse)
    monkeypatch.setattr("mrtpo.train.policy.load_model", refuse)


def test_output_paths_are_checked_before_the_work(tmp_path, monkeypatch, capsys):
    no_work(monkeypatch)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    args = replace_flag(experiment_args(tmp_path), "--out", str(a_file / "sub"))
    assert main(args) == 2
    assert f"--out {a_file / 'sub'}: {a_file} is a file, not a folder; nothing was done" in capsys.readouterr().err
    assert main(replace_flag(experiment_args(tmp_path), "--out", str(a_file))) == 2
    assert "it is a file, not a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no store either
    folder = tmp_path / "results"
    folder.mkdir()
    for argv in (["faithfulness", "--task", "instructions", "--limit", "1", "--model", "tiny-random", "--output",
                  str(folder)],
                 ["faithfulness", "--task", "instructions", "--output", str(tmp_path / "missing" / "f.json")],
                 ["relevance", "--input", str(a_file), "--output", str(folder)],
                 ["explain", "--task", "instructions", "--html", str(folder), "--model", "tiny-random"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert ("it is a folder; give a file name" in err or "does not exist" in err) and "nothing was done" in err
    assert main(["relevance", "--input", str(a_file), "--output", str(a_file)]) == 2
    assert "is the --input file: writing it would replace your input" in capsys.readouterr().err
    assert a_file.read_text() == "mine"


def test_another_experiment_in_the_same_out_is_refused(tmp_path, monkeypatch, capsys):
    """``--name other`` with the --out of experiment 'out': refused before any work, its summary.json kept."""
    no_work(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"experiment": "out", "steps": 1}))
    assert main(experiment_args(tmp_path, "--name", "other")) == 2
    err = capsys.readouterr().err
    assert "--out " + str(out) + " holds the outputs of experiment 'out'; give experiment 'other' its own --out" in err
    assert json.loads((out / "summary.json").read_text()) == {"experiment": "out", "steps": 1}
    assert not (tmp_path / "r.db").exists()
