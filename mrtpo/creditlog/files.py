"""The credit log's files: :class:`CreditLogWriter` writes ``meta.json`` and one ``step-NNNNNN.jsonl`` per step,
each whole (a temporary file beside it, then ``os.replace``: a reader sees a step's file complete or not at all);
:func:`read_credit_log` reads the steps after a given one, opening only their files, so a viewer polls a growing log
without re-reading old steps (:class:`CreditLogFollower` keeps where it was).  The format: :mod:`.format`.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from mrtpo.creditlog.format import FORMAT, META_FILE, VERSION, CreditLogError, CreditRow, check_meta, check_row
from mrtpo.errors import MrtpoError
from mrtpo.jsonl import InputFileError, dumps, json_lines, load_json, write_text

STEP_FILE = re.compile(r"^step-(\d{6,})\.jsonl$")  # temporary files start with "." and never match


def step_file(step: int) -> str:
    """``step-000012.jsonl`` for step 12."""
    return f"step-{step:06d}.jsonl"


@dataclass
class CreditStep:
    """One step of a log: its number, its file and its rows (groups in order, responses in order)."""

    step: int
    path: str
    rows: list[CreditRow]

    @property
    def groups(self) -> list[list[CreditRow]]:
        """The rows by group, in order."""
        out: dict[int, list[CreditRow]] = {}
        for r in self.rows:
            out.setdefault(r.group, []).append(r)
        return list(out.values())


@dataclass
class CreditLog:
    """What :func:`read_credit_log` gives: the log's ``meta`` and the steps read (in step order)."""

    path: str
    meta: dict
    steps: list[CreditStep] = field(default_factory=list)

    @property
    def last_step(self) -> int | None:
        return self.steps[-1].step if self.steps else None


# ---------------------------------------------------------------------------------------------- writing
class CreditLogWriter:
    """Writes a credit log into ``folder`` (created with its parents): ``meta`` (the format's name and version are
    added) at once, then :meth:`write_step` per step.  A log already in the folder is continued (a resumed run): its
    reward names and creation time are kept; one of another format or version is refused.  Each row is checked as
    the reader checks it, so a bad row is an error here, naming the step, not in a viewer later."""

    def __init__(self, folder: str | Path, meta: dict):
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MrtpoError(f"cannot create the credit log folder {folder}: {e.strerror or e}") from None
        self.meta = {"format": FORMAT, "version": VERSION, "created": time.time(), **meta}
        check_meta(self.meta, self.folder / META_FILE)
        if (self.folder / META_FILE).exists():  # a log already there (a resumed run): continue it, same version
            old = read_meta(self.folder)
            if old["version"] != VERSION:
                raise CreditLogError(self.folder / META_FILE, 0, "version", f"the log there is version "
                                     f"{old['version']}; this mrtpo writes version {VERSION}: give another folder")
            self.meta["created"] = old.get("created", self.meta["created"])
            self.meta["rewards"] = list(dict.fromkeys([*old["rewards"], *self.meta["rewards"]]))
        write_text(self.folder / META_FILE, dumps(self.meta) + "\n")

    def write_step(self, step: int, rows: Sequence[dict]) -> Path:
        """Step ``step``'s rows as ``step-NNNNNN.jsonl``, written whole (replacing a file of the same step).  Reward
        names the meta does not list yet (tasks whose examples have rewards of their own) are added to it first."""
        path = self.folder / step_file(step)
        lines = []
        for n, row in enumerate(rows, start=1):
            text = dumps(row)
            check_row(json.loads(text), path, n)  # NaN → null on the way: check what is written
            lines.append(text)
        new = [k for row in rows for k in row["rewards"] if k not in self.meta["rewards"]]
        if new:
            self.meta["rewards"] = self.meta["rewards"] + list(dict.fromkeys(new))
            write_text(self.folder / META_FILE, dumps(self.meta) + "\n")
        write_text(path, "".join(line + "\n" for line in lines))
        return path


# ---------------------------------------------------------------------------------------------- reading
def read_meta(folder: str | Path) -> dict:
    """The log's checked ``meta.json`` (:func:`mrtpo.creditlog.format.check_meta`)."""
    path = Path(folder) / META_FILE
    if not Path(folder).is_dir():
        raise CreditLogError(folder, 0, "", "no such folder" if not Path(folder).exists() else
                             "not a folder (a credit log is a folder holding meta.json and step-NNNNNN.jsonl files)")
    if not path.is_file():
        raise CreditLogError(folder, 0, "", f"no {META_FILE}: not a credit log (or its writer has not started)")
    try:
        return check_meta(load_json(path), path)
    except InputFileError as e:
        raise CreditLogError(path, 0, "", e.problem) from None


def step_files(folder: str | Path, after_step: int | None = None) -> list[tuple[int, Path]]:
    """(step, path) of the step files in ``folder`` after ``after_step`` (all: None), in step order; the folder is
    listed, no file is opened."""
    out = []
    for p in Path(folder).iterdir():
        m = STEP_FILE.match(p.name)
        if m and (after_step is None or int(m.group(1)) > after_step):
            out.append((int(m.group(1)), p))
    return sorted(out)


def json_rows(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each line of a JSONL file; CreditLogError naming the file and line for one that
    cannot be read (this log's and the other trainers' logs alike)."""
    try:
        lines = list(json_lines(path))
    except InputFileError as e:
        raise CreditLogError(path, 0, "", e.problem) from None
    for n, obj, problem in lines:
        if problem is not None:
            raise CreditLogError(path, n, "", problem)
        yield n, obj


def read_step_file(path: str | Path, step: int | None = None) -> list[CreditRow]:
    """The rows of one step file, each checked (:func:`mrtpo.creditlog.format.check_row`); a row whose ``step``
    is not the file's is an error too."""
    rows = []
    for n, obj in json_rows(path):
        r = check_row(obj, path, n)
        if step is not None and r.step != step:
            raise CreditLogError(path, n, "step", f"is {r.step} in the file of step {step}")
        rows.append(r)
    return rows


def read_credit_log(folder: str | Path, after_step: int | None = None) -> CreditLog:
    """The credit log in ``folder``: its meta and the steps after ``after_step`` (every step: None), reading only
    those steps' files.  :class:`CreditLogError` (an :class:`MrtpoError`) names the file, the row and the field of
    any problem: no ``meta.json``, another format or a newer version, a line that is not JSON, a missing field."""
    meta = read_meta(folder)
    steps = [CreditStep(s, str(p), read_step_file(p, s)) for s, p in step_files(folder, after_step)]
    return CreditLog(str(folder), meta, steps)


class CreditLogFollower:
    """Follows a growing log: each :meth:`poll` returns the steps written since the last one (the first: every
    step), reading only their files."""

    def __init__(self, folder: str | Path):
        self.folder = str(folder)
        self.last_step: int | None = None
        self.meta: dict | None = None

    def poll(self) -> list[CreditStep]:
        log = read_credit_log(self.folder, self.last_step)
        self.meta = log.meta
        if log.steps:
            self.last_step = log.steps[-1].step
        return log.steps
