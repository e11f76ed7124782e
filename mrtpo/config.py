"""Configuration dataclasses described once: each field's default, help text and allowed values live in its
metadata (:func:`opt`), and everything else is generated from it — the checks (:func:`check_fields`), the flat
JSON form a run stores (:func:`to_flat` / :func:`from_flat`), the CLI's flags (``train``'s from ``TrainConfig``, the
sampling flags from :class:`mrtpo.model.SamplingConfig`: ``mrtpo.cli.common.field_flag``), the app's widgets (the
Train page's form, Explore's sampling settings: ``mrtpo_app.ui.number_field``) and TRL's configs (``MRTPOConfig``, a
subclass of :class:`mrtpo.core.credit.CreditConfig` with the replay's :class:`mrtpo.replay.ReplayConfig` as a part,
and ``MRTPOGRPOConfig``, TRL's ``GRPOConfig`` with those fields: :mod:`mrtpo.integrations.trl_config`).

A configuration may be *composed* of parts (a field whose value is itself such a dataclass, e.g.
``TrainConfig.credit``): the flat form and the flags list the parts' fields by their own names, which are unique
across the parts.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any, Iterator

from mrtpo.errors import MrtpoError


def opt(default, help: str, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
        choices: tuple[str, ...] | None = None, alias: str | None = None):
    """A configuration field: its default, help text and allowed values (``lo``/``hi`` bounds, ``lo_open`` for a
    strict lower bound, ``choices`` for a string). ``alias``: an older name still accepted in the flat form (and as a
    CLI flag)."""
    return field(default=default, metadata={"help": help, "lo": lo, "hi": hi, "lo_open": lo_open, "choices": choices,
                                            "alias": alias})


def part(cls, omit: tuple[str, ...] = ()):
    """A field holding a configuration part (a dataclass of :func:`opt` fields), defaulting to ``cls()``.  ``omit``:
    fields of the part that the whole does not use (they keep the part's defaults and are not in its flat form nor its
    flags; e.g. a training run's sampling seeds come from its schedule, not from ``SamplingConfig.seed``)."""
    return field(default_factory=cls, metadata={"part": True, "omit": tuple(omit)})


def field_kind(f: dataclasses.Field) -> str:
    """A field's value type: "int", "float", "str", "bool", "list" or "dict" (None may be allowed too)."""
    return str(f.type).replace(" | None", "").split("[")[0]


def field_problem(f: dataclasses.Field, v: Any) -> str:
    """Why ``v`` is not a valid value of field ``f`` ('' when it is)."""
    kind, meta = field_kind(f), f.metadata
    if v is None:
        return "" if "None" in str(f.type) else "must be given"
    if kind == "bool":
        return "" if isinstance(v, bool) else f"must be true or false, not {v!r}"
    if kind in ("int", "float"):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind == "int" and not isinstance(v, int)):
            return f"must be {'an integer' if kind == 'int' else 'a number'}, not {v!r}"
        if not math.isfinite(v):
            return f"must be finite, not {v!r}"
        lo, hi = meta.get("lo"), meta.get("hi")
        shown = (lambda x: str(int(x))) if kind == "int" else (lambda x: f"{x:g}")  # an integer's every digit
        if lo is not None and (v <= lo if meta.get("lo_open") else v < lo):
            return f"must be {'>' if meta.get('lo_open') else '>='} {shown(lo)}, not {shown(v)}"
        if hi is not None and v > hi:
            return f"must be <= {shown(hi)}, not {shown(v)}"
        return ""
    if kind == "str":
        if not isinstance(v, str):
            return f"must be a string, not {v!r}"
        choices = meta.get("choices")
        return f"must be one of {', '.join(choices)}, not {v!r}" if choices and v not in choices else ""
    if kind == "list":
        return "" if isinstance(v, list) and all(isinstance(x, str) for x in v) else "must be a list of strings"
    if kind == "dict":
        return "" if isinstance(v, dict) else "must be an object"
    return ""


def check_fields(obj, what: str) -> None:
    """MrtpoError ``bad {what}: {field} {problem}`` for the first :func:`opt` field of ``obj`` with a bad value."""
    for f in dataclasses.fields(obj):
        if f.metadata.get("part"):
            continue
        problem = field_problem(f, getattr(obj, f.name))
        if problem:
            raise MrtpoError(f"bad {what}: {f.name} {problem}")


def leaf_fields(cls) -> Iterator[tuple[dataclasses.Field, str | None]]:
    """Every :func:`opt` field of ``cls`` and of its parts (but those a part omits), in order, with the part's name
    (None: ``cls`` itself)."""
    for f in dataclasses.fields(cls):
        if f.metadata.get("part"):
            sub = f.default_factory  # the part's class
            yield from ((g, f.name) for g, _ in leaf_fields(sub) if g.name not in f.metadata.get("omit", ()))
        else:
            yield f, None


def to_flat(obj) -> dict:
    """``obj`` as one flat dict {field: value} (parts' fields by their own names), JSON-ready."""
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.metadata.get("part"):
            out.update({k: x for k, x in to_flat(v).items() if k not in f.metadata.get("omit", ())})
        else:
            out[f.name] = dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
    return out


def from_flat(cls, d: dict, what: str):
    """``cls`` built from a flat dict (:func:`to_flat`'s form; older field names given by ``alias`` accepted).

    MrtpoError for an unknown key, a name given twice (as itself and as its alias), or a bad value."""
    if not isinstance(d, dict):
        raise MrtpoError(f"bad {what}: expected an object of fields, got {type(d).__name__}")
    names = {f.name: (f, p) for f, p in leaf_fields(cls)}
    aliases = {f.metadata["alias"]: f.name for f, _ in names.values() if f.metadata.get("alias")}
    values: dict[str, Any] = {}
    for k, v in d.items():
        name = aliases.get(k, k)
        if name not in names:
            continue
        if name in values:
            raise MrtpoError(f"bad {what}: {name} is given twice (also as {k})")
        values[name] = v
    unknown = sorted(k for k in d if aliases.get(k, k) not in names)
    if unknown:
        raise MrtpoError(f"unknown {what} field(s): {', '.join(unknown)}")
    parts: dict[str, dict] = {}
    top = {}
    for name, v in values.items():
        f, p = names[name]
        (parts.setdefault(p, {}) if p else top)[name] = v
    kinds = {f.name: f.default_factory for f in dataclasses.fields(cls) if f.metadata.get("part")}
    return cls(**top, **{p: kinds[p](**vals) for p, vals in parts.items()})
