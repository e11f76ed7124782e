"""Following a run's log while it trains, in any format :mod:`mrtpo.integrations.tool_logs` reads: each
:meth:`RunFollower.poll` returns the steps that are complete and new since the last poll, and never reads an old
step again.

- mrtpo's credit log: the step files after the last one read (the folder listing says which;
  :class:`mrtpo.creditlog.CreditLogFollower`).  A step's file is whole once it exists.
- prime-rl's token export (``token_exports`` or the output folder): the ``step_N`` folders after the last one read
  that have their ``STABLE`` file.
- OpenRLHF's board JSONL (a file or a folder of per-rank files, appended to as it trains): each file is read from
  where the last poll stopped (its byte offset), whole lines only (a line without its newline is being written).
  Its newest step is held back until a later step appears in the log (another rank may still append to it);
  :meth:`RunFollower.poll` with ``final=True`` (the run is over) returns it too.
- TRL's completions logs (``completions_00010.parquet``, one file per logging step) and verl's dumps (``10.jsonl``,
  one per step): the files of the folder not read before, in name order; a file that cannot be read yet (being
  written) is tried again at the next poll (``final=True``: its problem is raised).
"""
from __future__ import annotations

import re
from pathlib import Path

from mrtpo.creditlog import CreditLogError, CreditLogFollower, CreditRow, CreditStep
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
from mrtpo.jsonl import parse_json


class RunFollower:
    """Polls a growing run log (module docstring); ``fmt`` as :func:`mrtpo.integrations.tool_logs.detect_format`
    gives it (``auto``: detected at the first poll that finds something).  A run folder is followed where it keeps
    its log (:func:`mrtpo.integrations.tool_logs.log_folder`, until the first step is read): ``path`` says where."""

    def __init__(self, path: str | Path, fmt: str = "auto", decode: Decode | None = None):
        self.path, self.fmt, self.decode = Path(path), fmt, decode
        self.last_step: int | None = None
        self._credit: CreditLogFollower | None = None
        self._offsets: dict[Path, int] = {}  # board files: bytes read so far
        self._lines: dict[Path, int] = {}  # board files: lines read so far (rows are named by line)
        self._pending: list[CreditRow] = []  # board rows of steps not yet returned
        self._done: set[Path] = set()  # TRL / verl files read

    @property
    def meta(self) -> dict | None:
        """A credit log's ``meta.json`` (model, method, measure, reward names, ...), once polled; None for other
        formats."""
        return self._credit.meta if self._credit is not None else None

    def poll(self, final: bool = False) -> list[CreditStep]:
        """The complete steps written since the last poll (step order)."""
        if self.last_step is None and self._credit is None:  # nothing read yet: where the run keeps its log
            self.path = log_folder(self.path)
        if self.fmt == "auto":
            self.fmt = detect_format(self.path)
        if self.fmt == "credit-log":
            self._credit = self._credit or CreditLogFollower(self.path)
            steps = self._credit.poll()
        elif self.fmt == "prime-rl":
            steps = read_prime_rl(self.path, self.last_step, self.decode)
        elif self.fmt == "board":
            steps = self._poll_board(final)
        elif self.fmt in ("trl", "verl"):
            steps = self._poll_files(final)
        else:
            raise CreditLogError(self.path, 0, "", f"unknown format '{self.fmt}'")
        if steps:
            self.last_step = steps[-1].step
        return steps

    def _poll_board(self, final: bool) -> list[CreditStep]:
        files = sorted(self.path.glob("*.jsonl")) if self.path.is_dir() else [self.path]
        for f in files:
            self._pending += self._new_rows(f)
        newest = max((r.step for r in self._pending), default=None)
        ready = [r for r in self._pending if final or r.step < newest]
        self._pending = [r for r in self._pending if not (final or r.step < newest)]
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
            except MrtpoError:
                if final:
                    raise
                break  # being written: again at the next poll, and the files after it too (their order)
            self._done.add(f)
        return sorted(steps, key=lambda st: st.step)

    def _new_rows(self, f: Path) -> list[CreditRow]:
        """The whole lines appended to ``f`` since the last poll, as rows."""
        start = self._offsets.get(f, 0)
        try:
            with open(f, "rb") as fh:
                fh.seek(start)
                data = fh.read()
        except OSError as e:
            raise CreditLogError(f, 0, "", f"cannot read: {e.strerror or e}") from None
        end = data.rfind(b"\n") + 1  # whole lines only
        rows, n = [], self._lines.get(f, 0)
        for raw in data[:end].split(b"\n")[:-1]:
            n += 1
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise CreditLogError(f, n, "", "not UTF-8 text") from None
            if not text.strip():
                continue
            try:
                obj = parse_json(text)
            except ValueError as e:
                raise CreditLogError(f, n, "", str(e).replace(" at line 1, column", " at column")) from None
            if not isinstance(obj, dict):
                raise CreditLogError(f, n, "", "each line must be a JSON object")
            rows.append(board_row(obj, f, n))
        self._offsets[f], self._lines[f] = start + end, n
        return rows


def _natural(p: Path) -> list:
    """Name order with numbers by value: ``2.jsonl`` before ``10.jsonl`` (verl names its dumps by step)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]
