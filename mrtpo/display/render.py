"""Token heatmaps as self-contained HTML (no CDN): used by the CLI's ``explain`` and the app.

Conventions (Captum / Inseq): advantages use a diverging scale pinned at 0 (blue = positive, red = negative,
0 transparent) with symmetric limits ±max|v|; relevance uses a sequential scale (orange, 0 transparent).
Every number is in the hover tooltip: one CSS rule (:data:`CSS`, ``[data-tip]:hover::after``) shows a cell's
``data-tip`` attribute, so the views need no script and no ``title`` per span (where the browser anchors it, the
tooltip flips to stay in the window); a legend says what the colors mean.
The tokens a reward's checker read (its evidence, ``Score.evidence``) are underlined in that reward's rows with a
dark bar that stays readable over every color (class ``ev``), and the relevance row's label gives that response's
token AUROC and lift (:mod:`mrtpo.core.faith_metrics`).

A character split over several tokens (the bytes of a multi-byte character) is drawn once, as one cell
(:mod:`mrtpo.core.spans`): advantages are summed over its tokens, relevance ρ averaged; its tooltip lists every
token's numbers.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mrtpo.core.faith_metrics import token_labels
from mrtpo.core.measures import MEASURE_NEEDS, needs, oracle_relevance
from mrtpo.core.spans import cell_values, cells, text_cells
from mrtpo.display import TokenView, faithfulness_table
from mrtpo.display.notes import floor_html, floor_note, js_tip
from mrtpo.display.style import CSS, NEG, POS, REL, diverging_color, sequential_color  # noqa: F401 - render's names
from mrtpo.groups import ScoredGroup


def _esc_token(text: str) -> str:
    t = html.escape(text)
    return t.replace("\n", '<span class="nl">↵</span><br>') if "\n" in t else t


def kept(store: dict, obj, key: tuple, make, size: int = 64):
    """``make()`` for ``obj`` (and ``key``), kept in ``store`` by the object's identity while it is among the last
    ``size`` (a view and its token lists are drawn many times: the overview, the table, the full view); the object
    is held, so its id is not reused; callers read the result, never change it."""
    k = (id(obj), *key)
    hit = store.get(k)
    if hit is not None and hit[0] is obj:
        return hit[1]
    value = make()
    if len(store) >= size:
        store.pop(next(iter(store)))
    store[k] = (obj, value)
    return value


_CELLS: dict = {}


def token_cells(tokens: Sequence[dict]) -> list[list[int]]:
    """The cells of a row's tokens (:func:`mrtpo.core.spans.cells`): by their spans ``start`` / ``end`` when every
    token has them, else by their texts (kept for the last token lists: :func:`kept`)."""
    def make():
        if tokens and all("start" in t and "end" in t for t in tokens):
            return cells([(t["start"], t["end"]) for t in tokens])
        return text_cells([t["text"] for t in tokens])

    return kept(_CELLS, tokens, (len(tokens),), make)


def default_aggregate(kind: str) -> str:
    """How a row's cell combines its tokens' values unless told: ``sum`` on a diverging row (advantages), ``mean``
    on a sequential one (relevance) — :mod:`mrtpo.core.spans` says why."""
    return "sum" if kind == "diverging" else "mean"


def _cell_tip(text: str, agg: str, value: float, tips: Sequence[str]) -> str:
    n = len(tips)
    head = f"{text!r}: {n} tokens sharing a character, drawn as their {agg} {value:.4g}"
    return head + "".join(f"\ntoken {k}/{n}: {tip}" for k, tip in enumerate(tips, start=1))


def token_cells_html(tokens: Sequence[dict], values: Sequence[float], kind: str, vmax: float,
                     tooltips: Sequence[str], marks: Sequence[bool] | None = None, agg: str | None = None,
                     first: int = 0, hot: Sequence[tuple[int, int]] = ()) -> str:
    """The cells of a row, as :func:`token_row` draws them (without its label): one ``<span class="tok">`` per cell
    (:func:`token_cells`: the tokens of one character drawn once, their values combined by ``agg``, default
    :func:`default_aggregate`; every token's tooltip in the cell's ``data-tip``; ``data-i``: its first token's index
    plus ``first``, where ``tokens`` start in their response); each run of cells where ``marks`` (per token) is True
    for some token is wrapped in ``<span class="ev">`` (the evidence underline); the cells of each ``hot`` range
    [first cell, end cell) get the class ``hot`` and the first of them a rank badge
    ``<b class="rk" data-c="cell">n</b>``."""
    color = diverging_color if kind == "diverging" else sequential_color
    agg = agg or default_aggregate(kind)
    T = min(len(tokens), len(values), len(tooltips))
    tokens = list(tokens)[:T]
    groups = token_cells(tokens)
    vals = cell_values(list(values)[:T], groups, agg)
    tok_marks = [False] * T if marks is None else list(marks)[:T] + [False] * (T - len(marks))
    cm = [any(tok_marks[t] for t in g) for g in groups]
    rank = {a: n for n, (a, _) in enumerate(hot, start=1)}
    in_hot = np.zeros(len(groups), dtype=bool)
    for a, b in hot:
        in_hot[a:b] = True
    spans = []
    for n, (g, v, m) in enumerate(zip(groups, vals, cm)):
        if m and (n == 0 or not cm[n - 1]):
            spans.append('<span class="ev">')
        if n in rank:
            spans.append(f'<b class="rk" data-c="{n}">{rank[n]}</b>')
        text = "".join(tokens[t]["text"] for t in g)
        tip = tooltips[g[0]] if len(g) == 1 else _cell_tip(text, agg, float(v), [tooltips[t] for t in g])
        tip = tip + (" | evidence: read by the checker" if m else "")
        cls = "tok hot" if in_hot[n] else "tok"
        spans.append(f'<span class="{cls}" style="background:{color(float(v), vmax)}" data-i="{g[0] + first}" '
                     f'data-tip="{html.escape(tip, quote=True)}">{_esc_token(text)}</span>')
        if m and (n == len(cm) - 1 or not cm[n + 1]):
            spans.append("</span>")
    return "".join(spans)


def token_row(label: str, tokens: Sequence[dict], values: Sequence[float], kind: str, vmax: float,
              tooltips: Sequence[str], marks: Sequence[bool] | None = None, note: str = "",
              agg: str | None = None, hot: Sequence[tuple[int, int]] = ()) -> str:
    """One heatmap row: a label (and a small ``note`` under it) and its cells (:func:`token_cells_html`: a character
    drawn once, every number in the cell's tooltip, evidence underlined, ``hot`` ranges of cells outlined)."""
    cells_ = token_cells_html(tokens, values, kind, vmax, tooltips, marks, agg, hot=hot)
    lab = html.escape(label) + (f'<span class="faith">{html.escape(note)}</span>' if note else "")
    return f'<div class="row"><div class="lab">{lab}</div><div class="toks">{cells_}</div></div>'


def evidence_note(view: TokenView, i: int, reward: str) -> tuple[list[bool] | None, str]:
    """The evidence marks (T,) of response ``i`` for ``reward`` and the note beside its relevance row: that
    response's token AUROC and lift, or why there are none ("evidence: the whole response", ...)."""
    m = view.faithfulness(i, reward)
    if m is None:
        return None, ""
    spans = view.evidence[i].get(reward)
    marks = None if spans is None else list(token_labels([(t["start"], t["end"]) for t in view.tokens[i]], spans,
                                                         view.texts[i]))
    if m.status == "whole":
        return None, "evidence: the whole response"
    if m.status == "empty":
        return marks, "evidence: nothing specific"
    if m.status == "all":
        return marks, "evidence: every token"
    return marks, f"AUROC {m.auroc:.2f} · lift {m.lift:.2f}"


SPLIT_NOTE = ("<span>a character split over several tokens is one cell: its tokens' advantages summed, their ρ "
              "averaged (hover for each token)</span>")


def legend(vmax_adv: float, vmax_rel: float, evidence: bool = False, vmax_moved: float | None = None,
           scale: str | None = None, split: bool = False) -> str:
    """The colors' key: advantage ±``vmax_adv`` (diverging), the moved rows ±``vmax_moved`` (when given), relevance
    0 … ``vmax_rel``; ``scale`` ("response" / "group") says whose values set the limits; ``split``: some character
    is drawn from several tokens (say how its cell is colored)."""
    ev = ('<span><span class="ev evkey">abc</span> evidence: the characters the reward\'s checker read; '
          "AUROC (0.5 = chance) and lift (1 = uniform) say how well ρ finds them</span>") if evidence else ""
    div = f"linear-gradient(90deg,rgb{NEG},white,rgb{POS})"
    moved = "" if vmax_moved is None else (
        f'<span>moved <span class="bar" style="background:{div}"></span> ±{vmax_moved:.3g}</span>')
    who = {"response": "colors scaled to this response:", "group": "colors shared by the group:"}.get(scale or "", "")
    return (
        '<div class="legend">' + (f'<span class="scale">{who}</span>' if who else "")
        + f'<span>advantage <span class="bar" style="background:{div}"></span>'
        f" −{vmax_adv:.3g} (red: pushed down) · 0 · +{vmax_adv:.3g} (blue: pushed up)</span>{moved}"
        f'<span>relevance <span class="bar" style="background:linear-gradient(90deg,white,rgb{REL})"></span>'
        f" 0 … {vmax_rel:.3g} (mean 1)</span>{ev}{SPLIT_NOTE if split else ''}</div>"
    )


SCALES = {"response": "per response", "group": "shared by the group"}  # color-scale choices: key → label


@dataclass(frozen=True)
class Limits:
    """Color limits of a heatmap: advantages ±``adv`` (diverging, pinned at 0), the "moved by MRTPO" rows
    ±``moved`` (diverging) and relevance 0 … ``rel`` (sequential)."""

    adv: float
    moved: float
    rel: float


def _top(values, groups: list[list[int]], how: str = "sum") -> float:
    """The largest |value| of a row's cells."""
    return float(np.abs(cell_values(values, groups, how)).max(initial=0.0))


def limits(view: TokenView, scale: str = "response", i: int | None = None,
           rewards: Sequence[str] | None = None) -> Limits:
    """The color limits of the rows :func:`response_html` draws, over response ``i``'s rows (``scale="response"``)
    or over every response's (``scale="group"``); ``rewards`` limits the per-reward rows to those (None = all).
    Over the cells drawn (:func:`token_cells`: a character's tokens summed for advantages, averaged for ρ):

    adv   = max |v| over the uniform shares Â_ik / scale (``per_reward``), the token rows A'_ikt, and the combined
            A_i (``final``) and A_it (``token_adv``);
    moved = max |A'_ikt − Â_ik / scale| (:meth:`mrtpo.display.TokenView.moved`);
    rel   = max ρ_ikt.
    A limit of 0 (nothing to color) becomes 1, so every color stays transparent and no division by 0 happens.  A
    group's are kept for the last views (:func:`kept`: a page asks for them once per response it draws)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    if scale == "response" and i is None:
        raise ValueError('scale="response" needs the response i')
    if scale == "response":
        return _limits(view, scale, i, rewards)
    key = (None if rewards is None else tuple(rewards),)
    return kept(_LIMITS, view, key, lambda: _limits(view, scale, i, rewards))


_LIMITS: dict = {}


def _limits(view: TokenView, scale: str, i: int | None, rewards: Sequence[str] | None) -> Limits:
    rows = range(len(view.texts)) if scale == "group" else [i]
    names = [k for k in view.reward_names if rewards is None or k in rewards]
    adv, moved, rel = [0.0], [0.0], [0.0]
    for n in rows:
        g = token_cells(view.tokens[n])
        width = max(map(len, g), default=1)  # the most tokens in one cell: a uniform row's largest cell
        adv += [abs(float(view.final[n])) * width, _top(view.token_adv[n], g)]
        for k in names:
            adv += [abs(float(view.per_reward[n, view.reward_names.index(k)])) * width,
                    _top(view.token_adv_per_reward[n][k], g)]
            moved.append(_top(view.moved(n, k), g))
            rel.append(_top(view.relevance[n][k], g, "mean"))
    return Limits(max(adv) or 1.0, max(moved) or 1.0, max(rel) or 1.0)


def scales(view: TokenView) -> tuple[float, float]:
    """(advantage limit, relevance limit) shared by the whole group (:func:`limits` with ``scale="group"``)."""
    lim = limits(view, "group")
    return lim.adv, lim.rel


def _pair(*rows: str) -> str:
    """Rows side by side where the width allows (a grid of columns at least 360 px wide; it wraps when narrow)."""
    return f'<div class="pair">{"".join(rows)}</div>'


def reward_head(view: TokenView, i: int, j: int, group: ScoredGroup | None, note: str = "") -> str:
    """A reward's header: its name and value, the checker's reason (when it gave one) and, folded, its verifier
    information v_k (what P_\\k leaves out); every text escaped."""
    k = view.reward_names[j]
    reason = group.reasons[i].get(k, "") if group is not None and group.reasons else ""
    why = f' <span class="why">— {html.escape(reason)}</span>' if reason else ""
    extra = f' <span class="why">{html.escape(note)}</span>' if note else ""
    info = group.verifier_info[i].get(k) if group is not None and group.verifier_info else None
    vk = ("" if not info else f'<details class="vk"><summary>verifier information v_k (what P_\\k leaves out)'
          f"</summary><pre>{html.escape(info)}</pre></details>")
    return f'<div class="reward"><b>{html.escape(k)}</b> = {view.rewards[i, j]:.3g}{why}{extra}{vk}</div>'


def reward_tips(view: TokenView, i: int, reward: str, start: int = 0, end: int | None = None) -> list[str]:
    """Per token of response ``i`` (tokens ``start`` … ``end`` − 1; default all), the tooltip of ``reward``'s rows:
    its JS distance (:func:`js_tip`), ρ, the method's and the estimator's advantage, and what the method moved."""
    m = view.parsed
    j = view.reward_names.index(reward)
    js, rel, ta = view.js[i].get(reward), view.relevance[i][reward], view.token_adv_per_reward[i][reward]
    uni = float(view.per_reward[i, j])
    toks = view.tokens[i]
    return [f"{toks[n]['text']!r} | reward {reward}{js_tip(js, n)} | "
            f"relevance {rel[n]:.3f} | {m.label} advantage {ta[n]:+.4f} | {m.estimator_label} advantage {uni:+.4f} | "
            f"moved {ta[n] - uni:+.4f}" for n in range(start, len(toks) if end is None else end)]


def combined_tips(view: TokenView, i: int) -> list[str]:
    """Per token of response ``i``, the tooltip of the combined rows: the method's A_it and the response's A_i."""
    m = view.parsed
    fin, ta = float(view.final[i]), view.token_adv[i]
    return [f"{t['text']!r} | combined | {m.label} advantage {ta[n]:+.4f} | {m.estimator_label} advantage {fin:+.4f}"
            for n, t in enumerate(view.tokens[i])]


def response_html(view: TokenView, i: int, rewards: Sequence[str] | None = None, combined: bool = True,
                  vmax: tuple[float, float] | None = None, scale: str = "response",
                  group: ScoredGroup | None = None) -> str:
    """Heatmaps of response ``i``: per reward, the estimator's uniform advantage beside the method's token
    advantages A'_ikt (side by side where the width allows), what the method moved (A'_ikt − Â_ik / scale: the
    reallocation itself, its own diverging limit) beside the relevance ρ; then the combined advantages.

    Colors: ``scale`` "response" (each response's own limits) or "group" (shared: :func:`limits`); ``vmax`` =
    (advantage, relevance) limits given by the caller overrides both (the moved rows then use the group's limit).
    ``group`` adds each reward's reason and verifier information. A reward constant in the group (not replayed)
    is one line: its value and reason."""
    shown = [k for k in view.reward_names if rewards is None or k in rewards]
    if vmax is not None:
        lim = Limits(vmax[0], limits(view, "group", rewards=shown).moved, vmax[1])
    else:
        lim = limits(view, scale, i, rewards=shown)
    va, vm, vr = lim.adv, lim.moved, lim.rel
    m = view.parsed
    base = m.estimator_label
    toks = view.tokens[i]
    T = len(toks)
    parts = []
    for j, k in enumerate(view.reward_names):
        if k not in shown:
            continue
        if k in view.skipped:
            parts.append(reward_head(view, i, j, group, "(same for every response in the group: advantage 0, "
                                                         "not replayed)"))
            continue
        rel, ta, mv = view.relevance[i][k], view.token_adv_per_reward[i][k], view.moved(i, k)
        uni = float(view.per_reward[i, j])
        tips = reward_tips(view, i, k)
        marks, note = evidence_note(view, i, k)
        parts.append(reward_head(view, i, j, group))
        parts.append(_pair(token_row(f"{base} (uniform) {uni:+.3f}", toks, [uni] * T, "diverging", va, tips),
                           token_row(f"{view.method} β={view.beta:g}", toks, ta, "diverging", va, tips, marks)))
        rel_label = "relevance ρ" + ("" if view.measure == "js" else f" ({view.measure})")
        rel_row = token_row(rel_label, toks, rel, "sequential", vr, tips, marks, note)
        if m.tokens:
            parts.append(_pair(token_row(f"moved by {m.label}: A − Â (±{vm:.3g})", toks, mv, "diverging", vm, tips,
                                         marks), rel_row))
        else:
            parts.append(_pair(rel_row))
        oracle = oracle_row(view, i, k, vr, note)
        if oracle:
            parts.append(_pair("<div></div>", oracle))  # under ρ, in the right column
    if combined:
        fin, ta = float(view.final[i]), view.token_adv[i]
        tips = combined_tips(view, i)
        parts.append('<div class="reward"><b>combined</b> (sum over rewards, batch-normalized)</div>')
        parts.append(_pair(token_row(f"{base} (uniform) {fin:+.3f}", toks, [fin] * T, "diverging", va, tips),
                           token_row(f"{view.method} β={view.beta:g}", toks, ta, "diverging", va, tips)))
    split = any(len(c) > 1 for c in token_cells(toks))
    key = legend(va, vr, bool(view.evidence), vm if m.tokens else None, None if vmax is not None else scale, split)
    return f'<div class="mrtpo">{key}{floor_html(view, i)}{"".join(parts)}</div>'


def oracle_values(view: TokenView, i: int, reward: str) -> np.ndarray | None:
    """(T,) the oracle's ρ of response ``i`` for ``reward``: from what its checker read (Score.evidence; the
    ``evidence`` measure); None without evidence, for the whole response, or when the view's measure is the oracle (a
    label outside the registry, such as a tuned choice's, names black-box measures)."""
    oracle = view.measure in MEASURE_NEEDS and needs(view.measure).evidence
    if not view.evidence or oracle or view.evidence[i].get(reward) is None:
        return None
    return oracle_relevance([(t["start"], t["end"]) for t in view.tokens[i]], view.texts[i], view.evidence[i][reward])


def oracle_tips(view: TokenView, i: int, reward: str, rel: Sequence[float]) -> list[str]:
    return [f"{t['text']!r} | reward {reward} | oracle relevance {rel[n]:.3f} (the checker read it: "
            f"{'yes' if rel[n] > 1 else 'no'})" for n, t in enumerate(view.tokens[i])]


def oracle_note(note: str) -> str:
    """The oracle row's note, from the ρ row's (:func:`evidence_note`)."""
    return "ρ above vs this: " + note if note.startswith("AUROC") else note


def oracle_row(view: TokenView, i: int, reward: str, vmax: float, note: str, hot=()) -> str:
    """Under the replayed ρ, the oracle's (:func:`oracle_values`), so the two can be compared token by token; ""
    where there is none.  ``note``: the replayed ρ's AUROC against it."""
    rel = oracle_values(view, i, reward)
    if rel is None:
        return ""
    return token_row("evidence (oracle) ρ", view.tokens[i], rel, "sequential", vmax, oracle_tips(view, i, reward, rel),
                     note=oracle_note(note), hot=hot)


def rewards_table(view: TokenView, group: ScoredGroup | None = None) -> str:
    """Per response (numbered from 0, as everywhere): each reward's value and share Â_ik / s, and the advantage;
    under it why the shares are large where the scale fell below the floor (:func:`floor_note`)."""
    head = "".join(f"<th>{html.escape(k)}</th><th>Â {html.escape(k)}</th>" for k in view.reward_names)
    rows = []
    for i in range(len(view.texts)):
        cells = "".join(f"<td>{view.rewards[i, j]:.3g}</td><td>{view.per_reward[i, j]:+.3f}</td>"
                        for j in range(len(view.reward_names)))
        rows.append(f"<tr><td>{i}</td>{cells}<td>{view.final[i]:+.3f}</td></tr>")
    notes: dict[str, list[int]] = {}  # one note per scale (GRPO's differ by group)
    for i in range(len(view.texts)):
        if floor_note(view, i):
            notes.setdefault(floor_note(view, i), []).append(i)
    foot = "".join(
        f'<p class="why floor">Â of {"every response" if len(who) == len(view.texts) else _who(who)}: '
        f"{html.escape(note[0].lower() + note[1:])}</p>" for note, who in notes.items())
    return f'<table><tr><th>#</th>{head}<th>advantage</th></tr>{"".join(rows)}</table>{foot}'


def _who(responses: Sequence[int]) -> str:
    """``response 3`` / ``responses 0, 2``."""
    return ("response " if len(responses) == 1 else "responses ") + ", ".join(map(str, responses))


def faithfulness_html(view: TokenView) -> str:
    """The group's faithfulness table (:func:`mrtpo.display.faithfulness_table`) as HTML; '' without evidence."""
    rows = faithfulness_table(view)
    if not rows:
        return ""
    cols = list(rows[0])
    fmt = lambda v: "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else html.escape(str(v)))  # noqa: E731
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{fmt(r[c])}</td>" for c in cols) + "</tr>" for r in rows)
    return (f"<h3>Faithfulness of relevance ({html.escape(view.measure)}) to the verifiers' evidence</h3>"
            f"<table><tr>{head}</tr>{body}</table>")
