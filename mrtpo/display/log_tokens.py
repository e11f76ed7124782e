"""One logged response's tokens as a table (what a run viewer shows under a response): per token its text, id,
probability p = e^logprob, log-prob, entropy, reference log-prob, KL, the combined advantage A_t, each reward's
token advantage A'_k,t and relevance ρ_k,t, and any per-token series another trainer logged (``row.extra``: values,
token_rewards, trainer_logprobs, ...).  A value the log does not have is None.  A character over several tokens (the
bytes of a multi-byte character, :mod:`mrtpo.core.spans`) shows on each of its tokens, with the token's place in it
(``part``: "2/4"); every number stays the token's own."""
from __future__ import annotations

import math

from mrtpo.core.spans import cells, owner_spans
from mrtpo.creditlog import CreditRow


def _at(series, t: int):
    return None if series is None or t >= len(series) else series[t]


def _characters(row: CreditRow, T: int) -> tuple[list, list]:
    """Per token: the text of its cell (the character(s) it is part of) and its part "k/n" (None alone)."""
    if row.offsets is None or len(row.offsets) != T:
        return list(row.tokens or [None] * T), [None] * T
    text = row.completion or ""
    spans = owner_spans(row.offsets, len(text))
    chars, part = [None] * T, [None] * T
    for g in cells(spans):
        for k, t in enumerate(g, start=1):
            chars[t] = "".join(text[a:b] for a, b in (spans[u] for u in g))
            part[t] = f"{k}/{len(g)}" if len(g) > 1 else None
    return chars, part


def token_table(row: CreditRow) -> list[dict]:
    """One dict per token t (columns in the module docstring: ``token``, ``part``, ``id``, ``p``, ``logprob``,
    ``entropy``, ``ref_logprob``, ``kl``, ``A``, ``A:<reward>``, ``ρ:<reward>``, then ``row.extra``'s per-token
    lists by name)."""
    T = row.n_tokens or 0
    chars, part = _characters(row, T)
    per = row.reward_token_advantages or {}
    rel = row.relevance or {}
    extra = {k: v for k, v in row.extra.items() if isinstance(v, list) and len(v) == T and k != "prompt_ids"}
    out = []
    for t in range(T):
        lp = _at(row.logprob, t)
        d = {"t": t, "token": _at(chars, t), "part": part[t], "id": _at(row.token_ids, t),
             "p": None if lp is None else math.exp(lp), "logprob": lp, "entropy": _at(row.entropy, t),
             "ref_logprob": _at(row.ref_logprob, t), "kl": _at(row.kl, t), "A": _at(row.token_advantages, t)}
        d.update({f"A:{k}": _at(v, t) for k, v in per.items()})
        d.update({f"ρ:{k}": _at(v, t) for k, v in rel.items()})
        d.update({k: v[t] for k, v in extra.items()})
        out.append(d)
    return out
