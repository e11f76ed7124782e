"""Long responses, overview first ("overview first, zoom and filter, then details on demand"): what a response of
more than :data:`LONG_TOKENS` tokens shows before it is drawn in full.

Per response × reward (:func:`overview_html`):

- GDPO's uniform share Â_ik / scale, one number for the whole response (a colored chip), not a row of identical
  cells;
- a **strip** along the response (:func:`strip_bins`, :func:`peaks`): at most :data:`STRIP_BINS` marks, each the
  cell of largest |value| in its stretch of the response, colored on the full view's scale, so a single hot token
  stays visible.  The value is what the method moved, A'_ikt − Â_ik / scale (diverging), or ρ (sequential) where
  the method moves nothing (a response-level method, β = 0, Â_ik = 0);
- the **hottest spans** (:func:`hot_spans`): the top :data:`HOT_SPANS` stretches of at most :data:`HOT_WIDTH`
  cells where the reward's credit went, by Σ sign(Â_ik) · (A'_ikt − Â_ik) over their tokens (∝ Σ (ρ_ikt − 1):
  the tokens that got more of the reward's advantage than the uniform share), each with its text, its character
  range, Σ moved and mean ρ.

One response × one reward is then drawn in full on demand (:func:`full_html`: the method's row, what it moved, ρ
and the oracle's ρ, one under another, the hottest spans outlined and numbered; GDPO's uniform row collapsed to
its number).  A response of at most :data:`LONG_TOKENS` tokens is drawn in full directly
(:func:`mrtpo.display.render.response_html`): below that length every row fits in a screen or two and an overview
costs more reading than it saves.  Cells, colors, tooltips and legends are :mod:`mrtpo.display.render`'s.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mrtpo.core.spans import cell_values
from mrtpo.display.notes import floor_html
from mrtpo.display.render import (
    CSS as BASE_CSS,
)
from mrtpo.display.render import (
    Limits,
    combined_tips,
    diverging_color,
    evidence_note,
    kept,
    legend,
    limits,
    oracle_row,
    reward_head,
    reward_tips,
    sequential_color,
    token_cells,
    token_cells_html,
    token_row,
)
from mrtpo.display.token_view import TokenView

LONG_TOKENS = 300  # a response with more tokens is drawn overview first
STRIP_BINS = 160  # the most marks a strip has
HOT_WIDTH = 12  # the most cells of a hottest span
HOT_SPANS = 5  # hottest spans per response × reward
COMBINED = "combined"  # the full view's name for the combined rows (sum over rewards, batch-normalized)

CSS = BASE_CSS + """
.mrtpo .ovr{display:flex;align-items:flex-start;margin:4px 0 8px 0}
.mrtpo .ovr>.lab{flex:0 0 190px;font-size:12px;color:#333;padding-top:0}
.mrtpo .ovb{flex:1;min-width:0}
.mrtpo .strip{display:flex;height:16px;border:1px solid #ccc;border-radius:2px;background:#fff}
.mrtpo .strip i{flex:1 1 0;min-width:0;height:100%}
.mrtpo .mks{position:relative;height:14px;margin-bottom:2px}
.mrtpo .mk{position:absolute;top:1px;transform:translateX(-50%);font:bold 10px/12px ui-sans-serif,sans-serif;
 color:#fff;background:#333;border-radius:6px;padding:0 4px}
.mrtpo .hots{display:flex;flex-direction:column;gap:2px;font-size:12px}
.mrtpo .hs{display:block;color:#444;line-height:1.7}
.mrtpo .hs .toks{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}
.mrtpo .hs br{display:none}
.mrtpo .hs .ctx{color:#999}
.mrtpo .hs b.n,.mrtpo b.rk{display:inline-block;min-width:14px;text-align:center;font-size:10px;line-height:13px;
 color:#fff;background:#333;border-radius:6px;margin-right:4px;padding:0 2px}
.mrtpo .chip{display:inline-block;font-family:ui-monospace,Menlo,Consolas,monospace;padding:0 5px;border-radius:3px;
 border:1px solid #bbb}
.mrtpo .tok.hot{box-shadow:inset 0 3px 0 #7b3294}
.mrtpo.full .row{flex-direction:column;margin:4px 0}
.mrtpo.full .row .lab{flex:none;padding:0 0 1px 0}
.mrtpo.full .faith{display:inline;margin-left:8px}
.mrtpo .uni{font-size:12px;color:#444;margin:2px 0 4px 0}
.mrtpo .ovkey{font-size:12px;color:#555;margin:4px 0}
"""


def is_long(view: TokenView, i: int | None = None) -> bool:
    """Whether response ``i`` (None: some response of the group) has more than :data:`LONG_TOKENS` tokens."""
    return any(len(view.tokens[n]) > LONG_TOKENS for n in (range(len(view.tokens)) if i is None else [i]))


def hottest_spans(score: Sequence[float], n: int = HOT_SPANS, width: int = HOT_WIDTH) -> list[tuple[int, int]]:
    """The ``n`` hottest spans of a row, as [first, end) ranges of its cells, hottest first.

    score (C,): each cell's heat.  Greedily: of all runs of 1 to ``width`` consecutive cells, the one with the
    largest Σ score (the shorter one on a tie, so no span starts or ends with a cell of heat 0) that overlaps no span
    already chosen; runs whose Σ is ≤ 0 are never chosen (a row with no heat has no hottest span).  NaN counts
    as 0."""
    s = np.nan_to_num(np.asarray(score, dtype=float))
    C = len(s)
    if C == 0 or n <= 0:
        return []
    w = max(1, min(width, C))
    cs = np.concatenate([[0.0], np.cumsum(s)])
    starts, lengths = np.meshgrid(np.arange(C), np.arange(1, w + 1), indexing="ij")  # (C, w) each
    sums = cs[np.minimum(starts + lengths, C)] - cs[starts]  # Σ score over cells [start, start + length)
    ok = (starts + lengths <= C) & (sums > 0)
    starts, lengths, sums = starts[ok], lengths[ok], sums[ok]
    order = np.lexsort((starts, lengths, -sums))
    live = np.ones(len(order), dtype=bool)  # (in ``order``) overlaps no span chosen yet
    s0, e0 = starts[order], starts[order] + lengths[order]
    out: list[tuple[int, int]] = []
    while len(out) < n and live.any():
        first = int(np.argmax(live))
        a, b = int(s0[first]), int(e0[first])
        out.append((a, b))
        live &= (e0 <= a) | (s0 >= b)
    return out


def strip_bins(n_cells: int, n_bins: int = STRIP_BINS) -> list[tuple[int, int]]:
    """[first, end) cell ranges of min(``n_bins``, ``n_cells``) consecutive stretches of (nearly) equal length that
    cover the ``n_cells`` cells of a row in order."""
    B = min(n_bins, n_cells)
    if B <= 0:
        return []
    edges = np.linspace(0, n_cells, B + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def peaks(values: Sequence[float], bins: Sequence[tuple[int, int]]) -> np.ndarray:
    """(B,) per bin (consecutive, as :func:`strip_bins` makes them), the value of its cell of largest |value| (with
    its sign; the positive one of two equal sizes): a strip's marks.  NaN counts as 0."""
    v = np.nan_to_num(np.asarray(values, dtype=float))
    if not len(bins):
        return np.zeros(0)
    starts = np.array([a for a, _ in bins])
    hi, lo = np.maximum.reduceat(v, starts), np.minimum.reduceat(v, starts)
    return np.where(np.abs(hi) >= np.abs(lo), hi, lo)


@dataclass(frozen=True)
class HotSpan:
    """One of the hottest spans of a response × reward (:func:`hot_spans`)."""

    reward: str
    rank: int  # 1 = the hottest
    cells: tuple[int, int]  # [first, end) cells of the row (mrtpo.display.render.token_cells)
    tokens: tuple[int, int]  # [first, end) tokens
    chars: tuple[int, int]  # [start, end) characters of the response's text
    text: str
    moved: float  # Σ over its tokens of A'_ikt − Â_ik / scale
    rho: float  # its tokens' mean ρ_ikt


_CHARS: dict = {}


def char_spans(tokens: Sequence[dict]) -> list[tuple[int, int]]:
    """Each token's [start, end) characters: its ``start`` / ``end`` when every token has them, else from the lengths
    of the texts before it (kept for the last token lists: :func:`mrtpo.display.render.kept`)."""
    def make():
        if tokens and all("start" in t and "end" in t for t in tokens):
            return [(int(t["start"]), int(t["end"])) for t in tokens]
        ends = np.cumsum([len(t["text"]) for t in tokens]).tolist()
        return list(zip([0] + ends[:-1], ends))

    return kept(_CHARS, tokens, (len(tokens),), make)


def moves(view: TokenView, i: int, reward: str) -> bool:
    """Whether the method moved some of ``reward``'s advantage between response ``i``'s tokens."""
    return view.parsed.tokens and bool(np.any(np.nan_to_num(view.moved(i, reward)) != 0))


def heat(view: TokenView, i: int, reward: str, groups: list[list[int]]) -> np.ndarray:
    """(C,) each cell's heat for :func:`hottest_spans`: sign(Â_ik) · Σ over its tokens of A'_ikt − Â_ik where the
    method moved something, else Σ (ρ_ikt − 1) (the same order: what moves is ∝ Â_ik (ρ_ikt − 1))."""
    uni = float(view.per_reward[i, view.reward_names.index(reward)])
    if moves(view, i, reward) and uni != 0:
        return np.sign(uni) * cell_values(view.moved(i, reward), groups, "sum")
    return cell_values(np.asarray(view.relevance[i][reward], dtype=float) - 1.0, groups, "sum")


_HOT: dict = {}


def hot_spans(view: TokenView, i: int, reward: str, n: int = HOT_SPANS, width: int = HOT_WIDTH) -> list[HotSpan]:
    """The hottest spans of response ``i`` for ``reward`` (:func:`hottest_spans` over :func:`heat`); none for a reward
    not replayed.  Kept for the last views (the overview, the table and the full view all show them)."""
    return kept(_HOT, view, (i, reward, n, width), lambda: _hot_spans(view, i, reward, n, width), size=512)


def _hot_spans(view: TokenView, i: int, reward: str, n: int, width: int) -> list[HotSpan]:
    if reward in view.skipped:
        return []
    toks = view.tokens[i]
    groups = token_cells(toks)
    chars = char_spans(toks)
    mv, rel = view.moved(i, reward), np.asarray(view.relevance[i][reward], dtype=float)
    out = []
    for rank, (a, b) in enumerate(hottest_spans(heat(view, i, reward, groups), n, width), start=1):
        t0, t1 = groups[a][0], groups[b - 1][-1] + 1
        out.append(HotSpan(reward, rank, (a, b), (t0, t1), (chars[t0][0], chars[t1 - 1][1]),
                           "".join(t["text"] for t in toks[t0:t1]), float(np.sum(mv[t0:t1])),
                           float(np.mean(rel[t0:t1]))))
    return out


def _lim(view: TokenView, i: int, scale: str, vmax: tuple[float, float] | None) -> Limits:
    """The color limits of response ``i``'s views, as :func:`mrtpo.display.render.response_html` takes them."""
    if vmax is not None:
        return Limits(vmax[0], limits(view, "group").moved, vmax[1])
    return limits(view, scale, i)


def chip(value: float, vmax: float) -> str:
    """One number in its diverging color: a uniform row collapsed."""
    return f'<span class="chip" style="background:{diverging_color(value, vmax)}">{value:+.3f}</span>'


def _strip(view: TokenView, i: int, reward: str, lim: Limits, groups, hot: list[HotSpan],
           n_bins: int = STRIP_BINS) -> str:
    """The strip of response ``i`` × ``reward`` (at most ``n_bins`` marks) and, under it, the hottest spans'
    numbered marks."""
    chars = char_spans(view.tokens[i])
    moved = moves(view, i, reward)
    mv = cell_values(view.moved(i, reward), groups, "sum")
    rel = cell_values(view.relevance[i][reward], groups, "mean")
    bins = strip_bins(len(groups), n_bins)
    marks = peaks(mv if moved else rel, bins)
    what, color, vmax = ("moved", diverging_color, lim.moved) if moved else ("ρ", sequential_color, lim.rel)
    starts = np.array([a for a, _ in bins], dtype=int)
    n = np.diff(np.append(starts, len(groups)))
    mv_sum = np.add.reduceat(np.nan_to_num(mv), starts)
    rel_mean, rel_max = np.add.reduceat(rel, starts) / n, np.maximum.reduceat(rel, starts)
    out = []
    for (a, b), v, s, rm, rx in zip(bins, marks, mv_sum, rel_mean, rel_max):
        t0, t1 = groups[a][0], groups[b - 1][-1] + 1
        tip = (f"characters {chars[t0][0]}–{chars[t1 - 1][1]}, tokens {t0}–{t1 - 1} | moved Σ {s:+.4f} | ρ mean "
               f"{rm:.3f}, max {rx:.3f} | mark ({what}) {v:+.4f}")
        out.append(f'<i style="background:{color(float(v), vmax)}" data-tip="{html.escape(tip)}"></i>')
    C = max(len(groups), 1)
    mk, ends = [], [-1.0, -1.0]  # each level's rightmost mark: a mark too close to one goes one level down
    for h in sorted(hot, key=lambda h: h.cells[0]):
        x = 100 * (h.cells[0] + h.cells[1]) / 2 / C
        level = 0 if x - ends[0] > 2 else 1
        ends[level] = x
        mk.append(f'<b class="mk" style="left:{x:.2f}%;top:{1 + 13 * level}px">{h.rank}</b>')
    tall = ' style="height:27px"' if ends[1] >= 0 else ""
    return f'<div class="strip">{"".join(out)}</div><div class="mks"{tall}>{"".join(mk)}</div>'


def _context(tokens: Sequence[dict], t0: int, t1: int, n: int = 16) -> tuple[str, str]:
    """Up to ``n`` characters of the text before token ``t0`` and after token ``t1`` − 1 (on one line), in grey."""
    before = "".join(t["text"] for t in tokens[max(0, t0 - 8):t0])[-n:]
    after = "".join(t["text"] for t in tokens[t1:t1 + 8])[:n]
    esc = lambda x: html.escape(" ".join(x.split("\n")))  # noqa: E731
    return (f'<span class="ctx">…{esc(before)}</span>' if before else "",
            f'<span class="ctx">{esc(after)}…</span>' if after else "")


def _hot_html(view: TokenView, i: int, reward: str, lim: Limits, hot: list[HotSpan], link: str | None) -> str:
    """The hottest spans of response ``i`` × ``reward``: rank, characters, Σ moved, mean ρ and the text, its cells
    colored like the strip (every number on hover); with ``link`` (the export) a click opens the full view there."""
    if not hot:
        return '<div class="hots"><span class="hs">no span got more than the uniform share</span></div>'
    toks = view.tokens[i]
    moved = moves(view, i, reward)
    vals = view.moved(i, reward) if moved else view.relevance[i][reward]
    kind, vmax = ("diverging", lim.moved) if moved else ("sequential", lim.rel)
    out = []
    for h in hot:
        t0, t1 = h.tokens
        cells = token_cells_html(toks[t0:t1], vals[t0:t1], kind, vmax, reward_tips(view, i, reward, t0, t1), first=t0)
        before, after = _context(toks, t0, t1)
        attrs = f' {link} data-k="{html.escape(reward)}" data-c="{h.cells[0]}" title="open in full"' if link else ""
        out.append(f'<span class="hs{" open" if link else ""}"{attrs}><b class="n">{h.rank}</b>characters '
                   f"{h.chars[0]:,}–{h.chars[1]:,} · moved Σ {h.moved:+.4f} · ρ mean {h.rho:.2f} · "
                   f'<span class="toks">{before}{cells}{after}</span></span>')
    return f'<div class="hots">{"".join(out)}</div>'


def overview_html(view: TokenView, i: int, scale: str = "response", vmax: tuple[float, float] | None = None,
                  link: str | None = None, n_hot: int = HOT_SPANS, snippets: bool = True,
                  n_bins: int = STRIP_BINS) -> str:
    """The overview of response ``i`` (the module docstring): per reward its value, GDPO's uniform share as a
    number, the strip (at most ``n_bins`` marks) with the hottest spans' numbered marks and (``snippets``) the spans
    themselves; a reward not replayed is one line; then the combined advantage.  Colors as
    :func:`mrtpo.display.render.response_html` takes them (``scale``, ``vmax``).  ``link``: attributes that make the
    hottest spans and an "open" button per reward open the full view (the export's script)."""
    lim = _lim(view, i, scale, vmax)
    m = view.parsed
    groups = token_cells(view.tokens[i])
    parts = []
    for j, k in enumerate(view.reward_names):
        name = f"<b>{html.escape(k)}</b> = {view.rewards[i, j]:.3g}"
        if k in view.skipped:
            parts.append(f'<div class="ovr"><div class="lab">{name}</div><div class="ovb why">same for every '
                         "response in the group: advantage 0, not replayed</div></div>")
            continue
        hot = hot_spans(view, i, k, n_hot)
        opener = (f' <button class="open" {link} data-k="{html.escape(k)}">open in full</button>' if link else "")
        parts.append(f'<div class="ovr"><div class="lab">{name}<br>{m.estimator_label} (uniform) '
                     f"{chip(float(view.per_reward[i, j]), lim.adv)}{opener}</div><div class=\"ovb\">"
                     f"{_strip(view, i, k, lim, groups, hot, n_bins)}"
                     f"{_hot_html(view, i, k, lim, hot, link) if snippets else ''}</div></div>")
    opener = f' <button class="open" {link} data-k="{COMBINED}">open in full</button>' if link else ""
    parts.append(f'<div class="ovr"><div class="lab"><b>combined</b>{opener}</div><div class="ovb uni">'
                 f"{m.estimator_label} advantage {chip(float(view.final[i]), lim.adv)} (sum over rewards, "
                 "batch-normalized)</div></div>")
    what = (f"what {m.label} moved, A − Â (±{lim.moved:.3g}, blue: above the uniform share, red: below)" if m.tokens
            else f"relevance ρ (0 … {lim.rel:.3g})")
    key = (f'<div class="ovkey">{len(view.tokens[i]):,} tokens. Strips: {what} along the response, each mark the '
           "largest value of its stretch; numbered: the hottest spans, where the reward's credit went (the most "
           f"moved toward them, ρ &gt; 1). Hover for the numbers.</div>")
    return f'<div class="mrtpo ov">{key}{floor_html(view, i)}{"".join(parts)}</div>'


def full_html(view: TokenView, i: int, reward: str, scale: str = "response", group=None,
              vmax: tuple[float, float] | None = None, n_hot: int = HOT_SPANS) -> str:
    """Response ``i`` × ``reward`` in full (:data:`COMBINED`: the combined rows): the reward's head (value, reason,
    verifier information), GDPO's uniform share as one number, then one under another the method's token row
    A'_ikt, what it moved (A'_ikt − Â_ik / scale), ρ and the oracle's ρ, the hottest spans (:func:`hot_spans`)
    outlined and numbered; evidence underlined; a legend.  Colors as in :func:`overview_html`."""
    lim = _lim(view, i, scale, vmax)
    m = view.parsed
    toks = view.tokens[i]
    split = any(len(c) > 1 for c in token_cells(toks))
    key = legend(lim.adv, lim.rel, bool(view.evidence), lim.moved if m.tokens else None,
                 None if vmax is not None else scale, split) + floor_html(view, i)
    if reward == COMBINED:
        parts = ['<div class="reward"><b>combined</b> (sum over rewards, batch-normalized)</div>',
                 f'<div class="uni">{m.estimator_label} (uniform) {chip(float(view.final[i]), lim.adv)} on every '
                 "token</div>",
                 token_row(f"{view.method} β={view.beta:g}", toks, view.token_adv[i], "diverging", lim.adv,
                           combined_tips(view, i))]
        return f'<div class="mrtpo full">{key}{"".join(parts)}</div>'
    j = view.reward_names.index(reward)
    if reward in view.skipped:
        head = reward_head(view, i, j, group, "(same for every response in the group: advantage 0, not replayed)")
        return f'<div class="mrtpo full">{head}</div>'
    hot = [h.cells for h in hot_spans(view, i, reward, n_hot)]
    tips = reward_tips(view, i, reward)
    marks, note = evidence_note(view, i, reward)
    uni = float(view.per_reward[i, j])
    parts = [reward_head(view, i, j, group),
             f'<div class="uni">{m.estimator_label} (uniform) {chip(uni, lim.adv)} on every token (Â_ik / scale: '
             "one number for the whole response)</div>",
             token_row(f"{view.method} β={view.beta:g}", toks, view.token_adv_per_reward[i][reward], "diverging",
                       lim.adv, tips, marks, hot=hot)]
    if m.tokens:
        parts.append(token_row(f"moved by {m.label}: A − Â (±{lim.moved:.3g})", toks, view.moved(i, reward),
                               "diverging", lim.moved, tips, marks, hot=hot))
    rel_label = "relevance ρ" + ("" if view.measure == "js" else f" ({view.measure})")
    parts.append(token_row(rel_label, toks, view.relevance[i][reward], "sequential", lim.rel, tips, marks, note,
                           hot=hot))
    parts.append(oracle_row(view, i, reward, lim.rel, note, hot=hot))
    return f'<div class="mrtpo full">{key}{"".join(parts)}</div>'


def group_overview_html(view: TokenView, scale: str = "response", vmax: tuple[float, float] | None = None,
                        titles: Sequence[str] | None = None, snippets: bool = True,
                        responses: Sequence[int] | None = None) -> str:
    """The overviews (:func:`overview_html`) of ``responses`` (default: every one) under their titles (default
    "Response i — advantage A_i")."""
    out = []
    for i in range(len(view.texts)) if responses is None else responses:
        t = titles[i] if titles is not None else f"Response {i} — advantage {view.final[i]:+.3f}"
        out.append(f'<div class="mrtpo"><h3>{html.escape(t)}</h3></div>'
                   f"{overview_html(view, i, scale, vmax, snippets=snippets)}")
    return "".join(out)
