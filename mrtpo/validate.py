"""Checks of user input: CLI flag types and values inside JSON documents, each failure saying where.

Flags: :func:`int_flag` and :func:`float_flag` are argparse ``type=`` functions; argparse
prints ``argument --beta: must be a number in [0, 1], got '1.5'`` and exits with code 2.

Values: each check takes the value and its ``field`` (a path such as ``rewards[2][1]``) and raises
:class:`BadValue`; ``err.at(path, line)`` turns it into the user-facing :class:`MrtpoError`
``PATH: line L: field 'rewards[2][1]': must be a finite number, got inf``.

Numbers: finite, and within float32's range (every number goes into a float32 tensor).  ``nan_ok`` lets ``null``
and NaN through as NaN: a reward that was not scored (TRL's convention; its advantage is 0).  Rewards have one rule in
every reader (:func:`reward`): a number, or true / false as 1 / 0; ``null`` / NaN not scored; text refused.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Callable

from mrtpo.errors import MrtpoError, TaskFileError
from mrtpo.wording import plural

FLOAT32_MAX = 3.4028234663852886e38


class BadValue(ValueError):
    """A bad value at ``field`` of a JSON input."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"field '{field}': {problem}")

    def at(self, path: str, line: int | None = None) -> MrtpoError:
        """The error naming the file (and line, for JSONL inputs)."""
        if line:
            return TaskFileError(path, line, self.field, self.problem)
        return MrtpoError(f"{path}: field '{self.field}': {self.problem}")


def _shown(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, dict)):
        return "a list" if isinstance(v, list) else "an object"
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


# ---------------------------------------------------------------------------------------------- values
def number(v: Any, field: str, lo: float | None = None, hi: float | None = None, nan_ok: bool = False) -> float:
    """``v`` as a float: a JSON number (true / false count as 1 / 0), finite, within [lo, hi] when given.

    ``nan_ok``: ``null`` and NaN pass as NaN ("not scored").
    """
    if (v is None or (isinstance(v, float) and math.isnan(v))) and nan_ok:
        return math.nan
    if not isinstance(v, (int, float)):
        raise BadValue(field, f"must be a number, got {_shown(v)}")
    try:
        x = float(v)
    except OverflowError:
        raise BadValue(field, "is too large (must be within ±3.4e38)") from None
    if not math.isfinite(x):
        raise BadValue(field, f"must be a finite number, got {_shown(v)}")
    if abs(x) > FLOAT32_MAX:
        raise BadValue(field, f"is too large (must be within ±3.4e38), got {x:g}")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        if lo is not None and hi is not None:
            rng = f"in [{lo:g}, {hi:g}]"
        else:
            rng = f">= {lo:g}" if lo is not None else f"<= {hi:g}"
        raise BadValue(field, f"must be {rng}, got {x:g}")
    return x


REWARD_VALUE = "a number, true / false (1 / 0) or null (not scored)"


def reward(v: Any, field: str) -> float:
    """A reward value, by the one rule of every reader of rewards (the CLI's inputs, rollout files, other trainers'
    logs, the credit log): a number (finite, within float32's range) or a boolean — true / false count as 1 / 0, a
    checker's pass or fail; ``null`` and NaN are NaN (not scored).  Anything else is refused, text too, even ``"1"``
    (a number in quotes is text): :class:`BadValue`.  A numpy scalar (a parquet cell) counts as its Python value."""
    if type(v).__module__ == "numpy" and hasattr(v, "item"):
        v = v.item()
    if not (v is None or isinstance(v, (int, float))):
        raise BadValue(field, f"must be {REWARD_VALUE}, got {_shown(v)}")
    return number(v, field, nan_ok=True)


def number_list(v: Any, field: str, length: int | None = None, nonempty: bool = True,
                each: Callable[[Any, str], float] | None = None, **kw) -> list[float]:
    """A list of numbers (see :func:`number` for ``kw``), of ``length`` when given; ``each(value, field)`` checks each
    one instead (:func:`reward` for rewards)."""
    if not isinstance(v, list):
        raise BadValue(field, f"must be a list of numbers, got {_shown(v)}")
    if length is not None and len(v) != length:
        raise BadValue(field, f"has {plural(len(v), 'number')}, expected {length}")
    if nonempty and not v:
        raise BadValue(field, "is empty")
    check = each or (lambda x, f: number(x, f, **kw))
    return [check(x, f"{field}[{i}]") for i, x in enumerate(v)]


def number_matrix(v: Any, field: str, rows: int | None = None, cols: int | None = None, **kw) -> list[list[float]]:
    """A rectangular N × K list of number lists (N, K ≥ 1; a flat list of numbers is N × 1); ``kw`` as
    :func:`number_list` takes them."""
    if not isinstance(v, list):
        raise BadValue(field, f"must be a list of rows (N rows × K numbers), got {_shown(v)}")
    if not v:
        raise BadValue(field, "is empty (give N rows × K numbers)")
    if not any(isinstance(r, list) for r in v):
        v = [[x] for x in v]
    if rows is not None and len(v) != rows:
        raise BadValue(field, f"has {plural(len(v), 'row')}, expected {rows}")
    k = cols if cols is not None else len(v[0]) if isinstance(v[0], list) else None
    out = []
    for i, r in enumerate(v):
        if not isinstance(r, list):
            raise BadValue(f"{field}[{i}]", f"must be a list of numbers (a row), got {_shown(r)}")
        if len(r) != k:
            raise BadValue(f"{field}[{i}]", f"has {plural(len(r), 'number')}, expected {k} (the rows "
                                              "must be rectangular)")
        out.append(number_list(r, f"{field}[{i}]", **kw))
    return out


def string(v: Any, field: str, nonempty: bool = False) -> str:
    """A string that is valid Unicode (no lone surrogates such as ``\\ud800``), non-empty when asked."""
    if not isinstance(v, str):
        raise BadValue(field, f"must be a string, got {_shown(v)}")
    if nonempty and not v:
        raise BadValue(field, "is empty")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadValue(field, f"holds a lone surrogate {v[e.start]!r} at character {e.start} "
                              "(not valid Unicode text)") from None
    return v


def string_list(v: Any, field: str, length: int | None = None, distinct: bool = False, **kw) -> list[str]:
    """A list of strings (see :func:`string`), of ``length`` when given, without repeats when ``distinct``."""
    if not isinstance(v, list):
        raise BadValue(field, f"must be a list of strings, got {_shown(v)}")
    if length is not None and len(v) != length:
        raise BadValue(field, f"has {plural(len(v), 'entry', 'entries')}, expected {length}")
    out = [string(x, f"{field}[{i}]", **kw) for i, x in enumerate(v)]
    if distinct and len(set(out)) < len(out):
        dup = next(x for i, x in enumerate(out) if x in out[:i])
        raise BadValue(field, f"names {dup!r} twice")
    return out


def text_map(v: Any, field: str) -> dict[str, str]:
    """A non-empty JSON object {name: text} (e.g. verifier information {reward: text})."""
    if not isinstance(v, dict):
        raise BadValue(field, f"must be an object {{reward: text}}, got {_shown(v)}")
    if not v:
        raise BadValue(field, "is empty (give at least one reward's text)")
    for k, x in v.items():
        string(k, f"{field} key")
        string(x, f"{field}.{k}")
    return dict(v)


# ---------------------------------------------------------------------------------------------- flags
def int_flag(lo: int | None = None, hi: int | None = None):
    """argparse type: an integer in [lo, hi]."""
    rng = (f" in [{lo}, {hi}]" if lo is not None and hi is not None else f" >= {lo}" if lo is not None
           else f" <= {hi}" if hi is not None else "")

    def parse(s: str) -> int:
        try:
            x = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer{rng}, got {s!r}") from None
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            raise argparse.ArgumentTypeError(f"must be an integer{rng}, got {s!r}")
        return x

    parse.__name__ = "integer"
    return parse


def float_flag(lo: float | None = None, hi: float | None = None, lo_open: bool = False):
    """argparse type: a finite number in [lo, hi] (``(lo, hi]`` when ``lo_open``)."""
    left = "(" if lo_open else "["
    rng = (f"in {left}{lo:g}, {hi:g}]" if lo is not None and hi is not None
           else f"{'>' if lo_open else '>='} {lo:g}" if lo is not None else f"<= {hi:g}" if hi is not None else "")
    what = f"a finite number {rng}".rstrip()

    def parse(s: str) -> float:
        try:
            x = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {s!r}") from None
        bad_lo = lo is not None and (x <= lo if lo_open else x < lo)
        if not math.isfinite(x) or bad_lo or (hi is not None and x > hi):
            raise argparse.ArgumentTypeError(f"must be {what}, got {s!r}")
        return x

    parse.__name__ = "number"
    return parse
