"""Smaller HTML panels of the app's other pages, in :mod:`mrtpo.display.render`'s colors and CSS: a relevance
row before/after a template edit, a stored training sample, a token position, a prompt diff, a probe's shift."""
from __future__ import annotations

import html
from typing import Sequence

import numpy as np

from mrtpo.display import TokenView
from mrtpo.display.notes import floor_html, js_text
from mrtpo.display.render import REL, legend, limits, token_row
from mrtpo.replay import ResponseRelevance


def relevance_diff_html(before: ResponseRelevance, after: ResponseRelevance, rewards: Sequence[str]) -> str:
    """Per reward: relevance of one response before and after a template edit (sequential, shared scale) and the
    difference Δρ = after − before (diverging, its own ±max)."""
    toks = before.tokens()
    T = len(toks)
    vmax = max([float(r.relevance[k].max()) for r in (before, after) for k in rewards if k in r.relevance and T]
               + [1.0])
    rows = []
    for k in rewards:
        rb, ra = before.relevance.get(k, np.ones(T)), after.relevance.get(k, np.ones(T))
        jb, ja = before.js.get(k), after.js.get(k)  # None: not computed (a replay-free measure, not replayed)
        diff = ra - rb
        vd = float(np.abs(diff).max()) if T else 0.0
        tips = [f"{t['text']!r} | {k} | before: {js_text(jb, n)}, ρ {rb[n]:.3f} | after: {js_text(ja, n)}, "
                f"ρ {ra[n]:.3f} | Δρ {diff[n]:+.3f}" for n, t in enumerate(toks)]
        rows.append(f'<div class="reward"><b>{html.escape(k)}</b></div>')
        rows.append(token_row("ρ before", toks, rb, "sequential", vmax, tips))
        rows.append(token_row("ρ after", toks, ra, "sequential", vmax, tips))
        rows.append(token_row(f"Δρ (±{vd:.3g})", toks, diff, "diverging", vd or 1.0, tips, agg="mean"))
    return (f"<div class='mrtpo'><div class='legend'>relevance: orange (0 … {vmax:.3g}); Δρ = after − before: "
            f"blue up, red down</div>{''.join(rows)}</div>")


def stored_sample_html(view: TokenView, i: int, row: dict) -> str:
    """Heatmaps of response ``i`` of a stored training step, as Explore shows a sampled one: per reward, the
    estimator's uniform advantage Â_ik / scale (the whole response one color), the method's token row A'_ikt and
    the stored relevance ρ; then the combined advantage (uniform vs the trainer's token advantages).

    view: :func:`mrtpo.display.stored_step_view` of the step; row: the stored row of response ``i``
    (``Store.samples``), for its rewards, reasons and which rewards were replayed.  Colors are scaled per response
    (the largest |advantage| and ρ of this response), so a small advantage is still visible; the legend gives the
    limits.  A response-level method, or a reward not replayed (constant in its group), has no token row."""
    toks = view.tokens[i]
    T = len(toks)
    base = view.parsed.estimator_label
    tokens_method = view.parsed.tokens
    names = [k for k in view.reward_names if k in row["rewards"]]
    replayed = set(row.get("relevance", {}))
    lim = limits(view, "response", i, rewards=names)
    va, vr = lim.adv, max(lim.rel, 1.0)
    parts = [legend(va, vr), floor_html(view, i)]
    reasons = row.get("reasons", {})
    for k in names:
        j = view.reward_names.index(k)
        uni, ta, rel = float(view.per_reward[i, j]), view.token_adv_per_reward[i][k], view.relevance[i][k]
        why = f" — {html.escape(reasons[k])}" if reasons.get(k) else ""
        parts.append(f'<div class="reward"><b>{html.escape(k)}</b> = {view.rewards[i, j]:.3g}'
                     f'<span style="color:#777;font-size:12px">{why}</span></div>')
        tips = [f"{t['text']!r} | reward {k} | relevance {rel[n]:.3f} | {view.method} advantage {ta[n]:+.4f} | "
                f"{base} advantage {uni:+.4f}" for n, t in enumerate(toks)]
        parts.append(token_row(f"{base} (uniform) {uni:+.3f}", toks, [uni] * T, "diverging", va, tips))
        if uni == 0 and k not in replayed:
            parts.append('<div class="lab" style="padding-left:190px">same for every response of its group: '
                         'advantage 0, not replayed</div>')
            continue
        if tokens_method and k in replayed:
            parts.append(token_row(f"{view.method} β_s={view.beta:.3g}", toks, ta, "diverging", va, tips))
            parts.append(token_row("relevance ρ", toks, rel, "sequential", vr, tips))
    fin, ta = float(view.final[i]), view.token_adv[i]
    tips = [f"{t['text']!r} | combined | {view.method} advantage {ta[n]:+.4f} | {base} advantage {fin:+.4f}"
            for n, t in enumerate(toks)]
    parts.append('<div class="reward"><b>combined</b> (sum over rewards, batch-normalized: what the update used)</div>')
    parts.append(token_row(f"{base} (uniform) {fin:+.3f}", toks, [fin] * T, "diverging", va, tips))
    if tokens_method:
        parts.append(token_row(f"{view.method} β_s={view.beta:.3g}", toks, ta, "diverging", va, tips))
    return f"<div class='mrtpo'>{''.join(parts)}</div>"


def position_html(tokens: Sequence[dict], t: int, label: str = "token t") -> str:
    """One response as a row of tokens with token ``t`` highlighted (orange) and its position in each tooltip."""
    tips = [f"t = {n}: {tok['text']!r}" for n, tok in enumerate(tokens)]
    onehot = [1.0 if n == t else 0.0 for n in range(len(tokens))]
    return f"<div class='mrtpo'>{token_row(label, tokens, onehot, 'sequential', 1.0, tips, agg='max')}</div>"


def prompt_diff_html(without: str, with_: str) -> str:
    """``with_`` (P_all) with what ``without`` (P_\\k) lacks highlighted: the text that v_k added (difflib)."""
    import difflib

    ops = difflib.SequenceMatcher(None, without, with_, autojunk=False).get_opcodes()
    inserts = [o for o in ops if o[0] != "equal"]
    if len(inserts) == 1 and inserts[0][0] == "insert":  # one block added (P_\\k = P_all less v_k's item)
        _, i1, _, j1, j2 = inserts[0]
        # the same block fits anywhere it can slide while the text repeats; show it starting at a line start
        # ("\\n- v_k …" reads as the added line) when it can, else as far right as it goes
        while j1 > 0 and with_[j1 - 1] == with_[j2 - 1]:
            j1, j2 = j1 - 1, j2 - 1
        starts = [j1]
        while j2 < len(with_) and with_[j1] == with_[j2]:
            j1, j2 = j1 + 1, j2 + 1
            starts.append(j1)
        j1 = next((j for j in starts if j > 0 and with_[j - 1] == "\n"), starts[-1])
        j2 = j1 + inserts[0][4] - inserts[0][3]
        ops = [("equal", 0, 0, 0, j1), ("insert", 0, 0, j1, j2), ("equal", 0, 0, j2, len(with_))]
    out = []
    for op, _, _, j1, j2 in ops:
        seg = html.escape(with_[j1:j2])
        if op == "equal":
            out.append(seg)
        elif j2 > j1:  # insert / replace: in P_all only
            out.append(f"<mark style='background:rgba({REL[0]},{REL[1]},{REL[2]},0.35);border-radius:2px'>{seg}</mark>")
    return ("<pre style='white-space:pre-wrap;background:#f6f6f6;padding:8px;font-size:13px;line-height:1.5'>"
            f"{''.join(out)}</pre>")


def probe_shift_html(tokens: Sequence[str], reward: str, before: Sequence[float], after: Sequence[float],
                     step: int, vmax: float, vdiff: float) -> str:
    """The relevance shift of one probe response for ``reward``: ρ before training (step 0), ρ at ``step`` and
    Δρ = after − before. The scales are given (``vmax`` for ρ, ±``vdiff`` for Δρ) so that blocks of several runs
    side by side share them."""
    toks = [{"text": t} for t in tokens]
    b, a = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    d = a - b
    tips = [f"{t!r} | {reward} | step 0: ρ {b[n]:.3f} | step {step}: ρ {a[n]:.3f} | Δρ {d[n]:+.3f}"
            for n, t in enumerate(tokens)]
    rows = [token_row("ρ step 0", toks, b, "sequential", vmax, tips),
            token_row(f"ρ step {step}", toks, a, "sequential", vmax, tips),
            token_row(f"Δρ (±{vdiff:.3g})", toks, d, "diverging", vdiff or 1.0, tips, agg="mean")]
    return (f"<div class='mrtpo'><div class='legend'>relevance ρ: orange (0 … {vmax:.3g}, mean 1); Δρ = step {step}"
            f" − step 0: blue up, red down</div>{''.join(rows)}</div>")
