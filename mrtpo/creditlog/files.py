"""The credit log's files: :class:`CreditLogWriter` claims the folder for its run (:mod:`.owner`), writes
``meta.json`` and one ``step-NNNNNN.jsonl`` per step, each whole (a temporary file beside it, then ``os.replace``:
a reader sees a step's file complete or not at all);
:func:`read_credit_log` reads the steps after a given one, opening only their files, so a viewer polls a growing log
without re-reading old steps (:class:`CreditLogFollower` keeps where it was).  The format: :mod:`.format`.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Sequence

from mrtpo.creditlog.access import check_log_file, check_log_folder, folder_error, open_log_file
from mrtpo.creditlog.format import FORMAT, META_FILE, VERSION, CreditLogError, CreditRow, check_meta, check_row
from mrtpo.creditlog.owner import LogOwner, check_run, check_same_run, may_write, refusal
from mrtpo.errors import MrtpoError
from mrtpo.jsonl import InputFileError, dumps, input_clash, load_json, output_problem, write_text

STEP_FILE = re.compile(r"^step-(\d{6,})\.jsonl$")  # temporary files start with "." and never match
SETTINGS = ("source", "method", "measure", "info", "group_size")  # what a resumed run must keep to continue a log


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
    """Writes a credit log for one run (``owner``, :class:`mrtpo.creditlog.owner.LogOwner`; None: a run of its
    own, a fresh id) into ``folder`` (created with its parents): at once, before the run's first step, the folder
    is claimed (:meth:`claim`: ``meta``, with the format's name and version and the owner's fields, written as
    ``meta.json``), then :meth:`write_step` per step.  A log of another run in the folder is refused with a message
    naming it; a log of the same resumed run is continued (its creation time and reward names kept; the caller
    drops the steps past where the run resumed, :meth:`drop_after`); one of another format or version is refused.
    Each row is checked as the reader checks it, so a bad row is an error here, naming the step, not in a viewer
    later.  ``inputs`` ({what: path}): the run's inputs, which the log may not be nor be inside."""

    def __init__(self, folder: str | Path, meta: dict, owner: LogOwner | None = None,
                 inputs: dict[str, str | None] | None = None):
        self.folder = Path(folder)
        self.owner = owner or LogOwner.new(str(meta.get("source", "")))
        problem = log_folder_problem(self.folder, inputs)
        if problem:
            raise MrtpoError(f"credit log {folder}: {problem}")
        self.meta = {"format": FORMAT, "version": VERSION, "created": time.time(), **meta, **self.owner.meta()}
        check_meta(self.meta, self.folder / META_FILE)
        self.claim()

    def claim(self) -> None:
        """Take the folder for this run (see the class docstring); MrtpoError naming the owner when it is another
        run's.  ``meta.json`` is created only where none is (a second writer starting at the same moment finds the
        first one's), else replaced whole."""
        path = self.folder / META_FILE
        for _ in range(3):
            if not path.exists() and _create_new(path, dumps(self.meta) + "\n"):
                return
            if not path.exists():
                continue  # it was there and is gone: look again
            old = read_meta(self.folder)
            if old["version"] != VERSION:
                raise CreditLogError(path, 0, "version", f"the log there is version {old['version']}; this mrtpo "
                                                         f"writes version {VERSION}: give another folder")
            has_steps = bool(step_files(self.folder))
            if not may_write(old, self.owner, has_steps):
                raise MrtpoError(refusal(self.folder, old, has_steps))
            if old["run"] == self.owner.run:  # the same run resumed: its log goes on, with what it was logged with
                changed = [k for k in SETTINGS if has_steps and k in old and old[k] != self.meta.get(k)]
                if changed:
                    k = changed[0]
                    raise MrtpoError(f"credit log {self.folder}: its steps were logged with {k} {old[k]!r}; this "
                                     f"run resumes with {k} {self.meta.get(k)!r}: give it another folder (a log's "
                                     f"steps share one {k})")
                self.meta.update(created=old.get("created", self.meta["created"]),
                                 owner=old.get("owner", self.meta["owner"]),
                                 rewards=list(dict.fromkeys([*old["rewards"], *self.meta["rewards"]])))
            write_text(path, dumps(self.meta) + "\n")
            return
        raise MrtpoError(f"credit log {self.folder}: {META_FILE} keeps appearing and disappearing (another writer "
                         f"there?); give this run another folder")

    def drop_after(self, step: int) -> list[int]:
        """Delete the step files after ``step`` (a resumed run's steps past its checkpoint: they are recomputed,
        as the run store drops them); the steps dropped."""
        dropped = step_files(self.folder, step)
        for _, p in dropped:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                raise MrtpoError(f"cannot delete {p} (a step past where the run resumed): {e.strerror or e}") from None
        return [s for s, _ in dropped]

    def _check_owner(self) -> None:
        """MrtpoError when ``meta.json`` no longer names this run (another writer took the folder meanwhile)."""
        try:
            run = load_json(self.folder / META_FILE).get("run")
        except (InputFileError, AttributeError):
            run = None
        if run != self.meta["run"]:
            raise MrtpoError(f"credit log {self.folder}: {META_FILE} no longer names this run ({self.meta['run']}) "
                             f"but {run or 'none'}: another writer took the folder; this step was not logged")

    def write_step(self, step: int, rows: Sequence[dict]) -> Path:
        """Step ``step``'s rows as ``step-NNNNNN.jsonl`` (each with this run's ``run``), written whole (replacing
        a file of the same step).  Reward names the meta does not list yet (tasks whose examples have rewards of
        their own) are added to it first."""
        self._check_owner()
        path = self.folder / step_file(step)
        lines = []
        for n, row in enumerate(rows, start=1):
            if row.get("run", self.meta["run"]) != self.meta["run"]:
                raise CreditLogError(path, n, "run", f"is {row['run']}; this writer logs run {self.meta['run']}")
            text = dumps({**row, "run": self.meta["run"]})
            check_row(json.loads(text), path, n)  # NaN → null on the way: check what is written
            lines.append(text)
        new = [k for row in rows for k in row["rewards"] if k not in self.meta["rewards"]]
        if new:
            self.meta["rewards"] = self.meta["rewards"] + list(dict.fromkeys(new))
            write_text(self.folder / META_FILE, dumps(self.meta) + "\n")
        write_text(path, "".join(line + "\n" for line in lines))
        return path


def log_folder_problem(folder: str | Path, inputs: dict[str, str | None] | None = None) -> str | None:
    """Why ``folder`` cannot hold a credit log — a file, read-only, not creatable, one of ``inputs`` ({what:
    path}) or inside one — or None.  The folder is created (with its parents) when missing, as the writer would:
    some paths (``/proc/x``) fail only then.  Checked before a run's first step."""
    p = Path(folder)
    clash = input_clash(p, inputs or {})
    if clash:
        return f"it {clash}: a log never goes into an input; give another folder"
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return output_problem(p, folder=True) or f"cannot create the folder: {e.strerror or e}"
    return None if os.access(p, os.W_OK | os.X_OK) else "the folder is read-only (this user may not write there)"


def _create_new(path: Path, text: str) -> bool:
    """Write ``text`` as the new file ``path``, whole, only if nothing is there (a temporary file linked to the
    name: atomic, and it fails where the name exists); False when something was there."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                os.fchmod(f.fileno(), 0o666 & ~_umask())
                f.write(text)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError:  # a file system without hard links: the next best
                if path.exists() or path.is_symlink():
                    return False
                os.replace(tmp, path)
            return True
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as e:
        raise MrtpoError(f"cannot write {path}: {e.strerror or e}") from None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------------------------- reading
NO_META = f"no {META_FILE}: not a credit log (or its writer has not started)"
MAX_LINE = 64 * 2**20  # bytes: a longer line is skipped unread (a log's row is far smaller)
Bad = Callable[[CreditLogError], None]  # where a lenient reader puts what it skips


def read_meta(folder: str | Path) -> dict:
    """The log's checked ``meta.json`` (:func:`mrtpo.creditlog.format.check_meta`)."""
    path = Path(folder) / META_FILE
    if not Path(folder).is_dir():
        raise CreditLogError(folder, 0, "", "no such folder" if not Path(folder).exists() else
                             "not a folder (a credit log is a folder holding meta.json and step-NNNNNN.jsonl files)")
    check_log_folder(folder)
    if not path.is_file():
        raise CreditLogError(folder, 0, "", NO_META)
    check_log_file(path)
    try:
        return check_meta(load_json(path), path)
    except InputFileError as e:
        raise CreditLogError(path, 0, "", e.problem) from None


def step_files(folder: str | Path, after_step: int | None = None) -> list[tuple[int, Path]]:
    """(step, path) of the step files in ``folder`` after ``after_step`` (all: None), in step order; the folder is
    listed, no file is opened."""
    try:
        names = os.listdir(folder)
    except OSError as e:
        raise folder_error(folder, e) from None
    out = []
    for name in names:
        m = STEP_FILE.match(name)
        if m and (after_step is None or int(m.group(1)) > after_step):
            out.append((int(m.group(1)), Path(folder) / name))
    return sorted(out)


def read_lines(fh: BinaryIO, limit: int = MAX_LINE) -> Iterator[tuple[bytes | None, int, bool]]:
    """The lines of the binary file ``fh`` from where it stands, read only as far as they are iterated: (the line
    without its newline, or None when it is longer than ``limit`` bytes and was skipped unread; its size in the file;
    whether it ends with a newline; only the file's last line may not)."""
    while True:
        raw = fh.readline(limit + 1)
        if not raw:
            return
        if raw.endswith(b"\n"):
            yield raw[:-1], len(raw), True
        elif len(raw) <= limit:  # the end of the file
            yield raw, len(raw), False
        else:  # too long: skip to its end
            size, more = len(raw), raw
            while more and not more.endswith(b"\n"):
                more = fh.readline(2**20)
                size += len(more)
            yield None, size, bool(more)


def _constant(name: str) -> float | None:
    """JSON's non-standard constants (Python's ``json.dumps`` writes them): ``NaN`` → None ("no value", as the
    writer's own ``dumps`` writes it), ``Infinity`` / ``-Infinity`` → ±inf (refused by the field checks)."""
    return None if name == "NaN" else float(name.replace("Infinity", "inf"))


def parse_row(raw: bytes | None, path: str | Path, n: int) -> dict | None:
    """One JSONL line as an object (None for a blank line); ``NaN`` reads as null (:func:`_constant`), the rule of
    every log reader; :class:`CreditLogError` naming the file and the row for a line that cannot be read."""
    if raw is None:
        raise CreditLogError(path, n, "", f"longer than {MAX_LINE // 2**20} MiB: not read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CreditLogError(path, n, "", f"not UTF-8 text: byte 0x{raw[e.start]:02x} at column {e.start + 1} "
                                          "cannot be decoded") from None
    text = text.removeprefix("\ufeff") if n == 1 else text
    if not text.strip():
        return None
    try:
        obj = json.loads(text, parse_constant=_constant)
    except json.JSONDecodeError as e:
        raise CreditLogError(path, n, "", f"not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise CreditLogError(path, n, "", "not valid JSON here (nested too deeply)") from None
    except ValueError as e:  # an integer with more digits than Python converts
        raise CreditLogError(path, n, "", f"not valid JSON ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(obj, dict):
        raise CreditLogError(path, n, "", "each line must be a JSON object")
    return obj


def json_rows(path: str | Path, bad: Bad | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each line of a JSONL file, read line by line (:func:`parse_row`); a line that cannot
    be read is a :class:`CreditLogError` naming the file and the line, raised, or with ``bad`` given passed to it and
    skipped (a file that cannot be opened too: no rows).  Only regular files are opened
    (:func:`mrtpo.creditlog.access.open_log_file`)."""
    try:
        fh = open_log_file(path)
    except CreditLogError as e:
        if bad is None:
            raise
        bad(e)
        return
    with fh:
        for n, (raw, _, _) in enumerate(read_lines(fh), start=1):
            try:
                obj = parse_row(raw, path, n)
            except CreditLogError as e:
                if bad is None:
                    raise
                bad(e)
                continue
            if obj is not None:
                yield n, obj


def first_rows(path: str | Path, lines: int = 20) -> Iterator[tuple[int, dict | CreditLogError]]:
    """(line number, object or its problem) of the first ``lines`` non-blank lines of a JSONL file, reading nothing
    past them (a format's detection looks at a file's first rows only)."""
    with open_log_file(path) as fh:
        seen = 0
        for n, (raw, _, _) in enumerate(read_lines(fh), start=1):
            try:
                obj = parse_row(raw, path, n)
            except CreditLogError as e:
                obj = e
            if obj is not None:
                yield n, obj
                seen += 1
                if seen >= lines:
                    return


def read_step_file(path: str | Path, step: int | None = None, bad: Bad | None = None) -> list[CreditRow]:
    """The rows of one step file, each checked (:func:`mrtpo.creditlog.format.check_row`); a row whose ``step``
    is not the file's is an error too.  Errors are raised, or with ``bad`` given passed to it and the row skipped."""
    rows = []
    for n, obj in json_rows(path, bad):
        try:
            r = check_row(obj, path, n)
            if step is not None and r.step != step:
                raise CreditLogError(path, n, "step", f"is {r.step} in the file of step {step}")
        except CreditLogError as e:
            if bad is None:
                raise
            bad(e)
            continue
        rows.append(r)
    return rows


def read_credit_log(folder: str | Path, after_step: int | None = None, bad: Bad | None = None) -> CreditLog:
    """The credit log in ``folder``: its meta and the steps after ``after_step`` (every step: None), reading only
    those steps' files.  :class:`CreditLogError` (an :class:`MrtpoError`) names the file, the row and the field of
    any problem: a folder this user may not read, no ``meta.json``, another format or a newer version, a line that
    is not JSON, a missing field, a row of another run than the log's (:func:`mrtpo.creditlog.owner.check_run`).
    With ``bad`` given, a row that cannot be read is passed to it and skipped, and the other rows and steps are read
    (a step whose rows are all bad has none); rows of another run are never skipped: they are an error."""
    meta = read_meta(folder)
    steps = [CreditStep(s, str(p), read_step_file(p, s, bad)) for s, p in step_files(folder, after_step)]
    for st in steps:
        check_run(meta, st.path, st.rows)  # every row the log's run's: a folder never shows two runs as one
    return CreditLog(str(folder), meta, steps)


class CreditLogFollower:
    """Follows a growing log: each :meth:`poll` returns the steps written since the last one (the first: every
    step), reading only their files.  A row that cannot be read is skipped and kept in :attr:`problems` (the rest
    of its step and the other steps are read); CreditLogError when the folder's log has become another run's."""

    def __init__(self, folder: str | Path):
        self.folder = str(folder)
        self.last_step: int | None = None
        self.meta: dict | None = None
        self.problems: list[CreditLogError] = []

    def poll(self) -> list[CreditStep]:
        log = read_credit_log(self.folder, self.last_step, bad=self.problems.append)
        if self.last_step is not None:  # steps of one run read: another's may not follow them
            check_same_run(self.meta, log.meta, self.folder)
        self.meta = log.meta
        if log.steps:
            self.last_step = log.steps[-1].step
        return log.steps
