"""Token heatmaps as self-contained HTML (no scripts, no CDN): used by the CLI's ``explain`` and the app.

Conventions (Captum / Inseq): advantages use a diverging scale pinned at 0 (blue = positive, red = negative,
0 transparent) with symmetric limits ±max|v|; relevance uses a sequential scale (orange, 0 transparent).
Every number is in the hover tooltip (``title``); a legend says what the colors mean. The tokens a reward's checker
read (its evidence, ``Score.evidence``) are underlined in that reward's rows with a dark bar that stays readable
over every color (class ``ev``), and the relevance row's label gives that response's token AUROC and lift
(:mod:`mrtpo.core.faithfulness`).
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mrtpo.core.advantages import parse_method
from mrtpo.core.faithfulness import token_labels
from mrtpo.core.measures import ORACLE, oracle_relevance
from mrtpo.groups import ScoredGroup
from mrtpo.replay import ResponseRelevance
from mrtpo.views import TokenView, faithfulness_table

CSS = """
.mrtpo{font-family:ui-sans-serif,system-ui,sans-serif;font-size:14px;color:#222}
.mrtpo .row{display:flex;align-items:flex-start;margin:2px 0}
.mrtpo .lab{flex:0 0 190px;font-size:12px;color:#555;padding-top:3px}
.mrtpo .toks{flex:1;font-family:ui-monospace,Menlo,Consolas,monospace;line-height:1.9;white-space:normal;
 word-break:break-word}
.mrtpo .tok{border-radius:3px;padding:1px 0;white-space:pre-wrap}
.mrtpo .ev{border-bottom:3px solid #111;padding:0 1px 1px;box-decoration-break:clone;-webkit-box-decoration-break:clone}
.mrtpo .evkey{font-family:ui-monospace,Menlo,Consolas,monospace}
.mrtpo .faith{display:block;font-size:11px;color:#333}
.mrtpo .nl{color:#aaa}
.mrtpo .legend{display:flex;flex-wrap:wrap;gap:4px 14px;align-items:center;font-size:12px;color:#555;margin:6px 0}
.mrtpo .bar{display:inline-block;width:120px;height:10px;border-radius:2px;vertical-align:middle}
.mrtpo .reward{border-top:1px solid #eee;padding-top:4px;margin-top:6px}
.mrtpo h3{margin:10px 0 4px 0;font-size:15px}
.mrtpo .pair{display:grid;grid-template-columns:repeat(auto-fit,minmax(360px,1fr));column-gap:24px}
.mrtpo .pair .row{flex-direction:column;margin:3px 0}
.mrtpo .pair .lab{flex:none;padding:0 0 1px 0}
.mrtpo .pair .faith{display:inline;margin-left:8px}
.mrtpo .why{font-weight:normal;font-size:12px;color:#666}
.mrtpo .vk{font-size:12px;color:#555;margin:1px 0 2px 0}
.mrtpo .vk summary{cursor:pointer}
.mrtpo .vk pre{white-space:pre-wrap;background:#f6f6f6;padding:4px 6px;margin:2px 0;font-size:12px}
.mrtpo .scale{font-weight:600;color:#333}
.mrtpo table{border-collapse:collapse;font-size:12px}
.mrtpo td,.mrtpo th{border:1px solid #ddd;padding:2px 6px;text-align:right}
"""

POS, NEG, REL = (33, 102, 172), (178, 24, 43), (230, 97, 1)


def diverging_color(v: float, vmax: float) -> str:
    """rgba for an advantage: blue for v > 0, red for v < 0, alpha |v| / vmax (0 → transparent)."""
    if vmax <= 0 or v == 0 or not np.isfinite(v):
        return "transparent"
    a = min(1.0, abs(v) / vmax) * 0.85
    r, g, b = POS if v > 0 else NEG
    return f"rgba({r},{g},{b},{a:.3f})"


def sequential_color(v: float, vmax: float) -> str:
    """rgba for relevance: orange with alpha v / vmax."""
    if vmax <= 0 or v <= 0 or not np.isfinite(v):
        return "transparent"
    a = min(1.0, v / vmax) * 0.85
    return f"rgba({REL[0]},{REL[1]},{REL[2]},{a:.3f})"


def _esc_token(text: str) -> str:
    t = html.escape(text)
    return t.replace("\n", '<span class="nl">↵</span><br>') if "\n" in t else t


def token_row(label: str, tokens: Sequence[dict], values: Sequence[float], kind: str, vmax: float,
              tooltips: Sequence[str], marks: Sequence[bool] | None = None, note: str = "") -> str:
    """One heatmap row: a label (and a small ``note`` under it) and one ``<span class="tok">`` per token; each run of
    tokens where ``marks`` is True is wrapped in ``<span class="ev">`` (the evidence underline)."""
    color = diverging_color if kind == "diverging" else sequential_color
    marks = [False] * len(tokens) if marks is None else list(marks)
    spans = []
    for n, (t, v, tip, m) in enumerate(zip(tokens, values, tooltips, marks)):
        if m and (n == 0 or not marks[n - 1]):
            spans.append('<span class="ev">')
        tip = tip + (" | evidence: read by the checker" if m else "")
        spans.append(f'<span class="tok" style="background:{color(float(v), vmax)}" '
                     f'title="{html.escape(tip, quote=True)}">{_esc_token(t["text"])}</span>')
        if m and (n == len(marks) - 1 or not marks[n + 1]):
            spans.append("</span>")
    lab = html.escape(label) + (f'<span class="faith">{html.escape(note)}</span>' if note else "")
    return f'<div class="row"><div class="lab">{lab}</div><div class="toks">{"".join(spans)}</div></div>'


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


def legend(vmax_adv: float, vmax_rel: float, evidence: bool = False, vmax_moved: float | None = None,
           scale: str | None = None) -> str:
    """The colors' key: advantage ±``vmax_adv`` (diverging), the moved rows ±``vmax_moved`` (when given), relevance
    0 … ``vmax_rel``; ``scale`` ("response" / "group") says whose values set the limits."""
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
        f" 0 … {vmax_rel:.3g} (mean 1)</span>{ev}</div>"
    )


SCALES = {"response": "per response", "group": "shared by the group"}  # color-scale choices: key → label


@dataclass(frozen=True)
class Limits:
    """Color limits of a heatmap: advantages ±``adv`` (diverging, pinned at 0), the "moved by MRTPO" rows
    ±``moved`` (diverging) and relevance 0 … ``rel`` (sequential)."""

    adv: float
    moved: float
    rel: float


def limits(view: TokenView, scale: str = "response", i: int | None = None,
           rewards: Sequence[str] | None = None) -> Limits:
    """The color limits of the rows :func:`response_html` draws, over response ``i``'s rows (``scale="response"``)
    or over every response's (``scale="group"``); ``rewards`` limits the per-reward rows to those (None = all).

    adv   = max |v| over the uniform shares Â_ik / scale (``per_reward``), the token rows A'_ikt, and the combined
            A_i (``final``) and A_it (``token_adv``);
    moved = max |A'_ikt − Â_ik / scale| (:meth:`mrtpo.views.TokenView.moved`);
    rel   = max ρ_ikt.
    A limit of 0 (nothing to color) becomes 1, so every color stays transparent and no division by 0 happens."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    if scale == "response" and i is None:
        raise ValueError('scale="response" needs the response i')
    rows = range(len(view.texts)) if scale == "group" else [i]
    names = [k for k in view.reward_names if rewards is None or k in rewards]
    adv, moved, rel = [0.0], [0.0], [0.0]
    for n in rows:
        adv += [abs(float(view.final[n])), float(np.abs(view.token_adv[n]).max(initial=0.0))]
        for k in names:
            adv += [abs(float(view.per_reward[n, view.reward_names.index(k)])),
                    float(np.abs(view.token_adv_per_reward[n][k]).max(initial=0.0))]
            moved.append(float(np.abs(view.moved(n, k)).max(initial=0.0)))
            rel.append(float(np.max(view.relevance[n][k], initial=0.0)))
    return Limits(max(adv) or 1.0, max(moved) or 1.0, max(rel) or 1.0)


def scales(view: TokenView) -> tuple[float, float]:
    """(advantage limit, relevance limit) shared by the whole group (:func:`limits` with ``scale="group"``)."""
    lim = limits(view, "group")
    return lim.adv, lim.rel


def _pair(*rows: str) -> str:
    """Rows side by side where the width allows (a grid of columns at least 360 px wide; it wraps when narrow)."""
    return f'<div class="pair">{"".join(rows)}</div>'


def _reward_head(view: TokenView, i: int, j: int, group: ScoredGroup | None, note: str = "") -> str:
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
    m = parse_method(view.method)
    base = m.estimator_label
    toks = view.tokens[i]
    T = len(toks)
    parts = []
    for j, k in enumerate(view.reward_names):
        if k not in shown:
            continue
        if k in view.skipped:
            parts.append(_reward_head(view, i, j, group, "(same for every response in the group: advantage 0, "
                                                         "not replayed)"))
            continue
        rel, js, ta, mv = view.relevance[i][k], view.js[i][k], view.token_adv_per_reward[i][k], view.moved(i, k)
        uni = float(view.per_reward[i, j])
        tips = [f"{t['text']!r} | reward {k} | JS {js[n]:.4f} | relevance {rel[n]:.3f} | "
                f"{m.label} advantage {ta[n]:+.4f} | {base} advantage {uni:+.4f} | moved {mv[n]:+.4f}"
                for n, t in enumerate(toks)]
        marks, note = evidence_note(view, i, k)
        parts.append(_reward_head(view, i, j, group))
        parts.append(_pair(token_row(f"{base} (uniform) {uni:+.3f}", toks, [uni] * T, "diverging", va, tips),
                           token_row(f"{view.method} β={view.beta:g}", toks, ta, "diverging", va, tips, marks)))
        rel_label = "relevance ρ" + ("" if view.measure == "js" else f" ({view.measure})")
        rel_row = token_row(rel_label, toks, rel, "sequential", vr, tips, marks, note)
        if m.tokens:
            parts.append(_pair(token_row(f"moved by {m.label}: A − Â (±{vm:.3g})", toks, mv, "diverging", vm, tips,
                                         marks), rel_row))
        else:
            parts.append(_pair(rel_row))
        oracle = _oracle_row(view, i, k, vr, note)
        if oracle:
            parts.append(_pair("<div></div>", oracle))  # under ρ, in the right column
    if combined:
        fin, ta = float(view.final[i]), view.token_adv[i]
        tips = [f"{t['text']!r} | combined | {m.label} advantage {ta[n]:+.4f} | {base} advantage {fin:+.4f}"
                for n, t in enumerate(toks)]
        parts.append('<div class="reward"><b>combined</b> (sum over rewards, batch-normalized)</div>')
        parts.append(_pair(token_row(f"{base} (uniform) {fin:+.3f}", toks, [fin] * T, "diverging", va, tips),
                           token_row(f"{view.method} β={view.beta:g}", toks, ta, "diverging", va, tips)))
    key = legend(va, vr, bool(view.evidence), vm if m.tokens else None, None if vmax is not None else scale)
    return f'<div class="mrtpo">{key}{"".join(parts)}</div>'


def _oracle_row(view: TokenView, i: int, reward: str, vmax: float, note: str) -> str:
    """Under the replayed ρ, the oracle's: ρ from what the reward's checker read (Score.evidence; the ``evidence``
    measure), so the two can be compared token by token; "" without evidence, for the whole response, or when the
    view's measure is the oracle itself.  ``note``: the replayed ρ's AUROC against it."""
    if not view.evidence or view.measure == ORACLE or view.evidence[i].get(reward) is None:
        return ""
    toks = view.tokens[i]
    rel = oracle_relevance([(t["start"], t["end"]) for t in toks], view.texts[i], view.evidence[i][reward])
    tips = [f"{t['text']!r} | reward {reward} | oracle relevance {rel[n]:.3f} (the checker read it: "
            f"{'yes' if rel[n] > 1 else 'no'})" for n, t in enumerate(toks)]
    return token_row("evidence (oracle) ρ", toks, rel, "sequential", vmax, tips,
                     note="ρ above vs this: " + note if note.startswith("AUROC") else note)


def rewards_table(view: TokenView, group: ScoredGroup | None = None) -> str:
    head = "".join(f"<th>{html.escape(k)}</th><th>Â {html.escape(k)}</th>" for k in view.reward_names)
    rows = []
    for i in range(len(view.texts)):
        cells = "".join(f"<td>{view.rewards[i, j]:.3g}</td><td>{view.per_reward[i, j]:+.3f}</td>"
                        for j in range(len(view.reward_names)))
        rows.append(f"<tr><td>{i}</td>{cells}<td>{view.final[i]:+.3f}</td></tr>")
    return f'<table><tr><th>#</th>{head}<th>advantage</th></tr>{"".join(rows)}</table>'


def faithfulness_html(view: TokenView) -> str:
    """The group's faithfulness table (:func:`mrtpo.views.faithfulness_table`) as HTML; '' without evidence."""
    rows = faithfulness_table(view)
    if not rows:
        return ""
    cols = list(rows[0])
    fmt = lambda v: "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else html.escape(str(v)))  # noqa: E731
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{fmt(r[c])}</td>" for c in cols) + "</tr>" for r in rows)
    return (f"<h3>Faithfulness of relevance ({html.escape(view.measure)}) to the verifiers' evidence</h3>"
            f"<table><tr>{head}</tr>{body}</table>")


def page_html(view: TokenView, group: ScoredGroup | None = None, title: str = "mrtpo explain",
              scale: str = "response") -> str:
    """A self-contained HTML page: the settings, the rewards table, the faithfulness table, then every response's
    heatmaps (:func:`response_html`, colors per ``scale``: "response" or "group"), each reward with its reason and
    verifier information when ``group`` is given. Every text in it is escaped."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    body = [f"<h2>{html.escape(title)}</h2>"]
    if group is not None:
        body.append(f"<p><b>Example</b> {html.escape(group.example.id)}</p><pre style='white-space:pre-wrap;"
                    f"background:#f6f6f6;padding:6px'>{html.escape(group.prompt)}</pre>")
    body.append(f"<p>Method <b>{html.escape(view.method)}</b>, β = {view.beta:g}, relevance measure "
                f"<b>{html.escape(view.measure)}</b>; colors {html.escape(SCALES[scale])} (limits in each legend).</p>")
    if view.skipped:
        body.append("<p>Constant in this group (advantage 0 for every response, not replayed): "
                    f"<b>{html.escape(', '.join(view.skipped))}</b>.</p>")
    body.append(rewards_table(view, group))
    body.append(faithfulness_html(view))
    for i in range(len(view.texts)):
        body.append(f"<h3>Response {i} — advantage {view.final[i]:+.3f}</h3>")
        body.append(response_html(view, i, scale=scale, group=group))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body class='mrtpo'>{''.join(body)}</body></html>")


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
        jb, ja = before.js.get(k, np.zeros(T)), after.js.get(k, np.zeros(T))
        diff = ra - rb
        vd = float(np.abs(diff).max()) if T else 0.0
        tips = [f"{t['text']!r} | {k} | before: JS {jb[n]:.4f}, ρ {rb[n]:.3f} | after: JS {ja[n]:.4f}, "
                f"ρ {ra[n]:.3f} | Δρ {diff[n]:+.3f}" for n, t in enumerate(toks)]
        rows.append(f'<div class="reward"><b>{html.escape(k)}</b></div>')
        rows.append(token_row("ρ before", toks, rb, "sequential", vmax, tips))
        rows.append(token_row("ρ after", toks, ra, "sequential", vmax, tips))
        rows.append(token_row(f"Δρ (±{vd:.3g})", toks, diff, "diverging", vd or 1.0, tips))
    return (f"<div class='mrtpo'><div class='legend'>relevance: orange (0 … {vmax:.3g}); Δρ = after − before: "
            f"blue up, red down</div>{''.join(rows)}</div>")


def stored_sample_html(view: TokenView, i: int, row: dict) -> str:
    """Heatmaps of response ``i`` of a stored training step, as Explore shows a sampled one: per reward, the
    estimator's uniform advantage Â_ik / scale (the whole response one color), the method's token row A'_ikt and
    the stored relevance ρ; then the combined advantage (uniform vs the trainer's token advantages).

    view: :func:`mrtpo.views.stored_step_view` of the step; row: the stored row of response ``i``
    (``Store.samples``), for its rewards, reasons and which rewards were replayed.  Colors are scaled per response
    (the largest |advantage| and ρ of this response), so a small advantage is still visible; the legend gives the
    limits.  A response-level method, or a reward not replayed (constant in its group), has no token row."""
    toks = view.tokens[i]
    T = len(toks)
    base = parse_method(view.method).estimator_label
    tokens_method = parse_method(view.method).tokens
    names = [k for k in view.reward_names if k in row["rewards"]]
    replayed = set(row.get("relevance", {}))
    lim = limits(view, "response", i, rewards=names)
    va, vr = lim.adv, max(lim.rel, 1.0)
    parts = [legend(va, vr)]
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
    return f"<div class='mrtpo'>{token_row(label, tokens, onehot, 'sequential', 1.0, tips)}</div>"


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
            token_row(f"Δρ (±{vdiff:.3g})", toks, d, "diverging", vdiff or 1.0, tips)]
    return (f"<div class='mrtpo'><div class='legend'>relevance ρ: orange (0 … {vmax:.3g}, mean 1); Δρ = step {step}"
            f" − step 0: blue up, red down</div>{''.join(rows)}</div>")
