"""The run store: one SQLite file (WAL mode) holding every training run of mrtpo.

Default path ``runs/mrtpo.db`` (ignored by git), or ``$MRTPO_RUNS``. Checkpoints live beside it, in a folder named
after the store's file and keyed by the run's id (never its name): ``<db>.checkpoints/<run id>/step-NNNNNN.pt``
(``runs/mrtpo.db.checkpoints/3/step-000010.pt``), so two stores in one folder never share a file. Stores written
before kept them in ``<db folder>/checkpoints/<run id>/``; those files are still read (:mod:`.checkpoints`).

Tables (schema version in ``schema_version``)::

    runs             id, name, config (JSON), created, updated, steps_done, last_checkpoint, checkpoint_path
    metrics          (run_id, step, key) -> value             per-step scalars: "reward/<name>", "loss", "kl", ...
    samples          (run_id, step, idx) -> example, text, token ids, rewards, advantage, token data (JSON)
    probe            (run_id, idx) -> the fixed probe responses (example, text, token ids, tokens, rewards, info)
    probe_relevance  (run_id, step, idx, reward) -> js, relevance (JSON lists); step 0 = before training
    locks            run_id -> owner, pid, host, heartbeat, started (one trainer per run; anyone may read)
    experiments      name -> config (JSON), runs (JSON list of run names), created, updated  (mrtpo.experiment)
    run_examples     run_id -> examples (the resolved --examples value), fingerprint (JSON: what they held)

A step's rows are written in one transaction after the step completes (:meth:`Store.write_step`), so a run
killed mid-step has every completed step and nothing of the interrupted one. Steps are numbered from 1.

**Run names** match :data:`RUN_NAME_PATTERN` (a letter or digit, then up to 99 letters, digits, ``.``, ``_``,
``+``, ``-``): no path separators, never ``.`` or ``..`` (:func:`validate_run_name`).

The lock that keeps one trainer per run is in :mod:`mrtpo.store.lock`, the checkpoint files in
:mod:`mrtpo.store.checkpoints`, the tables and the opening of the file (a file that is not an mrtpo store is refused
untouched) in :mod:`mrtpo.store.schema`.
"""
from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from mrtpo.errors import MrtpoError
from mrtpo.store.checkpoints import Checkpoints
from mrtpo.store.common import RunInfo
from mrtpo.store.lock import RunLocks
from mrtpo.store.schema import db_problem, open_store, read_only

RUN_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}"

_RUN_NAME = re.compile(RUN_NAME_PATTERN)


def validate_run_name(name: Any, what: str = "run", longest: int = 100) -> str:
    """``name`` if it is a valid run name (:data:`RUN_NAME_PATTERN`), else MrtpoError saying why.

    Run names are labels, never paths: the CLI, the app and :meth:`Store.create_run` all check them here.
    ``what`` names the thing in messages (experiment names follow the same rule, with ``longest`` shorter, since
    their runs' names extend them).
    """
    if not isinstance(name, str) or not name:
        raise MrtpoError(f"a {what} needs a name (letters, digits, '.', '_', '+', '-'; up to {longest} characters)")
    if len(name) > longest:
        raise MrtpoError(f"{what} name '{name[:40]}…' is {len(name)} characters long; at most {longest}")
    if not _RUN_NAME.fullmatch(name):
        bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "._+-"))})
        why = (f"it contains {', '.join(repr(c) for c in bad)}" if bad
               else "it must start with a letter or digit")
        raise MrtpoError(f"bad {what} name {name!r}: {why}. A {what} name is a letter or digit followed by up to "
                         f"{longest - 1} letters, digits, '.', '_', '+' or '-' (no '/', no '..' paths)")
    return name


@dataclass
class ExperimentInfo:
    name: str
    config: dict  # mrtpo.experiment.ExperimentConfig.to_dict()
    runs: list[str]  # its runs' names
    created: float
    updated: float


def default_path() -> Path:
    """``$MRTPO_RUNS`` or ``runs/mrtpo.db``."""
    return Path(os.environ.get("MRTPO_RUNS") or "runs/mrtpo.db")


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=True)


def _finite(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


class Store(RunLocks, Checkpoints):
    """A connection to the run store; safe to share between threads (one lock around the connection)."""

    def __init__(self, path: str | Path | None = None, create: bool = True):
        """The store at ``path`` (default :func:`default_path`), created when absent — unless ``create`` is False
        (commands that only read): then MrtpoError ``no run store at PATH`` and nothing is created."""
        self.path = Path(path) if path else default_path()
        self._conn = open_store(self.path, create)
        self._mu = threading.RLock()

    def close(self) -> None:
        with self._mu:
            self._conn.close()


    @contextmanager
    def _tx(self, run_id: int | None = None, owner: str | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE … COMMIT, rolled back on error).

        With ``owner``: first checks that ``owner`` holds the lock of ``run_id`` (MrtpoError "lost the lock").
        A failing write (full disk, busy store) is a MrtpoError naming the store.
        """
        with self._mu:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    if owner is not None:
                        self._check_owner(self._conn, run_id, owner)
                    yield self._conn
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.OperationalError as e:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if read_only(e):
                    raise MrtpoError(f"cannot write the run store {self.path}: {db_problem(self.path, e)}; "
                                     f"nothing of this write was stored") from None
                raise MrtpoError(f"cannot write the run store {self.path}: {e}; nothing of this write was "
                                 f"stored (free disk space, or wait for the other writer, and retry)") from None

    def _q(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._mu:
            return self._conn.execute(sql, args).fetchall()

    # ------------------------------------------------------------------------------------------ runs
    def create_run(self, name: str, config: dict) -> RunInfo:
        validate_run_name(name)
        now = time.time()
        try:
            with self._tx() as c:
                c.execute("INSERT INTO runs (name, config, created, updated) VALUES (?, ?, ?, ?)",
                          (name, _json(config), now, now))
        except sqlite3.IntegrityError:
            raise MrtpoError(f"a run named '{name}' already exists in {self.path}") from None
        return self.get_run(name)

    def restart_run(self, run_id: int, config: dict, *, owner: str) -> None:
        """Give run ``run_id``, which has no step stored, ``config`` in place of the one it was created with, and
        forget what its creation stored (its probe, the examples it recorded): it starts over as if created with
        ``config``. Lock holder only; MrtpoError, nothing changed, once it has a step."""
        with self._tx(run_id, owner) as c:
            steps = c.execute("SELECT steps_done, name FROM runs WHERE id = ?", (run_id,)).fetchone()
            if steps is None or steps[0] > 0:
                raise MrtpoError(f"run '{steps[1] if steps else run_id}' has steps stored: it keeps its config")
            for t in ("metrics", "samples", "probe", "probe_relevance", "run_examples"):
                c.execute(f"DELETE FROM {t} WHERE run_id = ?", (run_id,))
            c.execute("UPDATE runs SET config = ?, updated = ?, last_checkpoint = 0, checkpoint_path = NULL "
                      "WHERE id = ?", (_json(config), time.time(), run_id))

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

    # ------------------------------------------------------------------------------------------ experiments
    def put_experiment(self, name: str, config: dict, runs: list[str]) -> ExperimentInfo:
        """Record experiment ``name`` (its config and its runs' names), or update an existing one's."""
        now = time.time()
        with self._tx() as c:
            c.execute("INSERT INTO experiments VALUES (?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                      "config = excluded.config, runs = excluded.runs, updated = excluded.updated",
                      (name, _json(config), _json(list(runs)), now, now))
        return self.get_experiment(name)

    def claim_experiment(self, name: str, config: dict, runs: list[tuple[str, dict]],
                         check: Callable[[ExperimentInfo | None, dict[str, RunInfo | None]], None]) -> str:
        """Claim experiment ``name`` for this caller, atomically (one transaction: all of it or nothing):
        ``check(recorded experiment or None, {run name: stored run or None})`` may refuse (it raises); then the
        experiment is recorded (``config``, the runs' names), every run of ``runs`` [(name, config)] that is missing
        is created, and every run's lock is taken for one owner (MrtpoError, nothing changed, when a live trainer
        holds one: another process runs the experiment). Returns the owner token; hold it with :meth:`holding`."""
        now = time.time()
        with self._tx() as c:
            check(self.get_experiment(name), {n: self.get_run(n) for n, _ in runs})
            for n, cfg in runs:
                validate_run_name(n)
                c.execute("INSERT OR IGNORE INTO runs (name, config, created, updated) VALUES (?, ?, ?, ?)",
                          (n, _json(cfg), now, now))
            ids = [self.get_run(n).id for n, _ in runs]
            owner = self._take_locks(c, ids, f"experiment '{name}' is being run: its ")
            c.execute("INSERT INTO experiments VALUES (?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                      "config = excluded.config, runs = excluded.runs, updated = excluded.updated",
                      (name, _json(config), _json([n for n, _ in runs]), now, now))
        return owner

    def get_experiment(self, name: str) -> ExperimentInfo | None:
        rows = self._q("SELECT name, config, runs, created, updated FROM experiments WHERE name = ?", (name,))
        if not rows:
            return None
        r = rows[0]
        return ExperimentInfo(r[0], json.loads(r[1]), json.loads(r[2]), r[3], r[4])

    def experiment_names(self) -> list[str]:
        return [r[0] for r in self._q("SELECT name FROM experiments ORDER BY created, name")]

    # ------------------------------------------------------------------------------------------ examples
    def run_examples(self, run_id: int) -> tuple[str | None, dict] | None:
        """(the examples value, the fingerprint) recorded for run ``run_id`` (:meth:`set_run_examples`), or None
        when none is (a run of an older store, not resumed since)."""
        rows = self._q("SELECT examples, fingerprint FROM run_examples WHERE run_id = ?", (run_id,))
        return (rows[0][0], json.loads(rows[0][1])) if rows else None

    def set_run_examples(self, run_id: int, examples: str | None, fingerprint: dict) -> None:
        """Record what run ``run_id`` trains on: its examples value (resolved, e.g. ``spider:/data/spider``; None:
        the built-in ones) and their fingerprint (:func:`mrtpo.tasks.fingerprint.examples_fingerprint`).  Once
        recorded it is kept: a second call changes nothing."""
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO run_examples VALUES (?, ?, ?)", (run_id, examples, _json(fingerprint)))

    # ------------------------------------------------------------------------------------------ steps
    def write_step(self, run_id: int, step: int, metrics: dict[str, float], samples: list[dict],
                   probe: list[dict] | None = None, checkpoint: Path | None = None, *, owner: str) -> None:
        """All rows of one completed step in one transaction, if ``owner`` still holds the run's lock.

        samples: [{"example_id", "prompt", "text", ...token data}]; probe: [{"idx", "reward", "js", "relevance"}];
        checkpoint: the file saved for this step (:meth:`save_checkpoint`), recorded as the run's last.
        """
        with self._tx(run_id, owner) as c:
            c.executemany("INSERT OR REPLACE INTO metrics VALUES (?, ?, ?, ?)",
                          [(run_id, step, k, _finite(v)) for k, v in metrics.items()])
            c.executemany("INSERT OR REPLACE INTO samples VALUES (?, ?, ?, ?, ?, ?, ?)",
                          [(run_id, step, i, s.get("example_id"), s.get("prompt"), s.get("text"), _json(s))
                           for i, s in enumerate(samples)])
            if probe:
                self._write_probe_rel(c, run_id, step, probe)
            c.execute("UPDATE runs SET steps_done = ?, updated = ? WHERE id = ?", (step, time.time(), run_id))
            if checkpoint is not None:
                rel = Path(checkpoint).relative_to(self.path.parent).as_posix()
                c.execute("UPDATE runs SET last_checkpoint = ?, checkpoint_path = ? WHERE id = ?",
                          (step, rel, run_id))

    @staticmethod
    def _write_probe_rel(c, run_id, step, probe):
        c.executemany("INSERT OR REPLACE INTO probe_relevance VALUES (?, ?, ?, ?, ?, ?)",
                      [(run_id, step, p["idx"], p["reward"], _json(p["js"]), _json(p["relevance"])) for p in probe])

    def truncate(self, run_id: int, after_step: int, *, owner: str) -> None:
        """Forget every step after ``after_step`` (used when resuming from an older checkpoint); lock holder only."""
        with self._tx(run_id, owner) as c:
            for t in ("metrics", "samples", "probe_relevance"):
                c.execute(f"DELETE FROM {t} WHERE run_id = ? AND step > ?", (run_id, after_step))
            c.execute("UPDATE runs SET steps_done = ?, updated = ? WHERE id = ?", (after_step, time.time(), run_id))


    # ------------------------------------------------------------------------------------------ probe
    def write_probe(self, run_id: int, items: list[dict], relevance: list[dict], *, owner: str) -> None:
        """The fixed probe responses and their relevance under the initial policy (step 0), in one transaction."""
        with self._tx(run_id, owner) as c:
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
