"""Following a run's log while it trains, in any format :mod:`mrtpo.integrations.tool_logs` reads: each
:meth:`RunFollower.poll` returns the steps that are complete and new since the last poll, and never reads an old
step again.

- mrtpo's credit log: the step files after the last one read (the folder listing says which;
  :class:`mrtpo.creditlog.CreditLogFollower`).  A step's file is whole once it exists.
- prime-rl's token export (``token_exports`` or the output folder): the ``step_N`` folders after the last one read
  that have their ``STABLE`` file (one step's folder or rank file, given directly, is read once).
- OpenRLHF's board JSONL (a file or a folder of per-rank files, appended to as it trains): each file is read from
  where the last poll stopped (its byte offset), whole lines only (a line without its newline is being written).
  Its newest step is held back until a later step appears in the log (another rank may still append to it), or
  until the log is **quiet**: no file of it has changed for ``quiet`` seconds (30 by default: the run has finished,
  so its last step is shown); :meth:`RunFollower.poll` with ``final=True`` (the run is over) returns it at once.
  Rows that come for a step already returned are skipped with a problem saying so.
- TRL's completions logs (``completions_00010.parquet``, one file per logging step) and verl's dumps (``10.jsonl``,
  one per step): the files of the folder not read before, in name order; a file that cannot be read yet (being
  written) is tried again at the next poll; once it is quiet (or ``final=True``) its bad rows are skipped (and a
  file that cannot be read at all is skipped), each with a problem.

Broken parts stay local: a row that cannot be read (a torn line, a missing field, an infinity) is skipped and kept
in :attr:`RunFollower.problems` (naming the file and the row), and the rest of the log is read; the follower moves
on past it.  ``NaN`` is "no value" in every format (a reward not scored, a per-token value missing).

With ``roots`` (the app: :func:`mrtpo.creditlog.access.log_roots`), the path is checked at every poll
(:func:`mrtpo.creditlog.access.check_log_path`) and every file the poll opens must lie under them
(:func:`mrtpo.creditlog.access.reading_under`); devices and FIFOs are never opened, with or without roots.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Sequence

from mrtpo.creditlog import CreditLogError, CreditLogFollower, CreditRow, CreditStep
from mrtpo.creditlog.access import check_log_path, open_log_file, reading_under
from mrtpo.creditlog.files import parse_row, read_lines
from mrtpo.errors import MrtpoError
from mrtpo.integrations.tool_logs import (
    Decode,
    board_row,
    detect_format,
    group_steps,
    log_folder,
    read_prime_rl,
    read_rollout_log,
)

QUIET_S = 30.0  # seconds without a change after which a board log's newest step is shown (the run has finished)


class RunFollower:
    """Polls a growing run log (module docstring); ``fmt`` as :func:`mrtpo.integrations.tool_logs.detect_format`
    gives it (``auto``: detected at the first poll that finds something).  A run folder is followed where it keeps
    its log (:func:`mrtpo.integrations.tool_logs.log_folder`, until the first step is read): ``path`` says where.
    ``roots``: the folders it may read under (None: anywhere); ``quiet``: seconds without a change after which the
    log counts as finished."""

    def __init__(self, path: str | Path, fmt: str = "auto", decode: Decode | None = None,
                 roots: Sequence[Path] | None = None, quiet: float = QUIET_S):
        self.path, self.fmt, self.decode = Path(path), fmt, decode
        self.roots, self.quiet = (None if roots is None else list(roots)), quiet
        self.last_step: int | None = None
        self.problems: list[MrtpoError] = []  # rows (or files) skipped: they could not be read
        self._credit: CreditLogFollower | None = None
        self._offsets: dict[Path, int] = {}  # board files: bytes read so far
        self._lines: dict[Path, int] = {}  # board files: lines read so far (rows are named by line)
        self._pending: list[CreditRow] = []  # board rows of steps not yet returned
        self._done: set[Path] = set()  # TRL / verl files read
        self._refused: set[Path] = set()  # board files that cannot be opened (their problem is kept once)

    @property
    def meta(self) -> dict | None:
        """A credit log's ``meta.json`` (model, method, measure, reward names, ...), once polled; None for other
        formats."""
        return self._credit.meta if self._credit is not None else None

    def poll(self, final: bool = False) -> list[CreditStep]:
        """The complete steps written since the last poll (step order)."""
        with reading_under(self.roots):
            if self.roots is not None:
                check_log_path(self.path, self.roots)
            steps = self._poll(final)
        if steps:
            self.last_step = steps[-1].step
        return steps

    def _poll(self, final: bool) -> list[CreditStep]:
        if self.last_step is None and self._credit is None:  # nothing read yet: where the run keeps its log
            self.path = log_folder(self.path)
        if self.fmt == "auto":
            self.fmt = detect_format(self.path)
        if self.fmt == "credit-log":
            if self._credit is None:
                self._credit = CreditLogFollower(self.path)
                self._credit.problems = self.problems  # one list: the credit log's skipped rows are ours
            return self._credit.poll()
        if self.fmt == "prime-rl":
            if self.last_step is not None and (self.path.is_file() or any(self.path.glob("rank_*.jsonl"))):
                return []  # one step's file or folder, read already: nothing new can come
            return read_prime_rl(self.path, self.last_step, self.decode, bad=self.problems.append)
        if self.fmt == "board":
            return self._poll_board(final)
        if self.fmt in ("trl", "verl"):
            return self._poll_files(final)
        raise CreditLogError(self.path, 0, "", f"unknown format '{self.fmt}'")

    def _quiet(self, files: list[Path]) -> bool:
        """Whether none of ``files`` has changed for :attr:`quiet` seconds."""
        times = [f.stat().st_mtime for f in files if f.exists()]
        return bool(times) and time.time() - max(times) >= self.quiet

    def _poll_board(self, final: bool) -> list[CreditStep]:
        files = sorted(self.path.glob("*.jsonl")) if self.path.is_dir() else [self.path]
        for f in files:
            self._pending += self._new_rows(f)
        final = final or self._quiet(files)
        newest = max((r.step for r in self._pending), default=None)
        ready = [r for r in self._pending if final or r.step < newest]
        self._pending = [r for r in self._pending if not (final or r.step < newest)]
        late = [r for r in ready if self.last_step is not None and r.step <= self.last_step]
        for r in late:
            self.problems.append(CreditLogError(r.source, r.row, "step", f"step {r.step} was shown already (this row "
                                                "came after a later step, or after the log had been quiet): skipped"))
        ready = [r for r in ready if self.last_step is None or r.step > self.last_step]
        return group_steps(ready, lambda r: r.prompt)

    def _poll_files(self, final: bool) -> list[CreditStep]:
        pattern = "*.parquet" if self.fmt == "trl" else "*.jsonl"
        files = sorted(self.path.glob(pattern), key=_natural) if self.path.is_dir() else [self.path]
        steps = []
        for f in files:
            if f in self._done:
                continue
            try:
                steps += read_rollout_log(f, self.fmt)
            except MrtpoError as e:
                if not (final or self._quiet([f])):
                    break  # being written: again at the next poll, and the files after it too (their order)
                try:  # it stays as it is: its readable rows, the others skipped with their problems
                    steps += read_rollout_log(f, self.fmt, bad=self.problems.append)
                except MrtpoError:
                    self.problems.append(e)  # not readable at all: skipped
            self._done.add(f)
        return sorted(steps, key=lambda st: st.step)

    def _new_rows(self, f: Path) -> list[CreditRow]:
        """The whole lines appended to ``f`` since the last poll, as rows (read from where the last poll stopped,
        line by line); a line that cannot be read is skipped and kept in :attr:`problems`."""
        if f in self._refused:
            return []
        start = self._offsets.get(f, 0)
        try:
            fh = open_log_file(f)
        except CreditLogError as e:
            if not f.exists():
                raise
            self._refused.add(f)  # a FIFO, a device, a file outside the roots: never opened, said once
            self.problems.append(e)
            return []
        rows, n, end = [], self._lines.get(f, 0), start
        with fh:
            fh.seek(start)
            for raw, size, whole in read_lines(fh):
                if not whole:
                    break  # being written
                n, end = n + 1, end + size
                try:
                    obj = parse_row(raw, f, n)
                    if obj is not None:
                        rows.append(board_row(obj, f, n))
                except CreditLogError as e:
                    self.problems.append(e)
        self._offsets[f], self._lines[f] = end, n
        return rows


def _natural(p: Path) -> list:
    """Name order with numbers by value: ``2.jsonl`` before ``10.jsonl`` (verl names its dumps by step)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]
