"""The run store's file: its tables and schema version, and opening it — a file that is not mrtpo's is refused
untouched, a store of an older version is brought up to date (:func:`open_store`)."""
from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from mrtpo.errors import MrtpoError
from mrtpo.store.common import disk_problem

SCHEMA_VERSION = 4


_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    config TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    steps_done INTEGER NOT NULL DEFAULT 0,
    last_checkpoint INTEGER NOT NULL DEFAULT 0,
    checkpoint_path TEXT
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id INTEGER NOT NULL, step INTEGER NOT NULL, key TEXT NOT NULL, value REAL,
    PRIMARY KEY (run_id, step, key)
);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL, step INTEGER NOT NULL, idx INTEGER NOT NULL,
    example_id TEXT, prompt TEXT, text TEXT, data TEXT NOT NULL,
    PRIMARY KEY (run_id, step, idx)
);
CREATE TABLE IF NOT EXISTS probe (
    run_id INTEGER NOT NULL, idx INTEGER NOT NULL, example_id TEXT, prompt TEXT, text TEXT, data TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE TABLE IF NOT EXISTS probe_relevance (
    run_id INTEGER NOT NULL, step INTEGER NOT NULL, idx INTEGER NOT NULL, reward TEXT NOT NULL,
    js TEXT NOT NULL, relevance TEXT NOT NULL,
    PRIMARY KEY (run_id, step, idx, reward)
);
CREATE TABLE IF NOT EXISTS locks (
    run_id INTEGER PRIMARY KEY, owner TEXT NOT NULL, pid INTEGER, host TEXT, heartbeat REAL NOT NULL, started TEXT
);
CREATE TABLE IF NOT EXISTS experiments (
    name TEXT PRIMARY KEY, config TEXT NOT NULL, runs TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS run_examples (
    run_id INTEGER PRIMARY KEY, examples TEXT, fingerprint TEXT NOT NULL
);
"""


_TABLES = {  # every table of the store and the columns every schema version has
    "schema_version": {"version"},
    "runs": {"id", "name", "config", "created", "updated", "steps_done", "last_checkpoint", "checkpoint_path"},
    "metrics": {"run_id", "step", "key", "value"},
    "samples": {"run_id", "step", "idx", "example_id", "prompt", "text", "data"},
    "probe": {"run_id", "idx", "example_id", "prompt", "text", "data"},
    "probe_relevance": {"run_id", "step", "idx", "reward", "js", "relevance"},
    "locks": {"run_id", "owner", "pid", "host", "heartbeat"},
    "experiments": {"name", "config", "runs", "created", "updated"},
    "run_examples": {"run_id", "examples", "fingerprint"},
}


def _open(path: Path) -> sqlite3.Connection:
    """A connection to the store file ``path``, refused untouched when ``path`` is a folder, not writable, not an
    SQLite database, or an SQLite database of another program (tables that are not mrtpo's, or mrtpo's tables
    without its columns): MrtpoError saying which, and what the file holds."""
    if path.is_dir():
        raise MrtpoError(f"run store {path} is a folder; give the store's file, e.g. {path / 'mrtpo.db'}")
    folder = path.parent if str(path.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MrtpoError(f"cannot create the folder of run store {path}: {disk_problem(e)}") from None
    if not folder.is_dir():
        raise MrtpoError(f"cannot create run store {path}: {folder} is not a folder")
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise MrtpoError(f"run store {path} is read-only (this user may not write it); mrtpo writes every run it "
                         f"opens: give a store you may write (--db or $MRTPO_RUNS), or a copy of this one")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MrtpoError(f"the folder {folder} of run store {path} is read-only (this user may not create files "
                         f"there; the store needs its journal and checkpoints beside it): give a store in a "
                         f"folder you may write (--db or $MRTPO_RUNS)")
    try:
        conn = sqlite3.connect(str(path), timeout=30.0, check_same_thread=False, isolation_level=None)
    except sqlite3.Error as e:
        raise MrtpoError(f"cannot open run store {path}: {db_problem(path, e)}") from None
    try:
        conn.execute("PRAGMA busy_timeout=30000")
        tables = {name: {c[1] for c in conn.execute(f"PRAGMA table_info('{name}')")} for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'").fetchall()}
    except sqlite3.DatabaseError as e:
        conn.close()
        raise MrtpoError(f"{path} is not an mrtpo run store: {db_problem(path, e)}; nothing was changed. Give "
                         f"another store file (--db or $MRTPO_RUNS)") from None
    foreign = sorted(set(tables) - set(_TABLES))
    missing = {t: sorted(_TABLES[t] - cols) for t, cols in tables.items() if t in _TABLES and _TABLES[t] - cols}
    if tables and ("schema_version" not in tables or foreign or missing):
        conn.close()
        held = "; ".join(f"{t}({', '.join(sorted(c))})" for t, c in sorted(tables.items()))
        why = (f"tables {', '.join(foreign)} are not mrtpo's" if foreign else
               "; ".join(f"table {t} lacks {', '.join(c)}" for t, c in missing.items()) if missing else
               "it has no schema_version table")
        raise MrtpoError(f"{path} is not an mrtpo run store ({why}); it holds {_cut(held, 300)}. Nothing was "
                         f"changed; give another store file (--db or $MRTPO_RUNS)")
    return conn


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def read_only(e: Exception) -> bool:
    return "readonly" in str(e) or "read-only" in str(e)


def db_problem(path: Path, e: Exception) -> str:
    """What SQLite's error means for the store file ``path``, as one clause."""
    text = str(e)
    if "not a database" in text:
        try:
            with open(path, "rb") as f:
                head = f.read(16)
            size = path.stat().st_size
        except OSError:
            return "it is not an SQLite database file"
        return f"it is not an SQLite database file ({size} bytes, starting {head!r})"
    if read_only(e):
        return ("the store or its folder is read-only (mrtpo writes every run store it opens): give a store you "
                "may write (--db or $MRTPO_RUNS)")
    if "unable to open" in text:
        if path.is_dir():
            return "it is a folder; give the store's file"
        return f"{text} (can this user create files in {path.parent}?)"
    return text


def _to_wal(conn: sqlite3.Connection, wait_s: float = 30.0) -> None:
    """Switch the store to WAL mode (a no-op once it is: the mode is kept in the file).

    SQLite does not call the busy handler for this switch: while another connection opens a new store at the same
    moment it fails at once with "database is locked" (seen with two trainers started together). So it is retried
    here, for up to ``wait_s`` seconds like every other write (``busy_timeout``)."""
    deadline, pause = time.monotonic() + wait_s, 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def open_store(path: Path, create: bool = True) -> sqlite3.Connection:
    """The connection to run store ``path`` (created when absent; WAL mode), its tables there and at
    :data:`SCHEMA_VERSION` (versions 1 to 3 are brought up to date). MrtpoError, the file untouched, when it is not
    mrtpo's (:func:`_open`) or of a newer version.  ``create`` False (a command that only reads): MrtpoError
    ``no run store at PATH`` when there is none, and nothing (no file, no folder) is created."""
    if not create and not path.is_dir() and not path.is_file():
        raise MrtpoError(f"no run store at {path}" + ("" if path.parent.is_dir() or not str(path.parent) else
                                                       f" (its folder {path.parent} does not exist either)")
                         + "; check --db / $MRTPO_RUNS (a store is made by `mrtpo train` or `mrtpo experiment`)")
    conn = _open(path)
    try:
        _to_wal(conn)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_SCHEMA)
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] in (1, 2, 3):
                if row[0] == 1:  # version 1 had no lock start time; its checkpoint paths are still read
                    conn.execute("ALTER TABLE locks ADD COLUMN started TEXT")
                # version 2 had no experiments table, version 3 no run_examples (both created above, empty: an
                # older run's examples are recorded when it is next resumed)
                conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise MrtpoError(f"run store {path} has schema version {row[0]}, this mrtpo reads {SCHEMA_VERSION}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    except sqlite3.DatabaseError as e:
        conn.close()
        raise MrtpoError(f"cannot open run store {path}: {db_problem(path, e)}") from None
    except BaseException:
        conn.close()
        raise
    return conn
