"""A logged step as the run viewer shows it (rows of :mod:`mrtpo.creditlog`, from mrtpo's credit log or another
trainer's log; no model): the step's table of responses × rewards, a group's :class:`~mrtpo.display.TokenView` made
from what the log holds (:func:`log_view`: the per-reward token advantages and ρ as logged, drawn by
:func:`mrtpo.display.render.response_html` beside GDPO's uniform rows, as Explore draws a sampled group), the
per-token series of a log without per-reward credit as heatmap rows (:func:`series_html`), and a row's reference
or ground truth (:func:`reference`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mrtpo.core.advantages import parse_method
from mrtpo.core.spans import cell_values, owner_spans
from mrtpo.creditlog import CreditRow, CreditStep
from mrtpo.display.render import token_cells, token_row
from mrtpo.display.token_view import TokenView
from mrtpo.errors import MrtpoError

# the names under which logs keep a task's answer (TRL / verl columns, OpenRLHF's ref_response), in this order
REFERENCE_KEYS = ("ground_truth", "reference", "answer", "solution", "target", "label", "ref_response")


def has_credit(rows: Sequence[CreditRow]) -> bool:
    """Whether the rows hold per-reward token credit (mrtpo's credit log) and token texts to draw it on."""
    return bool(rows) and all(r.reward_token_advantages is not None and r.token_advantages is not None
                              and r.tokens is not None for r in rows)


def row_tokens(row: CreditRow) -> list[dict] | None:
    """The row's tokens as the views draw them, ``{"text", "start", "end"}`` each: its ``offsets`` in the form of
    :mod:`mrtpo.core.spans` (:func:`~mrtpo.core.spans.owner_spans`: a log whose offsets give every byte token of a
    character that character, or an older one, draws each character once) and their texts in ``completion``; None
    for a row without offsets."""
    if row.offsets is None:
        return None
    text = row.completion or ""
    return [{"text": text[a:b], "start": a, "end": b} for a, b in owner_spans(row.offsets, len(text))]


def reference(row: CreditRow) -> tuple[str, str] | None:
    """(column, text) of the row's reference answer or ground truth, when its log has one (:data:`REFERENCE_KEYS`)."""
    for k in REFERENCE_KEYS:
        v = row.extra.get(k)
        if isinstance(v, str) and v.strip():
            return k, v
    return None


def reward_names(rows: Sequence[CreditRow]) -> list[str]:
    """The rewards of the rows, in order of appearance."""
    return list(dict.fromkeys(k for r in rows for k in r.rewards))


def _num(v) -> float:
    return float("nan") if v is None else float(v)


def _shown(v) -> float:
    """A table's number: 4 decimals (a logged 1e-8 is float noise: 0.0)."""
    return round(_num(v), 4) + 0.0


def _short(text: str | None, n: int) -> str:
    t = " ".join((text or "").split())
    return t if len(t) <= n else t[: n - 1] + "…"


def step_table(step: CreditStep, width: int = 80) -> list[dict]:
    """One dict per logged response of ``step`` (groups in order): ``group``, ``#`` (its index in the group), the
    response's advantage, the response and its reference (cut to ``width`` characters), its tokens, then each
    reward's value and (where the log has it) its advantage Â (NaN where a reward does not apply); numbers to 4
    decimals."""
    names = reward_names(step.rows)
    out = []
    for r in step.rows:
        d = {"group": r.group, "#": r.index, "advantage": _shown(r.advantage), "response": _short(r.completion, width)}
        ref = reference(r)
        if ref is not None:
            d["reference"] = _short(ref[1], width)
        d["tokens"] = r.n_tokens
        for k in names:
            d[k] = _shown(r.rewards.get(k))
            if r.reward_advantages is not None:
                d[f"Â {k}"] = _shown(r.reward_advantages.get(k))
        out.append(d)
    return out


@dataclass
class LogGroup:
    """What :func:`mrtpo.display.render.response_html` reads of a group besides the view: each response's reasons
    ({reward: the checker's reason}) and verifier information (not logged: None)."""

    reasons: list[dict[str, str]]
    verifier_info: list[dict] | None = None


def log_view(rows: Sequence[CreditRow], method: str | None = None, measure: str = "js") -> tuple[TokenView, LogGroup]:
    """The token view of one logged group (its rows, :func:`has_credit`), from the logged numbers only:

    rewards r_ik (NaN where a reward does not apply), ``per_reward`` Â_ik / scale (the estimator's uniform share,
    the token mean of A'_ik), ``final`` the response's advantage, ``token_adv_per_reward`` A'_ikt and
    ``token_adv`` A_it as logged, ``relevance`` ρ_ikt (1 on every token where the log says the credit was uniform),
    β = the step's β_s.  ``skipped``: rewards not replayed and constant in the group (advantage 0).  ``method``:
    the log's (its meta), else ``mrtpo`` when some reward has relevance, else ``gdpo``."""
    if not has_credit(rows):
        raise MrtpoError("this group's log has no per-reward token advantages (an mrtpo credit log has them)")
    names = reward_names(rows)
    replayed = {k for r in rows for k, v in (r.relevance or {}).items() if v is not None}
    if method is None:
        method = "mrtpo" if replayed else "gdpo"
    try:
        parsed = parse_method(method)
    except MrtpoError:
        method, parsed = ("mrtpo" if replayed else "gdpo"), None
    R = np.array([[_num(r.rewards.get(k)) for k in names] for r in rows], dtype=float).reshape(len(rows), len(names))
    per = np.array([[_num((r.reward_advantages or {}).get(k)) / (r.scale or 1.0) for k in names] for r in rows],
                   dtype=float).reshape(len(rows), len(names))
    per = np.nan_to_num(per)
    toks, rel, tok_k, tok = [], [], [], []
    for r in rows:
        T = r.n_tokens or 0
        toks.append(row_tokens(r) or [{"text": t} for t in r.tokens])
        rel.append({k: np.ones(T) if (r.relevance or {}).get(k) is None else np.array(r.relevance[k], dtype=float)
                    for k in names})
        tok_k.append({k: np.zeros(T) if r.reward_token_advantages.get(k) is None
                      else np.array(r.reward_token_advantages[k], dtype=float) for k in names})
        tok.append(np.array(r.token_advantages, dtype=float))
    skipped = [k for j, k in enumerate(names) if k not in replayed and np.nanmax(R[:, j], initial=-np.inf)
               == np.nanmin(R[:, j], initial=np.inf)]
    view = TokenView(
        method=method, beta=float(rows[0].beta or 0.0), reward_names=names, rewards=R, per_reward=per,
        final=np.array([_num(r.advantage) for r in rows]), tokens=toks, texts=[r.completion or "" for r in rows],
        relevance=rel, js=[{k: np.full(len(t), np.nan) for k in names} for t in toks], token_adv_per_reward=tok_k,
        token_adv=tok, diagnostics={"center": rows[0].center, "scale": rows[0].scale}, skipped=skipped,
        measure=measure, parsed=parsed)
    return view, LogGroup([dict(r.reasons or {}) for r in rows])


# the per-token series a log may hold beside the credit: (attribute or extra key, label, kind, how a character's
# cell combines its tokens (mrtpo.core.spans): advantages, rewards, entropies and KLs add up along the tokens, the
# probability of a character is the product of its tokens', a critic's value is averaged)
SERIES = (("token_advantages", "advantage A_t", "diverging", "sum"), ("p", "probability p", "sequential", "prod"),
          ("entropy", "entropy", "sequential", "sum"), ("kl", "KL to the reference", "diverging", "sum"),
          ("token_rewards", "token reward", "diverging", "sum"), ("values", "value (critic)", "diverging", "mean"),
          ("mismatch_kl", "KL trainer vs sampler", "diverging", "sum"))


def token_series(row: CreditRow) -> list[tuple[str, str, list[float]]]:
    """(label, kind, values) of every per-token series the row has (:data:`SERIES`): ``p`` = e^logprob; a missing
    value is NaN (drawn transparent)."""
    out = []
    for key, label, kind, _ in SERIES:
        if key == "p":
            vals = None if row.logprob is None else [None if v is None else math.exp(v) for v in row.logprob]
        else:
            vals = getattr(row, key, None) if key in ("token_advantages", "entropy", "kl") else row.extra.get(key)
        if isinstance(vals, list) and vals and len(vals) == (row.n_tokens or 0):
            out.append((label, kind, [_num(v) for v in vals]))
    return out


def series_html(row: CreditRow) -> str:
    """Heatmap rows of one response's logged per-token series (:func:`token_series`), each on its own scale (the
    largest |value| of a cell: in its label), for a log without per-reward credit; a character over several tokens
    is one cell (:data:`SERIES` says how each series combines them); a log of token ids without their texts
    (prime-rl's export) shows the ids as ``⟨id⟩``; '' when the row has no tokens."""
    toks = row_tokens(row) or [{"text": t} for t in row.tokens or [f"⟨{t}⟩" for t in row.token_ids or []]]
    if not toks:
        return ""
    series = token_series(row)
    how = {label: agg for _, label, _, agg in SERIES}
    tips = [f"{t['text']!r} | " + " | ".join(f"{lab} {v[n]:.4g}" for lab, _, v in series)
            for n, t in enumerate(toks)]
    groups = token_cells(toks)
    parts = []
    for label, kind, vals in series:
        vmax = float(np.nanmax(np.abs(cell_values(vals, groups, how[label])), initial=0.0)) or 1.0
        lim = f"±{vmax:.3g}" if kind == "diverging" else f"0 … {vmax:.3g}"
        parts.append(token_row(f"{label} ({lim})", toks, vals, kind, vmax, tips, agg=how[label]))
    head = ('<div class="legend">each row on its own scale (its limit in the label): blue / red = positive / '
            'negative, orange = larger; hover a token for every value</div>')
    return f'<div class="mrtpo">{head}{"".join(parts)}</div>' if parts else ""


def first_informative(step: CreditStep) -> int:
    """The index of the step's first response with a nonzero advantage (a group where some reward varies: its
    heatmaps have colors), else 0."""
    return next((i for i, r in enumerate(step.rows) if r.advantage), 0)


def group_of(step: CreditStep, i: int) -> tuple[list[CreditRow], int]:
    """The rows of the group of ``step``'s response ``i`` (its index in ``step.rows``) and that response's index in
    them."""
    r = step.rows[i]
    rows = [x for x in step.rows if x.group == r.group]
    return rows, next(j for j, x in enumerate(rows) if x is r)


def title(r: CreditRow) -> str:
    """A response's label: group, index, rewards."""
    vals = ", ".join(f"{k} {v:.3g}" if v is not None else f"{k} –" for k, v in r.rewards.items())
    return f"group {r.group} · #{r.index} · {vals}" if vals else f"group {r.group} · #{r.index}"
