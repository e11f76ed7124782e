"""Run store safety: the training lock, run names, atomic checkpoints on a full disk, what a checkpoint holds.

Each scenario is one a trainer used to lose or clobber steps in: a second trainer on a running run, a lock whose
heartbeat is old while its process lives, a trainer that lost its lock, run names that are paths, a full disk.
"""
import errno
import hashlib
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from mrtpo.cli import main
from mrtpo.errors import MrtpoError
from mrtpo.store import SCHEMA_VERSION, Store, validate_run_name
from mrtpo.store import lock as store_mod
from mrtpo.train import TrainConfig, Trainer
from tests.train.test_train import ToyFamily, cfg, params

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
HOST = socket.gethostname()


def snapshot(st: Store, tmp_path) -> dict:
    """Everything of the store a trainer could change: run rows, metrics, samples, probe, files and their bytes."""
    runs = {r.name: (r.steps_done, r.last_checkpoint, r.checkpoint_path, r.updated) for r in st.list_runs()}
    rows = {}
    for t in ("metrics", "samples", "probe", "probe_relevance"):
        rows[t] = st._q(f"SELECT * FROM {t} ORDER BY 1, 2, 3")
    files = {str(p.relative_to(tmp_path)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(tmp_path.rglob("*")) if p.is_file() and in_checkpoints(p, tmp_path)}
    return {"runs": runs, "rows": rows, "files": files}


def put_lock(st: Store, run_id: int, *, pid: int, host: str = HOST, age_s: float = 0.0, started=None,
             owner: str = "someone-else") -> None:
    """A lock row as another trainer would have left it."""
    st._conn.execute("INSERT OR REPLACE INTO locks VALUES (?, ?, ?, ?, ?, ?)",
                     (run_id, owner, pid, host, time.time() - age_s, started))


def in_checkpoints(p, root) -> bool:
    """Whether ``p`` is in a checkpoint folder (``<db>.checkpoints/``, or ``checkpoints/`` of older stores)."""
    return any(part.endswith("checkpoints") for part in p.relative_to(root).parts)


def checkpoint_files(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and in_checkpoints(p, tmp_path))


def same_run(st: Store, a: str, b: str) -> None:
    """Two stored runs took identical steps: every metric except wall times, and every sampled response."""
    ra, rb = st.require_run(a), st.require_run(b)
    assert ra.steps_done == rb.steps_done
    ma, mb = st.metrics(ra.id), st.metrics(rb.id)
    keys = {k for k in ma if not k.startswith("time/")}
    assert keys == {k for k in mb if not k.startswith("time/")}
    for k in keys:
        assert ma[k] == mb[k], k
    for s in range(1, ra.steps_done + 1):
        assert [x["text"] for x in st.samples(ra.id, s)] == [x["text"] for x in st.samples(rb.id, s)]


# ---------------------------------------------------------------------------------------------- the lock
def test_second_trainer_on_a_running_run_is_refused_and_changes_nothing(tmp_path):
    st = Store(tmp_path / "runs.db")
    Trainer(cfg(checkpoint_every=2, probe_size=1), st, "r", family=ToyFamily()).train(3)  # steps 1..3, checkpoint at 2
    run = st.get_run("r")
    loss = st.metrics(run.id)["loss"]
    owner = st.acquire_lock(run.id)  # the first trainer is still running (a live holder)
    before = snapshot(st, tmp_path)
    assert before["runs"]["r"][:2] == (3, 2) and before["files"]
    second = Trainer(None, st, "r", family=ToyFamily())  # reading the run changes nothing
    with pytest.raises(MrtpoError, match=f"run 'r' is being trained by pid {os.getpid()} on host {HOST}"):
        second.train(2)
    assert snapshot(st, tmp_path) == before  # steps_done, metrics, samples, probe, checkpoint files intact
    assert st.lock_holder(run.id)["owner"] == owner
    st.release_lock(run.id, owner)
    second.train(1)  # once it is free, the second trainer drops step 3 (after the checkpoint) and recomputes it
    assert st.get_run("r").steps_done == 3
    assert st.metrics(run.id)["loss"] == loss  # step 3 recomputed identically


def test_cli_second_command_while_the_first_runs(tmp_path, capsys):
    """The issue's scenario with real processes: the same `train` command while another process trains the run
    (its heartbeat long stale, the process alive) is refused and changes nothing; once that process is dead, the
    command takes the lock, resumes, and the run equals a straight one."""
    db = tmp_path / "runs.db"
    args = ["train", "--task", "instructions", "--method", "gdpo", "--model", "tiny-random", "--device", "cpu",
            "--group-size", "2", "--prompts-per-step", "1", "--max-new-tokens", "4", "--probe-size", "0",
            "--checkpoint-every", "2", "--quiet"]
    assert main(args + ["--run", "c", "--steps", "3", "--db", str(db)]) == 0
    st = Store(db)
    run = st.get_run("c")
    assert (run.steps_done, run.last_checkpoint) == (3, 3)  # every 2 steps, and the command's last step
    capsys.readouterr()
    assert main(args + ["--run", "c", "--steps", "3", "--db", str(db)]) == 0
    assert "already has 3 steps" in capsys.readouterr().err and st.get_run("c") == run
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from mrtpo.store import Store; s = Store(sys.argv[1]); "
         "s.acquire_lock(s.get_run('c').id); print('locked', flush=True); time.sleep(120)", str(db)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        st._conn.execute("UPDATE locks SET heartbeat = heartbeat - 10000")  # its step has run for hours
        before = snapshot(st, tmp_path)
        capsys.readouterr()
        assert main(args + ["--run", "c", "--steps", "5", "--db", str(db)]) == 2
        err = capsys.readouterr().err
        assert f"run 'c' is being trained by pid {holder.pid} on host {HOST}" in err
        assert "Traceback" not in err
        assert snapshot(st, tmp_path) == before
    finally:
        holder.kill()
        holder.wait()
    assert main(args + ["--run", "c", "--steps", "5", "--db", str(db)]) == 0  # a dead pid's lock is free
    assert main(args + ["--run", "straight", "--steps", "5", "--db", str(db)]) == 0
    same_run(st, "c", "straight")
    assert st.get_run("c").steps_done == 5 and st.lock_holder(st.get_run("c").id) is None


def test_stale_but_alive_lock_is_not_taken_and_dead_pid_lock_is(tmp_path):
    st = Store(tmp_path / "runs.db")
    run = st.create_run("r", {})
    proc = subprocess.Popen(["sleep", "60"])
    try:
        put_lock(st, run.id, pid=proc.pid, age_s=10_000, started=store_mod._process_start(proc.pid))
        with pytest.raises(MrtpoError, match=f"being trained by pid {proc.pid} on host {HOST} "
                                             r"\(heartbeat 10000 s ago\)"):
            st.acquire_lock(run.id)
        assert st.lock_holder(run.id)["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert st.lock_holder(run.id) is None
    put_lock(st, run.id, pid=proc.pid, age_s=0)  # fresh heartbeat, but its process is gone
    owner = st.acquire_lock(run.id)
    assert st._q("SELECT owner, pid FROM locks")[0] == (owner, os.getpid())


def test_lock_of_a_reused_pid_is_taken(tmp_path):
    st = Store(tmp_path / "runs.db")
    run = st.create_run("r", {})
    proc = subprocess.Popen(["sleep", "60"])
    try:
        start = store_mod._process_start(proc.pid)
        assert start and start != store_mod._process_start(os.getpid())
        put_lock(st, run.id, pid=proc.pid, started=start.split(":")[0] + ":1")  # that pid, an older process
        st.acquire_lock(run.id)
    finally:
        proc.kill()
        proc.wait()


def test_lock_of_another_host_goes_stale_by_heartbeat(tmp_path):
    st = Store(tmp_path / "runs.db")
    run = st.create_run("r", {})
    put_lock(st, run.id, pid=1, host="elsewhere", age_s=store_mod.STALE_LOCK_S - 10)
    with pytest.raises(MrtpoError, match="pid 1 on host elsewhere"):
        st.acquire_lock(run.id)
    put_lock(st, run.id, pid=1, host="elsewhere", age_s=store_mod.STALE_LOCK_S + 10)
    st.acquire_lock(run.id)


def test_own_process_lock_held_vs_left_behind(tmp_path):
    st = Store(tmp_path / "runs.db")
    run = st.create_run("r", {})
    owner = st.acquire_lock(run.id)
    with pytest.raises(MrtpoError, match="being trained"):
        Store(tmp_path / "runs.db").acquire_lock(run.id)  # another trainer of this process: refused
    st.release_lock(run.id, owner)
    put_lock(st, run.id, pid=os.getpid(), owner="left-behind")  # a release of this process that failed
    assert st.lock_holder(run.id) is None
    st.acquire_lock(run.id)


def test_heartbeat_is_renewed_while_a_step_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "HEARTBEAT_S", 0.05)
    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(probe_size=0), st, "r", family=ToyFamily())
    beats = []
    update = tr._update

    def slow_update(*a, **kw):
        beats.append(st._q("SELECT heartbeat FROM locks")[0][0])
        time.sleep(0.6)  # a long step
        beats.append(st._q("SELECT heartbeat FROM locks")[0][0])
        return update(*a, **kw)

    monkeypatch.setattr(tr, "_update", slow_update)
    tr.train(1)
    assert beats[1] > beats[0]
    assert st._q("SELECT COUNT(*) FROM locks")[0][0] == 0  # released at the end


def test_a_trainer_that_lost_its_lock_writes_nothing(tmp_path, monkeypatch):
    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(checkpoint_every=1, probe_size=0), st, "r", family=ToyFamily())
    tr.train(1)
    before = snapshot(st, tmp_path)
    update = tr._update

    def taken_meanwhile(*a, **kw):  # another host's trainer takes the lock during this step
        put_lock(st, tr.run_id, pid=4242, host="elsewhere", owner="other")
        return update(*a, **kw)

    monkeypatch.setattr(tr, "_update", taken_meanwhile)
    with pytest.raises(MrtpoError, match="lost the lock of run 'r' to pid 4242 on host elsewhere"):
        tr.train(1)
    assert snapshot(st, tmp_path) == before  # no step 2, no checkpoint of step 2, step 1's checkpoint kept
    assert st._q("SELECT owner FROM locks") == [("other",)]  # its release did not remove the other's lock


# ---------------------------------------------------------------------------------------------- run names
BAD_NAMES = ["x/.", "../escape", "a/b", ".", "..", "", "a" * 101, "a\\b", "-x", "a b", "ü"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_cli_refuses_bad_run_names_before_writing_anything(tmp_path, name, capsys):
    with pytest.raises(MrtpoError, match="run name|needs a name"):
        validate_run_name(name)
    db = tmp_path / "store" / "runs.db"
    assert main(["train", f"--run={name}", "--steps", "1", "--db", str(db), "--model", "tiny-random",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "run name" in err or "needs a name" in err
    assert "Traceback" not in err
    assert list(tmp_path.rglob("*")) == []  # no store, no checkpoint, nothing outside either


def test_trainer_and_store_refuse_bad_run_names(tmp_path):
    """`x/.` once resolved to run x's checkpoint folder; `../escape` to a folder outside the checkpoints."""
    st = Store(tmp_path / "store" / "runs.db")
    Trainer(cfg(checkpoint_every=1, probe_size=0), st, "x", family=ToyFamily()).train(1)
    before = snapshot(st, tmp_path)
    for name in BAD_NAMES:
        with pytest.raises(MrtpoError, match="run name|needs a name"):
            Trainer(cfg(checkpoint_every=1, probe_size=0), st, name, family=ToyFamily())
        with pytest.raises(MrtpoError, match="run name|needs a name"):
            st.create_run(name, {})
    assert snapshot(st, tmp_path) == before and st.run_names() == ["x"]
    assert {p.name for p in tmp_path.iterdir()} == {"store"}


def test_good_run_names_and_checkpoint_folder_by_id(tmp_path):
    for name in ["a", "instructions-mrtpo+dara-s0", "run_1.v2", "A" * 100]:
        assert validate_run_name(name) == name
    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(checkpoint_every=1, probe_size=0), st, "instructions-mrtpo+dara-s0", family=ToyFamily())
    tr.train(1)
    assert (tmp_path / "runs.db.checkpoints" / str(tr.run_id) / "step-000001.pt").exists()


# ---------------------------------------------------------------------------------------------- a full disk
def _full_disk(obj, f):
    """torch.save on a full disk: part of the file written, then ENOSPC."""
    if isinstance(f, (str, os.PathLike)):
        f = open(f, "wb")  # noqa: SIM115 - left open like a crashed writer's
    f.write(b"PK\x03\x04 half a checkpoint")
    f.flush()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("resume", ["new trainer", "same trainer"])
def test_full_disk_is_a_message_and_the_run_resumes_exactly(tmp_path, monkeypatch, resume):
    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(checkpoint_every=1, probe_size=1), st, "r", family=ToyFamily())
    tr.train(1)
    before = snapshot(st, tmp_path)
    with monkeypatch.context() as m:
        m.setattr(torch, "save", _full_disk)
        with pytest.raises(MrtpoError, match=r"checkpoint of step 2 in .*checkpoints.1: the disk is full") as e:
            tr.train(1)
    assert "resumes" in str(e.value)
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]  # no temp file left
    assert st._q("SELECT COUNT(*) FROM locks")[0][0] == 0  # the lock released
    assert snapshot(st, tmp_path) == before  # step 2 not stored; step 1 and its checkpoint intact
    resumed = Trainer(None, st, "r", family=ToyFamily()) if resume == "new trainer" else tr
    resumed.train(1)
    straight = Trainer(cfg(checkpoint_every=1, probe_size=1), st, "straight", family=ToyFamily())
    straight.train(2)
    same_run(st, "r", "straight")
    for k, v in params(straight).items():
        assert torch.equal(v, params(resumed)[k]), k  # bit for bit
    assert checkpoint_files(tmp_path) == ["step-000002.pt", "step-000002.pt"]  # the last one of each run


def test_full_store_disk_keeps_no_unrecorded_checkpoint(tmp_path):
    """The database's disk fills after the checkpoint file was written: the step is not stored, its checkpoint
    file is removed, the message names the store; with space back the trainer continues exactly."""
    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(checkpoint_every=1, probe_size=0), st, "r", family=ToyFamily())
    tr.train(1)
    before = snapshot(st, tmp_path)
    pages = st._q("PRAGMA page_count")[0][0]
    st._q(f"PRAGMA max_page_count = {pages}")  # SQLITE_FULL: "database or disk is full"
    with pytest.raises(MrtpoError, match=r"cannot write the run store .*runs.db: database or disk is full"):
        tr.train(1)
    assert snapshot(st, tmp_path) == before and checkpoint_files(tmp_path) == ["step-000001.pt"]
    st._q("PRAGMA max_page_count = 1073741823")
    tr.train(1)
    straight = Trainer(cfg(checkpoint_every=1, probe_size=0), st, "straight", family=ToyFamily())
    straight.train(2)
    same_run(st, "r", "straight")


# ---------------------------------------------------------------------------------------------- what is saved
def test_checkpoint_holds_what_trains_every_n_steps_last_only(tmp_path):
    assert TrainConfig().checkpoint_every == 10
    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(checkpoint_every=2, probe_size=0), st, "full", family=ToyFamily())
    tr.train(5)
    run = st.get_run("full")
    assert (run.steps_done, run.last_checkpoint) == (5, 4)
    assert checkpoint_files(tmp_path) == ["step-000004.pt"]  # steps 2 and 4 written, the last one kept
    state = torch.load(st.checkpoint_file(run), weights_only=True)
    trained = {k: p for k, p in tr.lm.model.named_parameters() if p.requires_grad}
    assert set(state["model"]) == set(trained)  # no buffers, the tied output embedding once
    assert "lm_head.weight" not in state["model"]
    opt = state["optimizer"]["state"]
    assert len(opt) == len(trained) and all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in opt.values())

    lora = Trainer(cfg(lora=True, checkpoint_every=1, probe_size=0), st, "lora", family=ToyFamily())
    lora.train(1)
    state = torch.load(st.checkpoint_file(st.get_run("lora")), weights_only=True)
    adapters = [k for k, p in lora.lm.model.named_parameters() if p.requires_grad]
    assert len(state["model"]) == len(adapters) and all("lora_" in k for k in state["model"])
    assert sum(v.numel() for v in state["model"].values()) == sum(
        p.numel() for p in lora.lm.model.parameters() if p.requires_grad)


def test_schema_1_store_with_name_paths_still_resumes(tmp_path):
    """A store written before run-id folders: checkpoint path as written then (under checkpoints/<name>/)."""
    st = Store(tmp_path / "runs.db")
    Trainer(cfg(checkpoint_every=1, probe_size=0), st, "old", family=ToyFamily()).train(1)
    run = st.get_run("old")
    legacy = tmp_path / "checkpoints" / "old" / "step-000001.pt"
    legacy.parent.mkdir(parents=True)
    os.replace(st.checkpoint_file(run), legacy)
    st._conn.execute("UPDATE runs SET checkpoint_path = ?", (str(legacy),))
    st._conn.execute("ALTER TABLE locks DROP COLUMN started")
    st._conn.execute("DROP TABLE experiments")
    st._conn.execute("DROP TABLE run_examples")
    st._conn.execute("UPDATE schema_version SET version = 1")
    st.close()
    st = Store(tmp_path / "runs.db")
    assert st._q("SELECT version FROM schema_version") == [(SCHEMA_VERSION,)] == [(4,)]
    assert st.experiment_names() == [] and st.run_examples(st.get_run("old").id) is None
    tr = Trainer(None, st, "old", family=ToyFamily())
    assert tr.steps_done == 1
    tr.train(1)
    straight = Trainer(cfg(checkpoint_every=1, probe_size=0), st, "straight", family=ToyFamily())
    straight.train(2)
    same_run(st, "old", "straight")
    assert legacy.exists()  # files outside the run's id folder are never deleted
