"""One run per credit log.  ``meta.json`` names the run that owns the folder — ``run``, an id, and ``owner``, what
tells a person which run it is (mrtpo's run store and run name, TRL's ``output_dir``; the host and pid of its first
writer) — and every row repeats ``run``.  A writer claims the folder before its run's first step
(:class:`mrtpo.creditlog.CreditLogWriter`): a folder without a log is taken; a log of the same run is continued (a
resumed run, :attr:`LogOwner.resume`); a log that holds no step yet is taken over by a new attempt of the same run
(same source and :attr:`LogOwner.key`: a run that stopped before its first step); any other log is refused with a
message naming its owner (:func:`refusal`).  Readers check that each step's rows are the log's run's
(:func:`check_run`): a folder never shows two runs as one."""
from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from mrtpo.creditlog.format import CreditLogError, CreditRow


@dataclass(frozen=True)
class LogOwner:
    """The run a writer logs for.  ``run``: its id (written in ``meta.json`` and every row); ``source``: the
    trainer ('mrtpo', 'trl'); ``key``: what identifies the run to a person and must match for a new attempt of the
    run to take over a log that holds no step yet (mrtpo: ``store`` and ``run``; TRL: ``output_dir``);
    ``resume``: the run may have logged to this folder before (a resumed run), so a log of the same ``run`` is
    continued — without it, only a folder without a log (or one with no step yet, see above) is taken."""

    run: str
    source: str
    key: dict = field(default_factory=dict)
    resume: bool = False

    @classmethod
    def new(cls, source: str, key: dict | None = None) -> "LogOwner":
        """A run of its own: a fresh random id (``<source>-<12 hex digits>``)."""
        return cls(f"{source or 'run'}-{uuid.uuid4().hex[:12]}", source, dict(key or {}))

    def meta(self) -> dict:
        """The fields of ``meta.json`` that name the owner."""
        return {"run": self.run, "owner": {**self.key, "host": socket.gethostname(), "pid": os.getpid()}}


def owner_key(meta: dict) -> dict:
    """The ``key`` of the run a log's meta names (its ``owner`` without the host and pid)."""
    return {k: v for k, v in (meta.get("owner") or {}).items() if k not in ("host", "pid")}


def may_write(meta: dict, owner: LogOwner, has_steps: bool) -> bool:
    """Whether ``owner`` may write into the log whose ``meta`` is there (and which holds steps or not): the same
    run resumed, or a new attempt of the same run where its log holds no step yet."""
    if "run" not in meta:
        return False  # an older log: nothing says whose it is
    if owner.resume and meta["run"] == owner.run:
        return True
    return not has_steps and meta.get("source") == owner.source and owner_key(meta) == owner.key


def owner_text(meta: dict) -> str:
    """The run a log's meta names, for a person: which run, its source, when the log was created, where."""
    o, run = meta.get("owner") or {}, meta.get("run")
    if run is None:
        return "a run that an older mrtpo did not record (the log has no owner)"
    if o.get("store") is not None:
        what = f"mrtpo run '{o.get('run')}' of the run store {o['store']}"
    elif o.get("output_dir") is not None:
        what = f"TRL run {run} (output_dir {o['output_dir']})"
    else:
        what = f"{meta.get('source') or 'a'} run {run}"
    created = meta.get("created")
    when = time.strftime(", created %Y-%m-%d %H:%M:%S", time.localtime(created)) \
        if isinstance(created, (int, float)) else ""
    where = f" on {o['host']} (pid {o['pid']})" if o.get("host") and o.get("pid") else ""
    return what + when + where


def refusal(folder: str | Path, meta: dict, has_steps: bool) -> str:
    """Why a run may not write into ``folder``, whose log ``meta`` names another run (or none)."""
    steps = "" if has_steps else " (it holds no step yet; if that run is gone, delete the folder)"
    return (f"credit log {folder} belongs to {owner_text(meta)}{steps}; a credit log holds one run: give this run "
            f"another folder")


def check_run(meta: dict, path: str | Path, rows: list[CreditRow]) -> None:
    """CreditLogError naming the step file, the row and the field ``run`` when a row of that file was written by
    another run than the log's (``meta.json``'s ``run``): the folder holds steps of two runs.  Logs written before
    owners were recorded (no ``run`` in meta nor rows) pass."""
    want = meta.get("run")
    for r in rows:
        if r.run == want:
            continue
        if r.run is not None and not isinstance(r.run, str):
            problem = f"must be the run's id (text), got {type(r.run).__name__}"
        elif r.run is None:
            problem = f"missing, but meta.json says the log is run {want}'s: this step was written by another writer"
        elif want is None:
            problem = f"is {r.run}, but meta.json names no run (an older log): this step was written by another run"
        else:
            problem = f"is {r.run}, but the log belongs to {owner_text(meta)}: this step was written by another run"
        raise CreditLogError(path, r.row, "run", problem + " — the folder mixes runs; give each run its own folder")


def check_same_run(before: dict | None, meta: dict, folder: str | Path) -> None:
    """CreditLogError when a followed log's ``meta.json`` names another run than it did when the steps read so far
    were read (the folder was emptied and taken by another run): they are not this run's."""
    if before is not None and before.get("run") != meta.get("run"):
        raise CreditLogError(Path(folder) / "meta.json", 0, "run", f"the log now belongs to {owner_text(meta)}, not "
                                                                   f"to the run read so far ({before.get('run')}): "
                                                                   f"open it again")
