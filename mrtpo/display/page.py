"""The exported HTML page (``mrtpo explain --html``, ``mrtpo rollouts --html``, the app's "Download HTML page"): one
self-contained file (no CDN, no other file), overview first for long responses, and never more than
:data:`PAGE_BUDGET` bytes whatever its input.

A response of at most :data:`mrtpo.display.overview.LONG_TOKENS` tokens is drawn in full
(:func:`mrtpo.display.render.response_html`).  A longer one shows its overview
(:func:`mrtpo.display.overview.overview_html`: per reward a strip and the hottest spans); its numbers are stored once
per token in a JSON block of the page (:func:`response_data`), and the page's small inline script
(:data:`mrtpo.display.page_script.SCRIPT`) draws one response × one reward in full when a hottest span or an "open in
full" button is clicked, as :func:`mrtpo.display.overview.full_html` draws it (the same cells, colors, tooltips,
evidence underline and outlined hottest spans).  Every tooltip is the CSS rule of :mod:`mrtpo.display.render` over the
cells' ``data-tip``.  So 8 responses × 2,000 tokens × 3 rewards make a page of about 2–3 MB instead of the ~40 MB
of every row drawn with a ``title`` per token.

Each response's length alone does not bound a page: drawn in full, a response costs a few hundred bytes per token
and row, so many responses each under the threshold add up without limit.  So the page is laid out by its total
(:func:`layout`): each response is drawn at one of :data:`LEVELS` — its title only, a compact overview (strips of
:data:`COMPACT_BINS` marks, no spans listed), that overview with its numbers to open it in full on the page, the whole
overview with its numbers, in full — starting from the title and raised level by level, response by response in
order, while the page stays within :data:`PAGE_BUDGET`, never past the response's own level (in full when short, the
whole overview when long).  A page within the budget is therefore exactly what it was without one; a larger one says
what it could not draw in full and where every number is (``rest``: the JSON).  Only the tables and titles (a row per
response) are outside the budget.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mrtpo.display import overview as O
from mrtpo.display import render
from mrtpo.display.notes import floor_html
from mrtpo.display.page_script import SCRIPT
from mrtpo.display.token_view import TokenView
from mrtpo.groups import ScoredGroup
from mrtpo.wording import plural

PAGE_BUDGET = 10_000_000  # bytes: the most a page holds, whatever its input (its tables and titles aside)
COMPACT_BINS = 40  # marks per strip of a compact overview
LINE, COMPACT, COMPACT_OPEN, OPEN, FULL = range(5)  # how a response is drawn, least first (module docstring)
LEVELS = {FULL: "in full", OPEN: "open in full from their overview",
          COMPACT_OPEN: "open in full from a compact overview", COMPACT: "as a compact overview only",
          LINE: "as their title only"}
REST = "every number is in the JSON (explain --json, rollouts --output, the app's JSON download)"
NOSCRIPT = ("<noscript><p>The responses above shown as an overview are drawn in full by this page's script; allow "
            "scripts to open them (the overviews need none).</p></noscript>")

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
    m = view.parsed
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


def _json_block(text: str, g: int) -> str:
    """JSON ``text`` as a block the script reads (``</`` escaped, so no text in it ends the block)."""
    text = text.replace("</", "<\\/")
    return f'<script type="application/json" id="mrtpo-data-{g}">{text}</script>'


@dataclass
class Section:
    """One group of a page: the HTML before its responses (heading, prompt, tables), its view, and how its responses
    are drawn (``group``: reasons and verifier information; ``vmax``: color limits shared by the group; ``titles``:
    default "Response i — advantage A_i")."""

    head: str
    view: TokenView
    group: ScoredGroup | None = None
    vmax: tuple[float, float] | None = None
    titles: Sequence[str] | None = None

    def title(self, i: int) -> str:
        v = self.view
        return self.titles[i] if self.titles is not None else f"Response {i} — advantage {v.final[i]:+.3f}"

    def top(self, i: int) -> int:
        """The most response ``i`` is drawn: in full when short, else open in full from its overview."""
        return OPEN if O.is_long(self.view, i) else FULL


@dataclass
class Page:
    """A laid-out page: its HTML, and per section and response the level it is drawn at (:data:`LEVELS`)."""

    html: str
    levels: list[list[int]]
    tops: list[list[int]]  # the level each would have without the budget (Section.top)
    budget: int = PAGE_BUDGET
    rest: str = REST  # where the numbers of the responses not drawn in full are

    @property
    def complete(self) -> bool:
        """Whether every response is drawn as it would be without the budget."""
        return self.levels == self.tops

    def counts(self) -> dict[int, int]:
        """{level: responses drawn at it}, the most first."""
        flat = [lv for lv_s in self.levels for lv in lv_s]
        return {lv: flat.count(lv) for lv in sorted(set(flat), reverse=True)}

    def summary(self) -> str:
        """``of 256 responses, 119 open in full from a compact overview, 137 as a compact overview only``."""
        n = sum(map(len, self.levels))
        return f"of {plural(n, 'response')}, " + ", ".join(f"{c:,} {LEVELS[lv]}" for lv, c in self.counts().items())

    @property
    def note(self) -> str:
        """What an incomplete page says of itself (after "This page"; the CLI after its file name)."""
        return (f"holds at most {self.budget / 1e6:g} MB, so not every response is drawn in full: {self.summary()}; "
                f"for the others, {self.rest}")


def _draw(sec: Section, g: int, i: int, level: int, scale: str, why: str, memo: dict) -> tuple[str, str | None]:
    """Response ``i`` of section ``g`` at ``level``: its HTML, and its numbers as JSON text (OPEN) for the page's
    script (kept in ``memo``: the same for both levels that open in full); ``why``: the note under a response drawn
    less than open in full."""
    head = f"<h3>{html.escape(sec.title(i))}</h3>"
    v = sec.view
    if level == FULL:
        return head + render.response_html(v, i, vmax=sec.vmax, scale=scale, group=sec.group), None
    if level in (OPEN, COMPACT_OPEN):
        bins = O.STRIP_BINS if level == OPEN else COMPACT_BINS
        body = (O.overview_html(v, i, scale, sec.vmax, link=f'data-g="{g}" data-r="{i}"', snippets=level == OPEN,
                                n_bins=bins) + f'<div class="mrtpo fullbox" id="full-{g}-{i}"></div>')
        if (g, i) not in memo:
            memo[(g, i)] = json.dumps(response_data(v, i, scale, sec.vmax, sec.group), ensure_ascii=False,
                                      allow_nan=False, separators=(",", ":"))
        return head + body, memo[(g, i)]
    why = f'<p class="why budget">{html.escape(why)}</p>'
    if level == COMPACT:
        return head + O.overview_html(v, i, scale, sec.vmax, snippets=False, n_bins=COMPACT_BINS) + why, None
    return head + why, None


def _size(part: tuple[str, str | None]) -> int:
    """Bytes a drawn response adds to the page (its JSON entry and its key included)."""
    return len(part[0].encode()) + (0 if part[1] is None else len(part[1].encode()) + 12)


def _levels(sections: Sequence[Section], room: int, scale: str, why: str, progress=None):
    """Each response's level and drawing within ``room`` bytes: every response first as its title (LINE), then, level
    by level, each response in order raised to the next level (up to its top) while the page stays within ``room``;
    a level stops at the first response that does not fit, so the first responses are the ones drawn more."""
    todo = [(g, i) for g, sec in enumerate(sections) for i in range(len(sec.view.texts))]
    memo: dict = {}
    drawn = {(g, i): (LINE, _draw(sections[g], g, i, LINE, scale, why, memo)) for g, i in todo}
    used = sum(_size(p) for _, p in drawn.values())
    total, done = 4 * len(todo), 0
    for level in (COMPACT, COMPACT_OPEN, OPEN, FULL):
        for n, (g, i) in enumerate(todo):
            if sections[g].top(i) < level:
                continue
            part = _draw(sections[g], g, i, level, scale, why, memo)
            grown = used - _size(drawn[(g, i)][1]) + _size(part)
            if grown > room:
                break
            drawn[(g, i)], used = (level, part), grown
            if progress is not None:
                progress(done + n + 1, total)
        done += len(todo)
        if progress is not None:
            progress(done, total)
    return drawn


def layout(title: str, top: Sequence[str], sections: Sequence[Section], scale: str = "response",
           budget: int | None = None, rest: str = REST, progress=None) -> Page:
    """The page: ``top`` (HTML under the title), then each section's head and its responses, drawn as much as the
    page's ``budget`` (bytes; default :data:`PAGE_BUDGET`) allows (:func:`_levels`); a note under ``top`` says what
    is not drawn in full and ``rest``, where the rest is.  ``progress(done, total)``: per response drawn."""
    if scale not in render.SCALES:
        raise ValueError(f"scale must be one of {', '.join(render.SCALES)}, got {scale!r}")
    budget = PAGE_BUDGET if budget is None else budget
    fixed = (len(document(title, []).encode()) + len(SCRIPT.encode()) + len(NOSCRIPT.encode()) + 1_000
             + 2 * len(rest.encode()) + sum(len(t.encode()) for t in top)
             + sum(len(s.head.encode()) + 80 for s in sections))
    why = f"Not drawn in full here (this page holds at most {budget / 1e6:g} MB): {rest}."
    drawn = _levels(sections, budget - fixed, scale, why, progress)
    levels = [[drawn[(g, i)][0] for i in range(len(s.view.texts))] for g, s in enumerate(sections)]
    tops = [[s.top(i) for i in range(len(s.view.texts))] for s in sections]
    page = Page("", levels, tops, budget, rest)
    body = list(top)
    if not page.complete:
        body.append(f'<p class="why budget">This page {html.escape(page.note)}.</p>')
    for g, sec in enumerate(sections):
        body.append(sec.head)
        data = []
        for i in range(len(sec.view.texts)):
            part = drawn[(g, i)][1]
            body.append(part[0])
            if part[1] is not None:
                data.append(f'"{i}":{part[1]}')
        if data:
            body.append(_json_block("{" + ",".join(data) + "}", g))
    page.html = document(title, body)
    return page


def document(title: str, body: Sequence[str]) -> str:
    """The page: ``body`` under the title, the CSS, and the script where some response is drawn overview first."""
    text = "".join(body)
    script = f"{NOSCRIPT}<script>{SCRIPT}</script>" if 'class="mrtpo fullbox"' in text else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{O.CSS}{PAGE_CSS}</style></head><body class='mrtpo'>{text}{script}</body></html>")


def page_layout(view: TokenView, group: ScoredGroup | None = None, title: str = "mrtpo explain",
                scale: str = "response", budget: int | None = None, rest: str = REST, progress=None) -> Page:
    """A self-contained HTML page of one group (:func:`layout`): the settings, the rewards table, the faithfulness
    table, then every response (short ones in full, long ones overview first, as much as the ``budget`` allows;
    colors per ``scale``: "response" or "group"), each reward with its reason and verifier information when
    ``group`` is given. Every text in it is escaped."""
    top = [f"<h2>{html.escape(title)}</h2>"]
    if group is not None:
        top.append(f"<p><b>Example</b> {html.escape(group.example.id)}</p><pre style='white-space:pre-wrap;"
                   f"background:#f6f6f6;padding:6px'>{html.escape(group.prompt)}</pre>")
    top.append(f"<p>Method <b>{html.escape(view.method)}</b>, β = {view.beta:g}, relevance measure "
               f"<b>{html.escape(view.measure)}</b>; colors {html.escape(render.SCALES.get(scale, scale))} (limits "
               "in each legend).</p>")
    if O.is_long(view):
        top.append(f"<p>Responses longer than {O.LONG_TOKENS} tokens show an overview first: click a hottest span "
                   "or <i>open in full</i> to draw that response × reward in full.</p>")
    if view.skipped:
        top.append("<p>Constant in this group (advantage 0 for every response, not replayed): "
                   f"<b>{html.escape(', '.join(view.skipped))}</b>.</p>")
    head = render.rewards_table(view, group) + render.faithfulness_html(view)
    return layout(title, top, [Section(head, view, group)], scale, budget, rest, progress)


def page_html(view: TokenView, group: ScoredGroup | None = None, title: str = "mrtpo explain",
              scale: str = "response", budget: int | None = None, rest: str = REST, progress=None) -> str:
    """:func:`page_layout`'s HTML."""
    return page_layout(view, group, title, scale, budget, rest, progress).html
