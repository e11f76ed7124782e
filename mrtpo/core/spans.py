"""Which characters each token shows: one rule for every surface (heatmaps, JSON, the credit log, the run viewer).

**The rule.** Token t's span [start, end) holds the characters that are complete once t is read and were not
before; spans are contiguous (each starts where the previous one ends) and the last one ends at the end of the
text.  A token after which the text ends inside a character (a byte of a multi-byte UTF-8 character, with the
byte-level BPE of SmolLM2 / GPT-2 / Qwen / Llama 3, or a byte-fallback token of SentencePiece) has an empty span:
its character belongs to the token that completes it.  So every character has exactly one owner.

**Cells.** What a view draws: a run of empty-span tokens and the non-empty token after them (the one that
completes their character) are one cell (:func:`cells`); its text is the owner's characters, drawn once.  Empty
tokens after the last non-empty one (an EOS, a special token the decoder skips) are cells of their own (empty).

**A cell's value** (:func:`cell_values`): the tokens' values combined by what the number is —
``sum`` for advantages (A_ikt, A_it, the uniform share, what MRTPO moved: the sum keeps Σ_t A_ikt = T_i · Â_ik, which
the reallocation preserves, so a cell shows the credit its character received); ``mean`` for relevance ρ and the
JS distance d (ρ keeps "1 = uniform": the cell's advantage is n_c · Â_ik · (1 − β_s + β_s · ρ̄_c) for its n_c
tokens, so the mean ρ̄_c is the factor by which the character's credit differs from uniform, and ρ̄_c = T · d̄_c /
Σ_t d_t); ``prod`` for a probability (p of the character); ``max`` for a marker.  Each token's own number stays
available (the tooltip lists them; the JSON keeps per-token arrays).
"""
from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Sequence

import numpy as np

AGGREGATES = ("sum", "mean", "max", "prod")


def owner_spans(spans: Sequence[Sequence[int]], n_chars: int) -> list[tuple[int, int]]:
    """Any per-token character spans (a tokenizer's offset mapping, where every byte token of a character gets that
    character's span; a credit log's ``offsets``, old or new) in the form of the rule above, into a text of
    ``n_chars`` characters.

    Token t (not the last) owns characters only if the next token starts at or after where t ends (t does not end
    inside a character the next one also touches) and t ends after the previous owner's end; its span is then
    [end of the previous span, e_t); else it is empty.  The last token ends at ``n_chars`` (or where the previous
    one ends, if later).  Spans already in this form are returned unchanged (their ends clamped to the text)."""
    out: list[tuple[int, int]] = []
    prev = 0
    T = len(spans)
    for t, (_, e) in enumerate(spans):
        if t == T - 1:
            end = max(n_chars, prev)
        else:
            e = min(int(e), n_chars)
            end = e if e > prev and int(spans[t + 1][0]) >= e else prev
        out.append((prev, end))
        prev = end
    return out


def cells(spans: Sequence[Sequence[int]]) -> list[list[int]]:
    """The cells of spans in the rule's form: lists of token indices, in order, covering every token once.  A cell
    ends at each token with a non-empty span; empty tokens after the last such token are one-token cells."""
    out: list[list[int]] = []
    run: list[int] = []
    for t, (s, e) in enumerate(spans):
        run.append(t)
        if e > s:
            out.append(run)
            run = []
    out.extend([t] for t in run)
    return out


def text_cells(texts: Sequence[str]) -> list[list[int]]:
    """:func:`cells` of tokens known by their texts only (each token's characters under the rule: '' for a byte of
    an unfinished character), e.g. a stored step's token texts."""
    ends = np.cumsum([len(t) for t in texts]).tolist()
    return cells(list(zip([0] + ends[:-1], ends)))


def _runs(groups: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray] | None:
    """(starts, lengths) when ``groups`` are consecutive runs of increasing token indices, each starting where the
    previous one ends (cells are); else None."""
    if not groups or not all(groups):
        return None
    n = len(groups)
    starts = np.fromiter(map(itemgetter(0), groups), dtype=np.int64, count=n)
    lengths = np.fromiter(map(len, groups), dtype=np.int64, count=n)
    if np.any(starts[1:] != starts[:-1] + lengths[:-1]):
        return None
    flat = np.fromiter(chain.from_iterable(groups), dtype=np.int64, count=int(lengths.sum()))
    return (starts, lengths) if np.array_equal(flat, np.arange(starts[0], starts[0] + len(flat))) else None


def cell_values(values: Sequence[float], groups: Sequence[Sequence[int]], how: str = "sum") -> np.ndarray:
    """(C,) one value per cell: the values (T,) of its tokens combined by ``how`` (:data:`AGGREGATES`; see the
    module docstring for which number takes which).  A NaN among a cell's tokens makes the cell NaN."""
    if how not in AGGREGATES:
        raise ValueError(f"how must be one of {', '.join(AGGREGATES)}, got {how!r}")
    v = np.asarray(values, dtype=float)
    runs = _runs(groups)
    if runs is not None:  # consecutive runs of tokens (what cells are): one pass
        starts, lengths = runs
        ufunc = {"sum": np.add, "mean": np.add, "max": np.maximum, "prod": np.multiply}[how]
        out = ufunc.reduceat(v[starts[0]:starts[-1] + lengths[-1]], starts - starts[0]).astype(float)
        return out / lengths if how == "mean" else out
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "prod": np.prod}[how]
    return np.array([fn(v[list(g)]) for g in groups], dtype=float)
