"""Bring your own rollouts: TRL completions logs and verl-style JSONL dumps, explained token by token.

Two input formats (one row = one sampled completion):

- ``trl``: the parquet files ``GRPOTrainer`` writes with ``log_completions=True``
  (``<output_dir>/completions/completions_00010.parquet``): columns ``step``, ``prompt``, ``completion``, one column
  per reward function, optional extra columns, ``advantage``. ``prompt`` / ``completion`` are text or chat messages.
  A folder reads every ``*.parquet`` in it, in name order.
- ``verl``: JSONL lines ``{"input", "output", "score", "step", ...extra fields}`` (verl's ``rollout_data_dir`` dumps).
  ``score`` is a number (one reward named ``score``) or an object ``{reward: value}``; numeric extra fields can be
  rewards too.

A reward cell follows the rule of every reader of rewards (:func:`mrtpo.validate.reward`): a number, or true / false
as 1 / 0; null / NaN not scored; text refused (even ``"1"``).

Rows are grouped by (step, prompt). Which columns are the rewards, and what each reward's checker reads, comes
from :class:`mrtpo.integrations.rollout_explain.RolloutVerifierInfo` (the CLI's ``--verifier-template``): a JSON
object ``{reward column: text}``, where the text uses the row's fields as plain named placeholders (``{reference}``,
``{score}``, ``{prompt}``, ``{completion}``; filled by :func:`mrtpo.templates.fill_fields`, never evaluated). Each
group is then replayed and shown as token views (:mod:`mrtpo.integrations.rollout_explain`).

Malformed files raise :class:`RolloutFileError` naming the file, the row (1-based) and the column; the readers take
``bad``: given, a row that cannot be read is passed to it and skipped (the run viewer's follower).  Only regular files
are read (:func:`mrtpo.creditlog.access.check_log_file`: a device or a FIFO is refused unread).  ``NaN`` in a reward
or advantage cell is "not scored" (as TRL logs a None reward).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mrtpo.creditlog.access import check_log_file
from mrtpo.creditlog.format import CreditLogError
from mrtpo.errors import MrtpoError, TaskFileError
from mrtpo.jsonl import InputFileError, json_lines

FORMATS = ("trl", "verl")
_TRL_RESERVED = ("step", "prompt", "completion", "advantage")
Bad = Callable[[MrtpoError], None]  # where a lenient reader puts a row it skips


class RolloutFileError(TaskFileError):
    """A rollout file problem: ``group`` (:attr:`RolloutGroup.where`, when the problem is a group's), ``row``
    (1-based; None for the whole file or group) and ``column`` (None when the problem is not in one column: the file
    cannot be read, a line is not JSON) say where: ``FILE: group of rows 5, 6, 7 (step 2): row 6: column 'C':
    problem``."""

    def __init__(self, path: str | Path, row: int | None, column: str | None, problem: str, group: str | None = None):
        super().__init__(str(path), row or 0, column or "", problem)
        self.group = group
        where = (f"{group}: " if group else "") + (f"row {row}: " if row else "") + \
            (f"column '{column}': " if column else "")
        self.args = (f"{path}: {where}{problem}",)

    def __str__(self) -> str:
        return self.args[0]


# ---------------------------------------------------------------------------------------------- rows
@dataclass
class RolloutRow:
    """One completion from a rollout file.

    fields: every column as text (the verifier template's placeholders), plus ``prompt`` and ``completion``.
    values: the raw column values (rewards are looked up here).
    """

    source: str
    row: int  # 1-based within ``source``
    step: int | None
    prompt: str
    completion: str
    fields: dict[str, str]
    values: dict[str, Any]
    advantage: float | None = None


@dataclass
class RolloutGroup:
    """Rows sharing (step, prompt), in file order."""

    step: int | None
    prompt: str
    rows: list[RolloutRow] = field(default_factory=list)

    @property
    def id(self) -> str:
        r = self.rows[0]
        return f"{Path(r.source).name}:row{r.row}" + (f":step{self.step}" if self.step is not None else "")

    @property
    def where(self) -> str:
        """The group in messages: ``group of rows 3, 4, 5, 6 (step 2)``."""
        rows = [r.row for r in self.rows]
        shown = ", ".join(map(str, rows)) if len(rows) <= 8 else f"{rows[0]}, {rows[1]}, …, {rows[-1]}"
        return f"group of rows {shown}" + (f" (step {self.step})" if self.step is not None else "")


def _as_text(v: Any) -> str:
    """A column value as template text: strings as is, numbers plainly, None → "", anything else as JSON."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v)).lower()
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return f"{float(v):g}"
    return json.dumps(_plain(v), ensure_ascii=False)


def _plain(v: Any) -> Any:
    """numpy / pyarrow containers → plain Python (lists, dicts, scalars) for JSON."""
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, np.generic):
        return v.item()
    return v


_CHATML = re.compile(r"<\|im_start\|>user\s*\n(.*?)(?:<\|im_end\|>|$)", re.S)
_LLAMA3 = re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\s*(.*?)(?:<\|eot_id\|>|$)", re.S)


def _message_text(v: Any, role: str, path, row: int, column: str) -> str:
    """Text of a prompt / completion cell: plain text, or chat messages (last ``user`` turn / ``assistant`` turns).

    A chat-templated prompt string (ChatML or Llama 3, as verl dumps it) gives its last user turn.
    """
    v = _plain(v)
    if isinstance(v, str):
        if role == "user":
            for pat in (_CHATML, _LLAMA3):
                found = pat.findall(v)
                if found:
                    return found[-1].strip()
        return v
    if isinstance(v, list) and all(isinstance(m, dict) and "content" in m for m in v) and v:
        turns = [m for m in v if m.get("role") == role] or ([v[-1]] if role == "user" else v)
        parts = [_content_text(m["content"]) for m in turns]
        if any(p is None for p in parts):
            raise RolloutFileError(path, row, column, "a message's 'content' must be text or a list of text parts")
        return parts[-1] if role == "user" else "".join(parts)
    kind = "missing" if v is None else f"a {type(v).__name__}"
    raise RolloutFileError(path, row, column, f"expected text or a list of chat messages, got {kind}")


def _content_text(c: Any) -> str | None:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        texts = [p.get("text") for p in c if isinstance(p, dict) and p.get("type", "text") == "text"]
        return "".join(t for t in texts if isinstance(t, str))
    return None


def _number(v: Any, path, row: int, column: str, what: str = "a number") -> float:
    """An advantage or step cell as float (a reward cell: :func:`mrtpo.validate.reward`); None and NaN → NaN; ±inf
    and anything that is not a number are errors naming the row and column."""
    v = _plain(v)
    x = None
    if v is None:
        return float("nan")
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        try:
            x = float(v)
        except OverflowError:  # an integer beyond float's range
            x = math.inf
    elif isinstance(v, str):
        try:
            x = float(v)
        except ValueError:
            pass
    if x is None:
        shown = repr(v) if not isinstance(v, (list, dict)) else type(v).__name__
        raise RolloutFileError(path, row, column, f"must be {what}, got {shown[:60]}")
    if math.isinf(x):
        raise RolloutFileError(path, row, column, f"must be a finite number, got {x:g}")
    return x


def _step(v: Any, path, row: int, column: str = "step") -> int:
    """A step cell: an integer >= 0 (``None`` cells are handled by the caller: no step)."""
    x = _number(v, path, row, column, "an integer step")
    if math.isnan(x) or x < 0 or x != int(x):
        raise RolloutFileError(path, row, column, f"must be an integer step >= 0, got {x:g}")
    return int(x)


def _make_row(path, n: int, values: dict[str, Any], prompt_col: str, completion_col: str) -> RolloutRow:
    for col in (prompt_col, completion_col):
        if col not in values:
            raise RolloutFileError(path, n, col, "missing")
    prompt = _message_text(values[prompt_col], "user", path, n, prompt_col)
    completion = _message_text(values[completion_col], "assistant", path, n, completion_col)
    if not prompt.strip():
        raise RolloutFileError(path, n, prompt_col, "empty prompt")
    step = _step(values["step"], path, n) if values.get("step") is not None else None
    adv = _number(values["advantage"], path, n, "advantage") if values.get("advantage") is not None else None
    fields = {str(k): _as_text(v) for k, v in values.items()}
    fields["prompt"], fields["completion"] = prompt, completion
    return RolloutRow(str(path), n, step, prompt, completion, fields, values, adv)


# ---------------------------------------------------------------------------------------------- readers
def read_trl(path: str | Path, bad: Bad | None = None) -> list[RolloutRow]:
    """Rows of a TRL completions log: one parquet file, or every ``*.parquet`` in a folder (name order)."""
    path = Path(path)
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise RolloutFileError(path, None, None, "no .parquet files in this folder")
    rows: list[RolloutRow] = []
    for f in files:
        rows.extend(_read_trl_file(f, bad))
    return rows


def _regular(path: Path) -> None:
    """A regular file (under the roots of :func:`mrtpo.creditlog.access.reading_under`), else RolloutFileError."""
    if not path.exists():  # (each reader says it its way)
        return
    try:
        check_log_file(path)
    except CreditLogError as e:
        raise RolloutFileError(path, None, None, e.problem) from None


def _rows_of(path: Path, records, prompt_col: str, completion_col: str, bad: Bad | None) -> list[RolloutRow]:
    """:func:`_make_row` over ``(row number, values)``; a bad row raised, or passed to ``bad`` and skipped."""
    rows = []
    for n, values in records:
        try:
            rows.append(_make_row(path, n, values, prompt_col, completion_col))
        except RolloutFileError as e:
            if bad is None:
                raise
            bad(e)
    return rows


def _read_trl_file(path: Path, bad: Bad | None = None) -> list[RolloutRow]:
    import pandas as pd

    _regular(path)
    try:
        df = pd.read_parquet(path)
    except FileNotFoundError:
        raise RolloutFileError(path, None, None, "file not found") from None
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise RolloutFileError(path, None, None, f"not a readable parquet file ({_reader_problem(e, path)})") from None
    for col in ("prompt", "completion"):
        if col not in df.columns:
            raise RolloutFileError(path, None, col, f"missing (columns: {', '.join(map(str, df.columns))})")
    records = df.to_dict(orient="records")
    return _rows_of(path, enumerate(records, start=1), "prompt", "completion", bad)


def _reader_problem(e: Exception, path: Path, limit: int = 300) -> str:
    """The parquet reader's message as one clause: the file's path and the reader's boilerplate removed (the message
    names the file already), whole sentences only (cut after the last full sentence within ``limit`` characters)."""
    text = " ".join(str(e).split()) or type(e).__name__
    text = re.sub(r"^Could not open Parquet input source '[^']*':\s*", "", text).replace(str(path), path.name)
    if len(text) > limit:
        cut = text[:limit]
        end = max(cut.rfind(". "), cut.rfind("; "))
        text = cut[:end] if end > 0 else cut.rsplit(" ", 1)[0] + " …"
    return text.rstrip(". ")


def read_verl(path: str | Path, bad: Bad | None = None) -> list[RolloutRow]:
    """Rows of a verl-style JSONL dump: ``{"input", "output", "score", "step", ...}`` per line.

    ``score`` as an object adds its entries as columns (reward values); columns already present win.
    """
    path = Path(path)
    _regular(path)
    try:
        lines = list(json_lines(path))
    except InputFileError as e:
        raise RolloutFileError(path, None, None, e.problem) from None
    records = []
    for n, obj, problem in lines:
        if problem is not None:
            if bad is None:
                raise RolloutFileError(path, n, None, problem)
            bad(RolloutFileError(path, n, None, problem))
            continue
        values = dict(obj)
        if isinstance(obj.get("score"), dict):
            for k, v in obj["score"].items():
                values.setdefault(str(k), v)
        records.append((n, values))
    return _rows_of(path, records, "input", "output", bad)


def detect_format(path: str | Path) -> str:
    """``trl`` for parquet files / folders, ``verl`` for JSONL."""
    p = Path(path)
    if p.is_dir() or p.suffix.lower() == ".parquet":
        return "trl"
    if p.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        return "verl"
    raise MrtpoError(f"cannot tell the format of {path} from its name; pass --format trl (parquet) or verl (JSONL)")


def read_rollouts(path: str | Path, fmt: str = "auto", bad: Bad | None = None) -> list[RolloutRow]:
    """Rows of a rollout file in format ``trl``, ``verl`` or ``auto`` (by file name); ``bad``: see the module's
    docstring."""
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise MrtpoError(f"unknown rollout format '{fmt}'; use trl (parquet) or verl (JSONL)")
    rows = read_trl(path, bad) if fmt == "trl" else read_verl(path, bad)
    if not rows:
        raise RolloutFileError(path, None, None, "no rows")
    return rows


def group_rows(rows: Sequence[RolloutRow]) -> list[RolloutGroup]:
    """Group rows by (step, prompt), groups and rows in file order."""
    groups: dict[tuple, RolloutGroup] = {}
    for r in rows:
        key = (r.source, r.step, r.prompt)
        if key not in groups:
            groups[key] = RolloutGroup(r.step, r.prompt)
        groups[key].rows.append(r)
    return list(groups.values())
