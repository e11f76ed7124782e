"""The credit log's format, version 1: what a row and ``meta.json`` hold, and the checks that turn a JSON row into a
:class:`CreditRow` (the writer runs them too, so what it writes is what the reader reads).

A log is a folder::

    meta.json            {"format": "mrtpo-credit-log", "version": 1, "source", "model", "method", "measure", "info",
                          "beta", "warmup", "group_size", "rewards": [K reward names], "created": unix seconds,
                          "run": the id of the run that owns the log, "owner": {what tells a person which run:
                          mrtpo's "store" and "run" name, TRL's "output_dir"; "host", "pid" of its first writer}}
    step-000001.jsonl    one JSON object per logged response of step 1 (groups in order, responses in order)
    step-000002.jsonl    ...

Row fields (T = the response's tokens; "per token" lists have T entries, null where there is no value):

    step, time, group, index        the update the rows train (from 1), unix seconds, group in the step, response in
                                    the group
    prompt, completion              text (the completion as the tokenizer decodes ``token_ids``)
    token_ids, offsets              T ids; T [start, end) character spans of the tokens in ``completion``
    rewards, reasons                {reward: value or null}; {reward: text} or null (the checkers' reasons)
    advantage                       the response-level advantage final_i (the token mean of ``token_advantages``)
    reward_advantages               {reward: Â_ik}, the estimator's per-reward advantage (GDPO: each reward's z-score)
    center, scale                   the estimator's batch statistics: final_i = (Σ_k Â_ik − center) / scale
    token_advantages                per token A_it, what the update used
    reward_token_advantages         {reward: per token A'_ikt}; Σ_k A'_ikt − center / scale = A_it, and the token mean
                                    of A'_ik· is Â_ik / scale (mrtpo.core.credit)
    relevance                       {reward: per token ρ_ikt, or null where the credit was uniform (not replayed)}
    beta                            β_s, the reallocation strength of this update (0: response-level credit)
    logprob, entropy                per token log π(y_t | x, y<t) of the sampled token and the entropy of π(· | x, y<t)
                                    (the sampling temperature applied), or null when not computed
    ref_logprob, kl                 per token log π_ref(y_t | ...) and the KL estimate k3 = e^r − r − 1,
                                    r = ref_logprob − logprob, or null without a reference
    run                             the id of the run that wrote the row: meta.json's ``run`` (a reader refuses a
                                    step whose rows name another run: :mod:`.owner`)

``run`` and ``owner`` (meta) and ``run`` (rows) were added within version 1: logs written before them have neither,
and read as before; readers that predate them ignore them.

Fields other tools' logs lack are None in a :class:`CreditRow` (``mrtpo.integrations.tool_logs``), and what they
have beyond these goes to ``extra`` (per token lists by name).  A newer version adds fields; a reader of version 1
refuses files of a higher version with a message saying so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mrtpo import validate as V
from mrtpo.errors import MrtpoError
from mrtpo.wording import plural

FORMAT = "mrtpo-credit-log"
VERSION = 1
META_FILE = "meta.json"


class CreditLogError(MrtpoError):
    """A credit log (or another tool's log) that cannot be read: ``path``, ``row`` (1-based line; 0 = the file as a
    whole) and ``field`` ('' = none) say where: ``FILE: row 3: field 'rewards': problem``."""

    def __init__(self, path: str | Path, row: int, field: str, problem: str):
        self.path, self.row, self.field, self.problem = str(path), row, field, problem
        where = (f"row {row}: " if row else "") + (f"field '{field}': " if field else "")
        super().__init__(f"{path}: {where}{problem}")


@dataclass
class CreditRow:
    """One logged response, whichever tool wrote it (None: the log does not have it)."""

    step: int
    group: int
    index: int
    prompt: str | None
    completion: str | None
    rewards: dict[str, float | None]
    time: float | None = None
    token_ids: list[int] | None = None
    offsets: list[tuple[int, int]] | None = None
    tokens: list[str] | None = None  # each token's text (completion[start:end], or the tool's token strings)
    reasons: dict[str, str] | None = None
    advantage: float | None = None
    reward_advantages: dict[str, float | None] | None = None
    center: float | None = None
    scale: float | None = None
    token_advantages: list[float | None] | None = None
    reward_token_advantages: dict[str, list[float | None]] | None = None
    relevance: dict[str, list[float | None] | None] | None = None
    beta: float | None = None
    logprob: list[float | None] | None = None
    entropy: list[float | None] | None = None
    ref_logprob: list[float | None] | None = None
    kl: list[float | None] | None = None
    run: str | None = None  # the run that wrote it (a credit log's ``run``; None: another tool's, or an older log)
    extra: dict[str, Any] = field(default_factory=dict)  # what another tool logs beyond these (per token lists)
    source: str = ""  # the file and row it was read from
    row: int = 0

    @property
    def n_tokens(self) -> int | None:
        """T, when the row has tokens."""
        for v in (self.token_ids, self.tokens, self.logprob, self.token_advantages):
            if v is not None:
                return len(v)
        return None


# ---------------------------------------------------------------------------------------------- field checks
def _int(v, lo: int = 0) -> str:
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= lo
    return "" if ok else f"must be an integer >= {lo}, got {_shown(v)}"


def _num(v) -> str:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return "" if ok else f"must be a number, got {_shown(v)}"


def _num_or_null(v) -> str:
    return "" if v is None or not _num(v) else f"must be a number or null, got {_shown(v)}"


def _reward(v) -> str:
    """A reward by the rule of every reader of rewards (:func:`mrtpo.validate.reward`): a number or true / false
    (1 / 0); null: not scored."""
    try:
        V.reward(v, "")
    except V.BadValue as e:
        return e.problem
    return ""


def _text(v) -> str:
    return "" if isinstance(v, str) else f"must be text, got {_shown(v)}"


def _series(v) -> str:
    """A per-token list of numbers (null allowed in it)."""
    if not isinstance(v, list):
        return f"must be a list of numbers, got {_shown(v)}"
    bad = next((i for i, x in enumerate(v) if _num_or_null(x)), None)
    return "" if bad is None else f"item {bad + 1} must be a number or null, got {_shown(v[bad])}"


def _ids(v) -> str:
    if not isinstance(v, list):
        return f"must be a list of token ids, got {_shown(v)}"
    bad = next((i for i, x in enumerate(v) if _int(x)), None)
    return "" if bad is None else f"item {bad + 1} must be a token id (an integer >= 0), got {_shown(v[bad])}"


def _offsets(v) -> str:
    if not isinstance(v, list):
        return f"must be a list of [start, end] pairs, got {_shown(v)}"
    for i, x in enumerate(v):
        if not (isinstance(x, list) and len(x) == 2 and not _int(x[0]) and not _int(x[1]) and x[0] <= x[1]):
            return f"item {i + 1} must be a [start, end] pair with 0 <= start <= end, got {_shown(x)}"
    return ""


def _dict_of(check: Callable[[Any], str], what: str) -> Callable[[Any], str]:
    def run(v) -> str:
        if not isinstance(v, dict):
            return f"must be an object {{reward: {what}}}, got {_shown(v)}"
        for k, x in v.items():
            p = check(x)
            if p:
                return f"reward '{k}': {p}"
        return ""
    return run


def _or_null(check: Callable[[Any], str]) -> Callable[[Any], str]:
    return lambda v: "" if v is None else check(v)


# name: (check, per-token: how the value's length must equal T (None: not per token; "dict": each entry))
ROW_FIELDS: dict[str, tuple[Callable[[Any], str], str | None]] = {
    "step": (lambda v: _int(v, 0), None),
    "time": (_num, None),
    "group": (_int, None),
    "index": (_int, None),
    "prompt": (_text, None),
    "completion": (_text, None),
    "token_ids": (_ids, "list"),
    "offsets": (_or_null(_offsets), "list"),
    "rewards": (_dict_of(_reward, V.REWARD_VALUE), None),
    "reasons": (_or_null(_dict_of(_text, "text")), None),
    "advantage": (_num, None),
    "reward_advantages": (_dict_of(_num_or_null, "number"), None),
    "center": (_num, None),
    "scale": (_num, None),
    "token_advantages": (_series, "list"),
    "reward_token_advantages": (_dict_of(_series, "list of numbers"), "dict"),
    "relevance": (_dict_of(_or_null(_series), "list of numbers or null"), "dict"),
    "beta": (_num, None),
    "logprob": (_or_null(_series), "list"),
    "entropy": (_or_null(_series), "list"),
    "ref_logprob": (_or_null(_series), "list"),
    "kl": (_or_null(_series), "list"),
}


def _shown(v) -> str:
    if isinstance(v, (dict, list)):
        return "an object" if isinstance(v, dict) else "a list"
    text = repr(v)
    return text if len(text) <= 40 else text[:40] + "…"


def check_row(obj: Any, path: str | Path, row: int) -> CreditRow:
    """A JSON row of a version-1 step file as a :class:`CreditRow`; :class:`CreditLogError` naming the file, the
    row and the field for a missing field, a value of the wrong kind, or a per-token list whose length is not T."""
    if not isinstance(obj, dict):
        raise CreditLogError(path, row, "", "each row must be a JSON object")
    for name, (check, _) in ROW_FIELDS.items():
        if name not in obj:
            raise CreditLogError(path, row, name, "missing")
        problem = check(obj[name])
        if problem:
            raise CreditLogError(path, row, name, problem)
    T = len(obj["token_ids"])
    for name, (_, per_token) in ROW_FIELDS.items():
        v = obj[name]
        items = [(name, v)] if per_token == "list" else [(f"{name}.{k}", x) for k, x in v.items()] \
            if per_token == "dict" else []
        for where, x in items:
            if x is not None and len(x) != T:
                raise CreditLogError(path, row, name,
                                     f"{where} has {plural(len(x), 'value')} for {plural(T, 'token')} (token_ids)")
    text = obj["completion"]
    offsets = None if obj["offsets"] is None else [(int(a), int(b)) for a, b in obj["offsets"]]
    if offsets and offsets[-1][1] > len(text):
        raise CreditLogError(path, row, "offsets", f"a span ends at {offsets[-1][1]}, past the completion's "
                                                   f"{len(text)} characters")
    return CreditRow(
        step=obj["step"], group=obj["group"], index=obj["index"], prompt=obj["prompt"], completion=text,
        rewards={k: None if v is None else float(v) for k, v in obj["rewards"].items()}, time=float(obj["time"]),
        token_ids=list(obj["token_ids"]), offsets=offsets,
        tokens=None if offsets is None else [text[a:b] for a, b in offsets], reasons=obj["reasons"],
        advantage=float(obj["advantage"]), reward_advantages=dict(obj["reward_advantages"]),
        center=float(obj["center"]), scale=float(obj["scale"]), token_advantages=obj["token_advantages"],
        reward_token_advantages=obj["reward_token_advantages"], relevance=obj["relevance"], beta=float(obj["beta"]),
        logprob=obj["logprob"], entropy=obj["entropy"], ref_logprob=obj["ref_logprob"], kl=obj["kl"],
        run=obj.get("run"), source=str(path), row=row)


META_FIELDS: dict[str, Callable[[Any], str]] = {
    "format": lambda v: "" if v == FORMAT else f"must be '{FORMAT}', got {_shown(v)}: not a credit log",
    "version": lambda v: _int(v, 1),
    "rewards": lambda v: "" if isinstance(v, list) and all(isinstance(x, str) for x in v)
    else "must be a list of reward names",
}
OWNER_FIELDS: dict[str, Callable[[Any], str]] = {  # optional (logs written before owners were recorded lack them)
    "run": lambda v: "" if isinstance(v, str) and v else f"must be the run's id (text), got {_shown(v)}",
    "owner": lambda v: "" if isinstance(v, dict) else f"must be an object, got {_shown(v)}",
}


def check_meta(obj: Any, path: str | Path) -> dict:
    """``meta.json``'s object, checked: the format's name, a version this reader knows (<= :data:`VERSION`), the
    reward names, the owner's fields where present (``run``, ``owner``); other fields (model, method, measure,
    info, ...) are kept as they are."""
    if not isinstance(obj, dict):
        raise CreditLogError(path, 0, "", "must be a JSON object")
    for name, check in META_FIELDS.items():
        if name not in obj:
            raise CreditLogError(path, 0, name, "missing")
        problem = check(obj[name])
        if problem:
            raise CreditLogError(path, 0, name, problem)
    if obj["version"] > VERSION:
        raise CreditLogError(path, 0, "version", f"version {obj['version']} was written by a newer mrtpo; this one "
                                                 f"reads version {VERSION} (upgrade mrtpo)")
    for name, check in OWNER_FIELDS.items():
        problem = check(obj[name]) if name in obj else ""
        if problem:
            raise CreditLogError(path, 0, name, problem)
    return obj
