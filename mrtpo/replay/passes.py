"""What a replay runs, known before it runs: the sequences of its plans (:func:`sequences`), the rows of its
vocabulary side (:func:`vocab_rows`), and its progress in forward tokens over both (:func:`replay_progress`).
:mod:`mrtpo.replay.engine` runs them; :mod:`mrtpo.replay.estimate` counts them.

A plan is :class:`mrtpo.replay.engine._Plan` (per response: ``prompt_ids`` {variant: ids}, ``resp_ids``;
``variants``)."""
from __future__ import annotations

from typing import Callable, Sequence

from mrtpo.model.rates import head_share


def sequences(plans: Sequence) -> tuple[list[tuple[int, int, str]], list[list[int]], list[tuple[int, int]]]:
    """Every (group, response, variant) of ``plans``, its sequence (variant prompt + response) and the positions
    whose final hidden states the replay reads: the state before response token t predicts it, S − 1 … S + T − 2."""
    keys = [(g, i, v) for g, plan in enumerate(plans) for i in range(len(plan.resp_ids)) for v in plan.variants]
    seqs = [plans[g].prompt_ids[i][v] + plans[g].resp_ids[i] for g, i, v in keys]
    starts = [len(plans[g].prompt_ids[i][v]) - 1 for g, i, v in keys]
    want = [(s, s + len(plans[g].resp_ids[i])) for s, (g, i, _) in zip(starts, keys)]
    return keys, seqs, want


def vocab_rows(plans: Sequence) -> int:
    """Rows the vocabulary side projects at most: 1 + K′ per response token (P_all and every other variant; a variant
    whose state equals P_all's is skipped)."""
    return sum(len(rid) * len(plan.variants) for plan in plans for rid in plan.resp_ids)


def replay_progress(lm, plans: Sequence, progress: Callable[[float, float], None] | None):
    """(the passes' callback ``(done, total)``, the vocabulary side's ``tick(rows)``), both reporting
    ``progress(done, total)`` in forward tokens over the whole replay: the passes' padded tokens, then each row of
    the vocabulary side as :func:`mrtpo.model.rates.head_share` of a token.  ``done`` grows to ``total``.
    (None, None) without ``progress``: nothing is called."""
    if progress is None:
        return None, None
    share, rows_total = head_share(lm), vocab_rows(plans)
    state = {"fwd": 0, "rows": 0}

    def on_pass(done: int, total: int) -> None:
        state["fwd"] = total
        progress(done, total + share * rows_total)

    def tick(rows: int) -> None:
        state["rows"] += rows
        progress(state["fwd"] + share * state["rows"], state["fwd"] + share * rows_total)

    return on_pass, tick
