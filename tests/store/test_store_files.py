"""The store's files: checkpoints named by the store (two stores in one folder never share one; the older shared
folder is still read), and files that are not a writable mrtpo store refused untouched with a message that says
what they are (another program's SQLite database, a text file, a folder, a read-only store or folder)."""
import hashlib
import os
import sqlite3

import pytest
import torch

from mrtpo.cli import main
from mrtpo.errors import MrtpoError
from mrtpo.store import Store
from mrtpo.store import schema as schema_mod
from mrtpo.train import Trainer
from tests.store.test_store import same_run
from tests.train.test_train import ToyFamily, cfg, params


def tree(folder) -> dict:
    """Every file under ``folder`` with its bytes' hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------- checkpoints
def test_two_stores_in_one_folder_keep_their_own_checkpoints(tmp_path):
    """Issue: ``--db DIR/a.db`` and ``--db DIR/b.db`` both wrote DIR/checkpoints/1/: b's pruning deleted a's file
    ("checkpoint … of step 3 is missing"), and at the same step a resumed from b's weights."""
    a, b = Store(tmp_path / "a.db"), Store(tmp_path / "b.db")
    Trainer(cfg(checkpoint_every=1, probe_size=0, seed=3), a, "r", family=ToyFamily()).train(3)
    Trainer(cfg(checkpoint_every=1, probe_size=0, seed=4), b, "r", family=ToyFamily()).train(1)  # also run id 1
    assert a.get_run("r").id == b.get_run("r").id == 1
    assert a.checkpoint_file(a.get_run("r")) == tmp_path / "a.db.checkpoints" / "1" / "step-000003.pt"
    assert b.checkpoint_file(b.get_run("r")) == tmp_path / "b.db.checkpoints" / "1" / "step-000001.pt"
    resumed = Trainer(None, a, "r", family=ToyFamily())  # b's pruning left a's file alone
    assert resumed.steps_done == 3
    resumed.train(1)
    Trainer(cfg(checkpoint_every=1, probe_size=0, seed=3), a, "straight", family=ToyFamily()).train(4)
    same_run(a, "r", "straight")

    # both at the same step: each resumes from its own weights
    Trainer(None, b, "r", family=ToyFamily()).train(3)
    wa, wb = params(Trainer(None, a, "r", family=ToyFamily())), params(Trainer(None, b, "r", family=ToyFamily()))
    assert a.get_run("r").last_checkpoint == b.get_run("r").last_checkpoint == 4
    assert any(not torch.equal(v, wb[k]) for k, v in wa.items())
    assert all(torch.equal(v, params(Trainer(None, a, "straight", family=ToyFamily()))[k]) for k, v in wa.items())


def test_checkpoint_in_the_older_shared_folder_still_resumes(tmp_path):
    """A store written before checkpoints were named by the store: its run's file under <db folder>/checkpoints/
    <run id>/ resumes; the next checkpoint goes beside the store; the old file is left (another store may own it)."""
    st = Store(tmp_path / "runs.db")
    Trainer(cfg(checkpoint_every=1, probe_size=0), st, "old", family=ToyFamily()).train(1)
    run = st.get_run("old")
    legacy = tmp_path / "checkpoints" / str(run.id) / "step-000001.pt"
    legacy.parent.mkdir(parents=True)
    os.replace(st.checkpoint_file(run), legacy)
    st._conn.execute("UPDATE runs SET checkpoint_path = ?", (f"checkpoints/{run.id}/step-000001.pt",))
    st.close()
    st = Store(tmp_path / "runs.db")
    tr = Trainer(None, st, "old", family=ToyFamily())
    assert tr.steps_done == 1
    tr.train(1)
    straight = Trainer(cfg(checkpoint_every=1, probe_size=0), st, "straight", family=ToyFamily())
    straight.train(2)
    same_run(st, "old", "straight")
    assert st.get_run("old").checkpoint_path == f"runs.db.checkpoints/{run.id}/step-000002.pt"
    assert legacy.exists()


# ---------------------------------------------------------------------------------------------- not a store
def foreign_db(path, script):
    c = sqlite3.connect(path)
    c.executescript(script)
    c.commit()
    c.close()


@pytest.mark.parametrize("script, says", [
    ("CREATE TABLE runs (id INTEGER, foo TEXT); INSERT INTO runs VALUES (1, 'x');",
     r"table runs lacks checkpoint_path, config, .*; it holds runs\(foo, id\)"),
    ("CREATE TABLE users (name TEXT, email TEXT); INSERT INTO users VALUES ('a', 'b');",
     r"tables users are not mrtpo's\); it holds users\(email, name\)"),
    ("CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, config TEXT NOT NULL, "
     "created REAL NOT NULL, updated REAL NOT NULL, steps_done INTEGER NOT NULL DEFAULT 0, last_checkpoint INTEGER "
     "NOT NULL DEFAULT 0, checkpoint_path TEXT);",  # mrtpo-like, but no schema_version
     r"it has no schema_version table\); it holds runs\("),
])
def test_another_programs_sqlite_file_is_refused_untouched(tmp_path, script, says, capsys):
    """Issue: another program's ``runs(id, foo)`` got mrtpo's 8 tables added, then "internal error
    (OperationalError…)"; an unrelated schema was adopted silently."""
    path = tmp_path / "runs.db"
    foreign_db(path, script)
    before = tree(tmp_path)
    with pytest.raises(MrtpoError, match=f"{path} is not an mrtpo run store \\(" + says):
        Store(path)
    assert tree(tmp_path) == before  # not a byte changed, no journal files
    for argv in (["runs", "--db", str(path)],
                 ["train", "--task", "instructions", "--steps", "1", "--model", "tiny-random", "--db", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "is not an mrtpo run store" in err and "internal error" not in err and "Traceback" not in err
    assert tree(tmp_path) == before


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path):
    path = tmp_path / "runs.db"
    path.write_text("hello, these are my notes\n" * 100)
    before = tree(tmp_path)
    with pytest.raises(MrtpoError, match=r"is not an mrtpo run store: it is not an SQLite database file \(2600 bytes, "
                                         r"starting b'hello, these are'\)"):
        Store(path)
    assert tree(tmp_path) == before


def test_an_empty_file_becomes_a_store(tmp_path):
    (tmp_path / "runs.db").write_bytes(b"")
    assert Store(tmp_path / "runs.db").run_names() == []


def test_a_folder_as_the_store_says_so(tmp_path, capsys):
    """Issue: a folder given as the store said "unable to open database file"."""
    with pytest.raises(MrtpoError, match=f"run store {tmp_path} is a folder; give the store's file, e.g. "
                                         f"{tmp_path / 'mrtpo.db'}"):
        Store(tmp_path)
    assert main(["runs", "--db", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def deny_writes(monkeypatch, denied):
    """os.access as for a user who may not write ``denied`` (the tests may run as root, who may write anything)."""
    real = os.access

    def access(p, mode, *a, **k):
        if os.fspath(p) == os.fspath(denied) and mode & os.W_OK:
            return False
        return real(p, mode, *a, **k)

    monkeypatch.setattr(schema_mod.os, "access", access)


def test_a_read_only_store_or_folder_says_so(tmp_path, monkeypatch, capsys):
    """Issue: a read-only store or folder got a hint about disk space."""
    path = tmp_path / "runs.db"
    Store(path).close()
    before = tree(tmp_path)
    with monkeypatch.context() as m:
        deny_writes(m, path)
        with pytest.raises(MrtpoError, match=f"run store {path} is read-only"):
            Store(path)
        assert main(["runs", "--db", str(path)]) == 2
        err = capsys.readouterr().err
        assert "is read-only" in err and "disk" not in err
    sub = tmp_path / "ro"
    sub.mkdir()
    with monkeypatch.context() as m:
        deny_writes(m, sub)
        with pytest.raises(MrtpoError, match=f"the folder {sub} of run store {sub / 'x.db'} is read-only"):
            Store(sub / "x.db")
    assert list(sub.iterdir()) == []
    assert {k: v for k, v in tree(tmp_path).items() if not k.startswith("runs.db-")} == \
        {k: v for k, v in before.items() if not k.startswith("runs.db-")}


def test_sqlite_saying_read_only_is_a_read_only_message(tmp_path, monkeypatch):
    """Where the permissions look writable but SQLite may not write (a read-only mount): its "readonly database"
    becomes the read-only message, not a hint about disk space."""
    path = tmp_path / "runs.db"
    Store(path).close()
    real = sqlite3.connect
    monkeypatch.setattr(schema_mod.sqlite3, "connect",
                        lambda p, *a, **k: real(f"file:{p}?mode=ro", *a, uri=True, **k))
    st = Store(path)
    with pytest.raises(MrtpoError, match="cannot write the run store .*: the store or its folder is read-only") as e:
        st.create_run("r", cfg().to_dict())
    assert "disk" not in str(e.value) and st.run_names() == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write read-only files")
def test_a_read_only_store_by_its_mode(tmp_path):
    path = tmp_path / "runs.db"
    Store(path).close()
    path.chmod(0o444)
    with pytest.raises(MrtpoError, match="is read-only"):
        Store(path)


def test_stores_opened_at_once_on_a_new_file_all_open(tmp_path):
    """Four connections opening one new store file at the same moment all get it. SQLite does not wait for the
    switch to WAL mode: before it was retried, about 1 open in 100 failed with "database is locked" (which once left
    a test's second trainer waiting forever at its start barrier: a hang in CI)."""
    import random
    import threading
    import time

    errors: list[str] = []
    for i in range(100):
        path = tmp_path / f"s{i}.db"
        barrier = threading.Barrier(4, timeout=60)

        def open_one(path=path, barrier=barrier):
            barrier.wait()
            time.sleep(random.random() * 0.003)  # spread over the few ms the first open takes
            try:
                Store(path).close()
            except MrtpoError as e:
                errors.append(str(e))

        threads = [threading.Thread(target=open_one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert errors == []
    assert {r for (r,) in sqlite3.connect(tmp_path / "s0.db").execute("PRAGMA journal_mode")} == {"wal"}


def test_a_reading_open_never_creates_a_store(tmp_path):
    """`runs --db typo.db` made an empty store (and its folders) and said "no runs"."""
    for path in (tmp_path / "typo.db", tmp_path / "no" / "such" / "r.db"):
        with pytest.raises(MrtpoError, match=f"no run store at {path}"):
            Store(path, create=False)
    assert list(tmp_path.iterdir()) == []
    Store(tmp_path / "r.db").close()
    st = Store(tmp_path / "r.db", create=False)
    assert st.run_names() == []


def test_run_examples_are_recorded_once(tmp_path):
    st = Store(tmp_path / "r.db")
    run = st.create_run("a", {"task": "sql"})
    assert st.run_examples(run.id) is None
    st.set_run_examples(run.id, "spider:/data/spider", {"count": 1, "sha256": "x", "digests": "y"})
    st.set_run_examples(run.id, "other", {"count": 2})  # the first record is kept
    assert st.run_examples(run.id) == ("spider:/data/spider", {"count": 1, "sha256": "x", "digests": "y"})
