"""The exported HTML page (``mrtpo explain --html``, ``mrtpo rollouts --html``, the app's "Download HTML page"): one
self-contained file (no CDN, no other file), overview first for long responses.

A response of at most :data:`mrtpo.display.overview.LONG_TOKENS` tokens is drawn in full
(:func:`mrtpo.display.render.response_html`).  A longer one shows its overview
(:func:`mrtpo.display.overview.overview_html`: per reward a strip and the hottest spans); its numbers are stored once
per token in a JSON block of the page (:func:`response_data`), and the page's small inline script
(:data:`mrtpo.display.page_script.SCRIPT`) draws one response × one reward in full when a hottest span or an "open in
full" button is clicked, as :func:`mrtpo.display.overview.full_html` draws it (the same cells, colors, tooltips,
evidence underline and outlined hottest spans).  Every tooltip is the CSS rule of :mod:`mrtpo.display.render` over the
cells' ``data-tip``.  So 8 responses × 2,000 tokens × 3 rewards make a page of about 2–3 MB instead of the ~40 MB
of every row drawn with a ``title`` per token.
"""
from __future__ import annotations

import html
import json
import math
from typing import Sequence

import numpy as np

from mrtpo.core.advantages import parse_method
from mrtpo.display import overview as O
from mrtpo.display import render
from mrtpo.display.notes import floor_html
from mrtpo.display.page_script import SCRIPT
from mrtpo.display.token_view import TokenView
from mrtpo.groups import ScoredGroup

PAGE_CSS = """
.mrtpo .open{cursor:pointer}
.mrtpo .hs.open:hover{background:#f3eef7}
.mrtpo button.open,.mrtpo button.close{font-size:11px;margin:2px 0;padding:0 6px;cursor:pointer}
.mrtpo .fullbox:not(:empty){border:1px solid #ddd;border-radius:4px;padding:4px 8px;margin:4px 0 12px 0}
.mrtpo .fullhead{font-size:13px;font-weight:600;margin:2px 0}
.mrtpo-js .mrtpo [data-tip]:hover::after{display:none}
.mrtpo-tip{position:fixed;z-index:99;display:none;background:#222;color:#fff;pointer-events:none;
 font:11px/1.45 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;max-width:560px;padding:3px 7px;
 border-radius:3px}
.mrtpo .flash{animation:flash 1.5s}
@keyframes flash{from{background:#f0a}to{background:transparent}}
"""


def _num(x: float, digits: int = 9) -> float | None:
    """A number for the page's JSON: ``digits`` significant digits (9: a float32 exactly, so the script shows the
    digits the library shows); None (null) for NaN or ±inf."""
    x = float(x)
    return float(f"{x:.{digits}g}") if math.isfinite(x) else None


def _nums(a, decimals: int | None = None) -> list[float | None]:
    """:func:`_num` of each; ``decimals``: rounded to as many decimals instead (a number only the tooltips show,
    with that many)."""
    if decimals is not None:
        return [round(float(x), decimals) if math.isfinite(x) else None for x in np.asarray(a, dtype=float)]
    return [_num(x) for x in np.asarray(a, dtype=float)]


def _runs(marks: Sequence[bool] | None) -> list[list[int]] | None:
    """[start, end) token ranges where ``marks`` is True (None stays None)."""
    if marks is None:
        return None
    out, start = [], None
    for t, m in enumerate(list(marks) + [False]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            out.append([start, t])
            start = None
    return out


def response_data(view: TokenView, i: int, scale: str = "response", vmax: tuple[float, float] | None = None,
                  group: ScoredGroup | None = None) -> dict:
    """What the page's script needs to draw response ``i`` × any reward in full: the tokens' texts and cells, per
    token every number the tooltips show (each once: ρ, JS, A'_ikt per reward, A_it), the color limits, the
    evidence, the oracle's ρ, the hottest spans, and the labels and heads as :func:`mrtpo.display.overview.full_html`
    writes them."""
    lim = O._lim(view, i, scale, vmax)
    m = parse_method(view.method)
    toks = view.tokens[i]
    groups = render.token_cells(toks)
    split = any(len(c) > 1 for c in groups)
    d = {"text": [t["text"] for t in toks], "n": [len(c) for c in groups] if split else None,
         "lim": [lim.adv, lim.moved, lim.rel], "method": m.label, "base": m.estimator_label, "tokens": m.tokens,
         "label": f"{view.method} β={view.beta:g}", "moved_label": f"moved by {m.label}: A − Â (±{lim.moved:.3g})",
         "rel_label": "relevance ρ" + ("" if view.measure == "js" else f" ({view.measure})"),
         "legend": render.legend(lim.adv, lim.rel, bool(view.evidence), lim.moved if m.tokens else None,
                                 None if vmax is not None else scale, split) + floor_html(view, i),
         "final": _num(view.final[i]), "comb": _nums(view.token_adv[i]),
         "chip": O.chip(float(view.final[i]), lim.adv), "rewards": {}}
    for j, k in enumerate(view.reward_names):
        if k in view.skipped:
            d["rewards"][k] = {"skipped": True, "head": render.reward_head(
                view, i, j, group, "(same for every response in the group: advantage 0, not replayed)")}
            continue
        marks, note = render.evidence_note(view, i, k)
        oracle = render.oracle_values(view, i, k)
        uni = float(view.per_reward[i, j])
        d["rewards"][k] = {"head": render.reward_head(view, i, j, group), "uni": _num(uni),
                           "chip": O.chip(uni, lim.adv), "a": _nums(view.token_adv_per_reward[i][k]),
                           "rho": _nums(view.relevance[i][k]),
                           "js": None if k not in view.js[i] else _nums(view.js[i][k], 4), "ev": _runs(marks),
                           "note": note, "oracle": None if oracle is None else _nums(oracle),
                           "onote": render.oracle_note(note),
                           "hot": [list(h.cells) for h in O.hot_spans(view, i, k)]}
    return d


def _json_block(data: dict, g: int) -> str:
    """``data`` as a JSON block the script reads (``</`` escaped, so no text in it ends the block)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="mrtpo-data-{g}">{text}</script>'


def group_html(view: TokenView, group: ScoredGroup | None = None, scale: str = "response",
               vmax: tuple[float, float] | None = None, titles: Sequence[str] | None = None, g: int = 0) -> str:
    """The responses of one group (the ``g``-th of its page): under each title (default "Response i — advantage
    A_i"), a short response in full, a long one's overview and the box its full view is drawn into; then the long
    ones' numbers (:func:`response_data`)."""
    body, data = [], {}
    for i in range(len(view.texts)):
        t = titles[i] if titles is not None else f"Response {i} — advantage {view.final[i]:+.3f}"
        body.append(f"<h3>{html.escape(t)}</h3>")
        if not O.is_long(view, i):
            body.append(render.response_html(view, i, vmax=vmax, scale=scale, group=group))
            continue
        body.append(O.overview_html(view, i, scale, vmax, link=f'data-g="{g}" data-r="{i}"'))
        body.append(f'<div class="mrtpo fullbox" id="full-{g}-{i}"></div>')
        data[str(i)] = response_data(view, i, scale, vmax, group)
    if data:
        body.append(_json_block(data, g))
    return "".join(body)


def document(title: str, body: Sequence[str]) -> str:
    """The page: ``body`` under the title, the CSS, and the script where some response is drawn overview first."""
    text = "".join(body)
    script = ("<noscript><p>The long responses above are drawn in full by this page's script; allow scripts to open "
              f"them (the overviews need none).</p></noscript><script>{SCRIPT}</script>"
              if 'class="mrtpo fullbox"' in text else "")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{O.CSS}{PAGE_CSS}</style></head><body class='mrtpo'>{text}{script}</body></html>")


def page_html(view: TokenView, group: ScoredGroup | None = None, title: str = "mrtpo explain",
              scale: str = "response") -> str:
    """A self-contained HTML page: the settings, the rewards table, the faithfulness table, then every response
    (:func:`group_html`: short ones in full, long ones overview first; colors per ``scale``: "response" or
    "group"), each reward with its reason and verifier information when ``group`` is given. Every text in it is
    escaped."""
    if scale not in render.SCALES:
        raise ValueError(f"scale must be one of {', '.join(render.SCALES)}, got {scale!r}")
    body = [f"<h2>{html.escape(title)}</h2>"]
    if group is not None:
        body.append(f"<p><b>Example</b> {html.escape(group.example.id)}</p><pre style='white-space:pre-wrap;"
                    f"background:#f6f6f6;padding:6px'>{html.escape(group.prompt)}</pre>")
    body.append(f"<p>Method <b>{html.escape(view.method)}</b>, β = {view.beta:g}, relevance measure "
                f"<b>{html.escape(view.measure)}</b>; colors {html.escape(render.SCALES[scale])} (limits in each "
                "legend).</p>")
    if O.is_long(view):
        body.append(f"<p>Responses longer than {O.LONG_TOKENS} tokens show an overview first: click a hottest span "
                    "or <i>open in full</i> to draw that response × reward in full.</p>")
    if view.skipped:
        body.append("<p>Constant in this group (advantage 0 for every response, not replayed): "
                    f"<b>{html.escape(', '.join(view.skipped))}</b>.</p>")
    body.append(render.rewards_table(view, group))
    body.append(render.faithfulness_html(view))
    body.append(group_html(view, group, scale))
    return document(title, body)
