"""An experiment's arms: ``METHOD[:FIELD=VALUE,...]``, parsed and checked (:func:`parse_arm`), named
(:func:`arm_label`); which fields an arm may set and which are the experiment's.  An arm may train with a choice file
written by ``mrtpo tune``: ``mrtpo:tuned=choice.json`` (labelled ``mrtpo.tuned-choice``)."""
from __future__ import annotations

import re
from pathlib import PurePath

from mrtpo.config import field_kind, leaf_fields
from mrtpo.core import advantages as A
from mrtpo.errors import MrtpoError
from mrtpo.train import TrainConfig

PER_RUN_FIELDS = ("method", "seed", "schedule_seed")  # set per run; every other TrainConfig field is shared
#: the fields the runs are paired on and the summary reports: the experiment's, never an arm's
FIXED_FIELDS = ("model", "device", "task", "examples", "example_ids", "sql_compare", "tools_compare", "items",
                "group_size",
                "prompts_per_step")
LOG_FIELDS = ("credit_log", "credit_log_groups")  # an experiment's runs write no credit log


def parse_arm(spec: str) -> tuple[str, dict]:
    """An arm ``METHOD[:FIELD=VALUE,...]`` (e.g. ``mrtpo:info=quoted,measure=js-support``) as (method, the fields it
    sets on top of the experiment's shared config), values typed by the field (int, float, bool, text).  MrtpoError
    naming the problem for a bad one; the method and the fields are checked as TrainConfig checks them.  An arm may
    not set what the runs are paired on (:data:`FIXED_FIELDS`: model, task, examples, group shapes ...), nor the
    credit log (:data:`LOG_FIELDS`)."""
    if not isinstance(spec, str) or not spec.strip():
        raise MrtpoError(f"an arm must be METHOD or METHOD:FIELD=VALUE,..., not {spec!r}")
    method, _, rest = spec.strip().partition(":")
    method = A.parse_method(method).name  # a clear message for an unknown method; "GDPO" is gdpo
    kinds = {f.name: field_kind(f) for f, _ in leaf_fields(TrainConfig)}
    overrides: dict = {}
    for part in [x for x in rest.split(",") if x.strip()] if rest else []:
        key, eq, value = (t.strip() for t in part.partition("="))
        key = {"relevance_measure": "measure"}.get(key, key)
        if not eq or not value:
            raise MrtpoError(f"arm {spec!r}: {part.strip()!r} is not FIELD=VALUE")
        if key in PER_RUN_FIELDS:
            raise MrtpoError(f"arm {spec!r}: {key} is set per run (the method is the part before ':')")
        if key in FIXED_FIELDS:
            raise MrtpoError(f"arm {spec!r}: {key} is the experiment's, the same for every arm (the runs are paired "
                             f"on {', '.join(FIXED_FIELDS)}); set it for the whole experiment with "
                             f"--{key.replace('_', '-')}")
        if key in LOG_FIELDS:
            raise MrtpoError(f"arm {spec!r}: {key} is not an arm setting: an experiment's runs write no credit log "
                             f"(log one run with `mrtpo train --credit-log DIR`)")
        if key not in kinds:
            raise MrtpoError(f"arm {spec!r}: unknown training config field {key!r}")
        overrides[key] = _typed(value, kinds[key], f"arm {spec!r}: {key}")
    return method, overrides


def _typed(value: str, kind: str, where: str):
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        raise MrtpoError(f"{where} must be {'an integer' if kind == 'int' else 'a number'}, not {value!r}") from None
    if kind == "bool":
        if value.lower() not in ("true", "false"):
            raise MrtpoError(f"{where} must be true or false, not {value!r}")
        return value.lower() == "true"
    if kind in ("list", "dict"):
        raise MrtpoError(f"{where} cannot be set per arm")
    return value


def normalize_arm(spec: str) -> str:
    """``spec`` with its method's registered name (``GDPO:beta=0.3`` → ``gdpo:beta=0.3``); checked as
    :func:`parse_arm` checks it."""
    parse_arm(spec)
    method, colon, rest = spec.strip().partition(":")
    return A.parse_method(method).name + colon + rest


def arm_label(spec: str) -> str:
    """The arm's name in run names and tables: the method, then each field it sets (``mrtpo.info-quoted.measure-
    js-support``); a plain method is its own label."""
    method, overrides = parse_arm(spec)
    return method + "".join(f".{k}-{_shown(k, v)}" for k, v in overrides.items())


def _shown(key: str, value) -> str:
    """An arm setting's value in its label: a choice file (``tuned``) by its name without folder or extension, in
    the characters a run name allows."""
    if key != "tuned":
        return str(value)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", PurePath(str(value)).stem) or "choice"
