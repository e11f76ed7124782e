"""The run store: one SQLite file (WAL mode) holding every training run of mrtpo.

Default path ``runs/mrtpo.db`` (ignored by git), or ``$MRTPO_RUNS``. Checkpoints live next to it, under
``<db folder>/checkpoints/<run name>/``.

Tables (schema version in ``schema_version``)::

    runs             id, name, config (JSON), created, updated, steps_done, last_checkpoint, checkpoint_path
    metrics          (run_id, step, key) -> value             per-step scalars: "reward/<name>", "loss", "kl", ...
    samples          (run_id, step, idx) -> example, text, token ids, rewards, advantage, token data (JSON)
    probe            (run_id, idx) -> the fixed probe responses (example, text, token ids, tokens, rewards, info)
    probe_relevance  (run_id, step, idx, reward) -> js, relevance (JSON lists); step 0 = before training
    locks            run_id -> owner, pid, host, heartbeat     (one trainer per run; anyone may read)

A step's rows are written in one transaction after the step completes (:meth:`Store.write_step`), so a run
killed mid-step has every completed step and nothing of the interrupted one. Steps are numbered from 1.
"""
from __future__ import annotations

import json
import math
import os
import socket
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from mrtpo.errors import MrtpoError

SCHEMA_VERSION = 1
STALE_LOCK_S = 120.0  # a lock whose heartbeat is older than this is considered abandoned

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
    run_id INTEGER PRIMARY KEY, owner TEXT NOT NULL, pid INTEGER, host TEXT, heartbeat REAL NOT NULL
);
"""


def default_path() -> Path:
    """``$MRTPO_RUNS`` or ``runs/mrtpo.db``."""
    return Path(os.environ.get("MRTPO_RUNS") or "runs/mrtpo.db")


@dataclass
class RunInfo:
    id: int
    name: str
    config: dict
    created: float
    updated: float
    steps_done: int
    last_checkpoint: int
    checkpoint_path: str | None


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=True)


def _finite(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


class Store:
    """A connection to the run store; safe to share between threads (one lock around the connection)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else default_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(str(self.path), timeout=30.0, check_same_thread=False, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA busy_timeout=30000")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)
            row = self._conn.execute("SELECT version FROM schema_version").fetchone()
        except sqlite3.DatabaseError as e:
            raise MrtpoError(f"cannot open run store {self.path}: {e}") from None
        if row is None:
            self._conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
        elif row[0] != SCHEMA_VERSION:
            raise MrtpoError(f"run store {self.path} has schema version {row[0]}, this mrtpo reads {SCHEMA_VERSION}")
        self._mu = threading.RLock()

    def close(self) -> None:
        with self._mu:
            self._conn.close()

    @property
    def checkpoint_root(self) -> Path:
        return self.path.parent / "checkpoints"

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE … COMMIT, rolled back on error)."""
        with self._mu:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _q(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._mu:
            return self._conn.execute(sql, args).fetchall()

    # ------------------------------------------------------------------------------------------ runs
    def create_run(self, name: str, config: dict) -> RunInfo:
        if not name or not name.strip():
            raise MrtpoError("a run needs a name")
        now = time.time()
        try:
            with self._tx() as c:
                c.execute("INSERT INTO runs (name, config, created, updated) VALUES (?, ?, ?, ?)",
                          (name, _json(config), now, now))
        except sqlite3.IntegrityError:
            raise MrtpoError(f"a run named '{name}' already exists in {self.path}") from None
        return self.get_run(name)

    def get_run(self, name: str) -> RunInfo | None:
        rows = self._q("SELECT id, name, config, created, updated, steps_done, last_checkpoint, checkpoint_path "
                       "FROM runs WHERE name = ?", (name,))
        if not rows:
            return None
        r = rows[0]
        return RunInfo(r[0], r[1], json.loads(r[2]), r[3], r[4], r[5], r[6], r[7])

    def require_run(self, name: str) -> RunInfo:
        run = self.get_run(name)
        if run is None:
            names = self.run_names()
            raise MrtpoError(f"no run named '{name}' in {self.path}" +
                             (f" (runs: {', '.join(names)})" if names else " (the store is empty)"))
        return run

    def run_names(self) -> list[str]:
        return [r[0] for r in self._q("SELECT name FROM runs ORDER BY id")]

    def list_runs(self) -> list[RunInfo]:
        return [self.get_run(n) for n in self.run_names()]

    def delete_run(self, name: str) -> None:
        run = self.require_run(name)
        with self._tx() as c:
            for t in ("metrics", "samples", "probe", "probe_relevance", "locks"):
                c.execute(f"DELETE FROM {t} WHERE run_id = ?", (run.id,))
            c.execute("DELETE FROM runs WHERE id = ?", (run.id,))

    # ------------------------------------------------------------------------------------------ steps
    def write_step(self, run_id: int, step: int, metrics: dict[str, float], samples: list[dict],
                   probe: list[dict] | None = None, checkpoint: str | None = None) -> None:
        """All rows of one completed step in one transaction; ``checkpoint`` = path saved for this step.

        samples: [{"example_id", "prompt", "text", ...token data}]; probe: [{"idx", "reward", "js", "relevance"}].
        """
        with self._tx() as c:
            c.executemany("INSERT OR REPLACE INTO metrics VALUES (?, ?, ?, ?)",
                          [(run_id, step, k, _finite(v)) for k, v in metrics.items()])
            c.executemany("INSERT OR REPLACE INTO samples VALUES (?, ?, ?, ?, ?, ?, ?)",
                          [(run_id, step, i, s.get("example_id"), s.get("prompt"), s.get("text"), _json(s))
                           for i, s in enumerate(samples)])
            if probe:
                self._write_probe_rel(c, run_id, step, probe)
            c.execute("UPDATE runs SET steps_done = ?, updated = ? WHERE id = ?", (step, time.time(), run_id))
            if checkpoint is not None:
                c.execute("UPDATE runs SET last_checkpoint = ?, checkpoint_path = ? WHERE id = ?",
                          (step, checkpoint, run_id))

    @staticmethod
    def _write_probe_rel(c, run_id, step, probe):
        c.executemany("INSERT OR REPLACE INTO probe_relevance VALUES (?, ?, ?, ?, ?, ?)",
                      [(run_id, step, p["idx"], p["reward"], _json(p["js"]), _json(p["relevance"])) for p in probe])

    def truncate(self, run_id: int, after_step: int) -> None:
        """Forget every step after ``after_step`` (used when resuming from an older checkpoint)."""
        with self._tx() as c:
            for t in ("metrics", "samples", "probe_relevance"):
                c.execute(f"DELETE FROM {t} WHERE run_id = ? AND step > ?", (run_id, after_step))
            c.execute("UPDATE runs SET steps_done = ?, updated = ? WHERE id = ?", (after_step, time.time(), run_id))

    # ------------------------------------------------------------------------------------------ probe
    def write_probe(self, run_id: int, items: list[dict], relevance: list[dict]) -> None:
        """The fixed probe responses and their relevance under the initial policy (step 0), in one transaction."""
        with self._tx() as c:
            c.execute("DELETE FROM probe WHERE run_id = ?", (run_id,))
            c.executemany("INSERT INTO probe VALUES (?, ?, ?, ?, ?, ?)",
                          [(run_id, i, p.get("example_id"), p.get("prompt"), p.get("text"), _json(p))
                           for i, p in enumerate(items)])
            self._write_probe_rel(c, run_id, 0, relevance)

    def probe(self, run_id: int) -> list[dict]:
        return [json.loads(r[0]) for r in self._q("SELECT data FROM probe WHERE run_id = ? ORDER BY idx", (run_id,))]

    def probe_relevance(self, run_id: int, idx: int, reward: str) -> tuple[list[int], list[list[float]]]:
        """(steps, relevance per step) of probe response ``idx`` for ``reward``: a (steps, T) heatmap."""
        rows = self._q("SELECT step, relevance FROM probe_relevance WHERE run_id = ? AND idx = ? AND reward = ? "
                       "ORDER BY step", (run_id, idx, reward))
        return [r[0] for r in rows], [json.loads(r[1]) for r in rows]

    # ------------------------------------------------------------------------------------------ reads
    def metrics(self, run_id: int) -> dict[str, dict[int, float]]:
        """{key: {step: value}} (None for NaN)."""
        out: dict[str, dict[int, float]] = {}
        for step, key, value in self._q("SELECT step, key, value FROM metrics WHERE run_id = ? ORDER BY step",
                                        (run_id,)):
            out.setdefault(key, {})[step] = value
        return out

    def samples(self, run_id: int, step: int) -> list[dict]:
        return [json.loads(r[0]) for r in
                self._q("SELECT data FROM samples WHERE run_id = ? AND step = ? ORDER BY idx", (run_id, step))]

    # ------------------------------------------------------------------------------------------ lock
    def acquire_lock(self, run_id: int, owner: str | None = None) -> str:
        """Take the training lock of a run; returns the owner token. Raises MrtpoError if someone holds it.

        A lock is free when absent, older than STALE_LOCK_S, or held by a dead process on this host.
        """
        owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        host, pid = socket.gethostname(), os.getpid()
        with self._tx() as c:
            row = c.execute("SELECT owner, pid, host, heartbeat FROM locks WHERE run_id = ?", (run_id,)).fetchone()
            if row is not None and row[0] != owner and not self._abandoned(row):
                raise MrtpoError(
                    f"this run is being trained by process {row[1]} on {row[2]} (heartbeat "
                    f"{time.time() - row[3]:.0f} s ago); you can watch it, or wait until it stops")
            c.execute("INSERT OR REPLACE INTO locks VALUES (?, ?, ?, ?, ?)", (run_id, owner, pid, host, time.time()))
        return owner

    @staticmethod
    def _abandoned(row) -> bool:
        _, pid, host, beat = row
        if time.time() - beat > STALE_LOCK_S:
            return True
        if host == socket.gethostname() and pid is not None:
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def heartbeat(self, run_id: int, owner: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE locks SET heartbeat = ? WHERE run_id = ? AND owner = ?", (time.time(), run_id, owner))

    def release_lock(self, run_id: int, owner: str) -> None:
        with self._tx() as c:
            c.execute("DELETE FROM locks WHERE run_id = ? AND owner = ?", (run_id, owner))

    def lock_holder(self, run_id: int) -> dict | None:
        """Who trains the run now ({owner, pid, host, age_s}), or None (abandoned locks count as free)."""
        rows = self._q("SELECT owner, pid, host, heartbeat FROM locks WHERE run_id = ?", (run_id,))
        if not rows or self._abandoned(rows[0]):
            return None
        o, pid, host, beat = rows[0]
        return {"owner": o, "pid": pid, "host": host, "age_s": time.time() - beat}
