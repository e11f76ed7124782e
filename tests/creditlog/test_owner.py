"""One run per credit log: ``meta.json`` names its run and every row repeats it; a second run on the folder is
refused before it writes anything, naming the owner; the same run resumed continues; readers refuse a folder whose
rows and meta disagree about the run; a log written before owners were recorded still reads."""
import json
import os
import threading

import pytest

from mrtpo.creditlog import CreditLogError, CreditLogFollower, CreditLogWriter, LogOwner, read_credit_log
from mrtpo.creditlog.files import log_folder_problem
from mrtpo.errors import MrtpoError
from tests.creditlog.test_credit_log import NAMES, _credit, _rows

META = {"source": "trl", "model": "tiny-random", "method": "mrtpo", "rewards": NAMES}


def _owner(run="trl-aaa", out="/runs/a", resume=False):
    return LogOwner(run, "trl", {"output_dir": out}, resume=resume)


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_meta_and_rows_name_the_run(tmp_path):
    R, mask, credit = _credit()
    w = CreditLogWriter(tmp_path / "log", META, _owner())
    w.write_step(1, _rows(1, R, mask, credit))
    meta = json.loads((tmp_path / "log" / "meta.json").read_text())
    assert meta["run"] == "trl-aaa" and meta["owner"]["output_dir"] == "/runs/a"
    assert meta["owner"]["pid"] == os.getpid() and meta["owner"]["host"]
    lines = (tmp_path / "log" / "step-000001.jsonl").read_text().splitlines()
    assert [json.loads(x)["run"] for x in lines] == ["trl-aaa"] * 4
    assert {r.run for r in read_credit_log(tmp_path / "log").steps[0].rows} == {"trl-aaa"}
    with pytest.raises(CreditLogError, match="row 2: field 'run': is trl-bbb; this writer logs run trl-aaa"):
        w.write_step(2, [{**r, "run": "trl-bbb"} if i == 1 else r for i, r in enumerate(_rows(2, R, mask, credit))])
    anonymous = CreditLogWriter(tmp_path / "other", {"source": "test", "rewards": NAMES})  # a run of its own
    assert anonymous.meta["run"].startswith("test-") and len(anonymous.meta["run"]) == len("test-") + 12


def test_a_second_run_is_refused_naming_the_owner_and_nothing_changes(tmp_path):
    R, mask, credit = _credit()
    w = CreditLogWriter(tmp_path / "log", META, _owner())
    for s in (1, 2, 3):
        w.write_step(s, _rows(s, R, mask, credit))
    before = _files(tmp_path / "log")
    for other in (_owner("trl-bbb"),  # another run in the same output_dir
                  _owner("trl-bbb", resume=True),  # "resumed", but from another run's checkpoint
                  _owner("trl-aaa", out="/runs/a"),  # the same id, not resumed: a fresh start on a full log
                  LogOwner("mrtpo:/s.db:r2", "mrtpo", {"store": "/s.db", "run": "r2"}, resume=True)):
        with pytest.raises(MrtpoError) as e:
            CreditLogWriter(tmp_path / "log", {**META, "method": "gdpo"}, other)
        msg = str(e.value)
        assert msg.startswith(f"credit log {tmp_path / 'log'} belongs to TRL run trl-aaa (output_dir /runs/a), "
                              f"created ")
        assert f"(pid {os.getpid()})" in msg and msg.endswith("give this run another folder")
    assert _files(tmp_path / "log") == before  # nothing written: not meta.json, no step
    log = read_credit_log(tmp_path / "log")
    assert log.meta["method"] == "mrtpo" and [s.step for s in log.steps] == [1, 2, 3]


def test_the_same_run_resumed_continues_and_drops_what_it_recomputes(tmp_path):
    R, mask, credit = _credit()
    w = CreditLogWriter(tmp_path / "log", META, _owner())
    for s in (1, 2, 3):
        w.write_step(s, _rows(s, R, mask, credit))
    created = w.meta["created"]
    w2 = CreditLogWriter(tmp_path / "log", META, _owner(resume=True))
    assert w2.meta["created"] == created and w2.meta["run"] == "trl-aaa"
    assert w2.drop_after(2) == [3] and w2.drop_after(2) == []  # resumed at step 2: step 3 is recomputed
    w2.write_step(3, _rows(3, R, mask, credit, prompt="again"))
    w2.write_step(4, _rows(4, R, mask, credit))
    log = read_credit_log(tmp_path / "log")
    assert [s.step for s in log.steps] == [1, 2, 3, 4] and log.steps[2].rows[0].prompt == "again"
    with pytest.raises(MrtpoError, match="its steps were logged with method 'mrtpo'; this run resumes with method "
                                         "'gdpo': give it another folder"):
        CreditLogWriter(tmp_path / "log", {**META, "method": "gdpo"}, _owner(resume=True))
    assert [s.step for s in read_credit_log(tmp_path / "log").steps] == [1, 2, 3, 4]


def test_a_log_with_no_step_yet_is_taken_over_by_the_same_run_only(tmp_path):
    """A run that stopped before its first step left meta.json only: a new attempt of that run (same source and
    key: TRL's output_dir, mrtpo's store and run name) takes it; another run does not; the first writer, should it
    still be running, finds the folder taken and logs nothing more."""
    R, mask, credit = _credit()
    first = CreditLogWriter(tmp_path / "log", META, _owner("trl-aaa"))
    with pytest.raises(MrtpoError, match=r"belongs to TRL run trl-aaa .*\(it holds no step yet; if that run is gone, "
                                         r"delete the folder\)"):
        CreditLogWriter(tmp_path / "log", META, _owner("trl-ccc", out="/runs/c"))
    again = CreditLogWriter(tmp_path / "log", META, _owner("trl-bbb"))  # the same output_dir, a fresh start
    assert again.meta["run"] == "trl-bbb" and read_credit_log(tmp_path / "log").meta["run"] == "trl-bbb"
    with pytest.raises(MrtpoError, match="meta.json no longer names this run \\(trl-aaa\\) but trl-bbb: another "
                                         "writer took the folder; this step was not logged"):
        first.write_step(1, _rows(1, R, mask, credit))
    again.write_step(1, _rows(1, R, mask, credit))
    assert [s.step for s in read_credit_log(tmp_path / "log").steps] == [1]


def test_writers_starting_together_one_wins(tmp_path):
    """Eight runs start on one empty folder at the same moment: exactly one owns it, the others are refused."""
    won, refused, go = [], [], threading.Barrier(8)

    def start(i):
        go.wait()
        try:
            won.append(CreditLogWriter(tmp_path / "log", META, _owner(f"trl-{i}", out=f"/runs/{i}")).meta["run"])
        except MrtpoError as e:
            refused.append(str(e))

    threads = [threading.Thread(target=start, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 7 and all(f"belongs to TRL run {won[0]} " in m for m in refused)
    assert read_credit_log(tmp_path / "log").meta["run"] == won[0]
    assert [p.name for p in (tmp_path / "log").iterdir()] == ["meta.json"]  # no temporary file left


def _legacy(tmp_path):
    """A log written before owners were recorded: meta.json and rows without ``run``."""
    R, mask, credit = _credit()
    w = CreditLogWriter(tmp_path / "log", META, _owner())
    w.write_step(1, _rows(1, R, mask, credit))
    meta = tmp_path / "log" / "meta.json"
    m = json.loads(meta.read_text())
    del m["run"], m["owner"]
    meta.write_text(json.dumps(m))
    step = tmp_path / "log" / "step-000001.jsonl"
    step.write_text("".join(json.dumps({k: v for k, v in json.loads(x).items() if k != "run"}) + "\n"
                            for x in step.read_text().splitlines()))
    return tmp_path / "log"


def test_an_older_log_still_reads_and_no_run_writes_into_it(tmp_path):
    folder = _legacy(tmp_path)
    log = read_credit_log(folder)
    assert [s.step for s in log.steps] == [1] and {r.run for r in log.steps[0].rows} == {None}
    before = _files(folder)
    with pytest.raises(MrtpoError, match="belongs to a run that an older mrtpo did not record"):
        CreditLogWriter(folder, META, _owner(resume=True))
    assert _files(folder) == before


def test_readers_refuse_a_folder_whose_rows_and_meta_disagree(tmp_path):
    R, mask, credit = _credit()
    w = CreditLogWriter(tmp_path / "log", META, _owner())
    for s in (1, 2):
        w.write_step(s, _rows(s, R, mask, credit))
    f = CreditLogFollower(tmp_path / "log")
    assert [s.step for s in f.poll()] == [1, 2]
    step2 = tmp_path / "log" / "step-000002.jsonl"
    lines = step2.read_text().splitlines()
    step2.write_text("\n".join([lines[0], json.dumps({**json.loads(lines[1]), "run": "trl-bbb"}), *lines[2:]]) + "\n")
    with pytest.raises(CreditLogError) as e:
        read_credit_log(tmp_path / "log")
    assert str(e.value).startswith(f"{step2}: row 2: field 'run': is trl-bbb, but the log belongs to TRL run trl-aaa")
    assert str(e.value).endswith("the folder mixes runs; give each run its own folder")
    step2.write_text("\n".join([json.dumps({k: v for k, v in json.loads(lines[0]).items() if k != "run"}),
                                *lines[1:]]) + "\n")
    with pytest.raises(CreditLogError, match="step-000002.jsonl: row 1: field 'run': missing, but meta.json says "
                                             "the log is run trl-aaa's"):
        read_credit_log(tmp_path / "log", after_step=1)
    # an older log (no run anywhere) into which a step of a recorded run came
    folder = _legacy(tmp_path / "old")
    (folder / "step-000002.jsonl").write_text(lines[0] + "\n")
    with pytest.raises(CreditLogError, match="step-000002.jsonl: row 1: field 'run': is trl-aaa, but meta.json "
                                             "names no run"):
        read_credit_log(folder)
    # the follower: a log with no step yet taken over by a new attempt before any step was read is simply followed
    f0 = CreditLogFollower(tmp_path / "fresh")
    CreditLogWriter(tmp_path / "fresh", META, _owner("trl-1"))
    assert f0.poll() == [] and f0.meta["run"] == "trl-1"
    CreditLogWriter(tmp_path / "fresh", META, _owner("trl-2")).write_step(1, _rows(1, R, mask, credit))
    assert [s.step for s in f0.poll()] == [1] and f0.meta["run"] == "trl-2"
    # but the folder emptied and taken by another run after steps were read is an error
    step2.unlink()
    (tmp_path / "log" / "step-000001.jsonl").unlink()
    meta = tmp_path / "log" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "run": "trl-zzz"}))
    with pytest.raises(CreditLogError, match="meta.json: field 'run': the log now belongs to TRL run trl-zzz .*not "
                                             "to the run read so far \\(trl-aaa\\): open it again"):
        f.poll()
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "run": 7}))
    with pytest.raises(CreditLogError, match="meta.json: field 'run': must be the run's id \\(text\\), got 7"):
        read_credit_log(tmp_path / "log")


def test_a_folder_that_cannot_hold_a_log_is_named_before_anything_is_written(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "data").mkdir()
    assert log_folder_problem(tmp_path / "file") == "it is a file, not a folder"
    assert log_folder_problem("/proc/nope") == "cannot create the folder: No such file or directory"
    assert log_folder_problem(tmp_path / "data" / "log", {"examples": str(tmp_path / "data")}) == \
        f"it is inside the examples folder {tmp_path / 'data'}: a log never goes into an input; give another folder"
    assert not (tmp_path / "data" / "log").exists()
    assert log_folder_problem(tmp_path / "a" / "b") is None and (tmp_path / "a" / "b").is_dir()  # created
    with pytest.raises(MrtpoError, match="credit log /proc/nope: cannot create the folder: No such file"):
        CreditLogWriter("/proc/nope", META, _owner())
