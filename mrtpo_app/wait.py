"""The wait in the app: before heavy work its estimate and, above the threshold, a question
(:func:`ask_first`: "This will take about 3 min (…): Continue / Cancel"); during it a progress bar with the time left
(:class:`Work`), a Cancel button (:func:`working`) and each response's result as it is ready (:func:`show_samples`,
:func:`show_part`); after a stop, a notice (:func:`stopped_notice`).

**How a Cancel stops the work.** A click in the browser while a script runs asks Streamlit for a rerun, and the
running script raises Streamlit's RerunException at its next ``st`` call.  The library calls :class:`Work` after every
decoding step, forward pass and chunk of the vocabulary side, and :class:`Work` calls ``st.progress`` at most every
:data:`SHOW_S` seconds: the work stops there, within one pass (a pass is bounded by the replay's token budget).  The
exception unwinds the computation: the model's turn is released and nothing is cached (:mod:`mrtpo_app.work`: a
session waiting for the same result computes it itself); a stop changes nothing of the model (its frozen weights
and their cast copies are only read).  The threshold is :data:`mrtpo.replay.estimate.ASK_ABOVE_S` (60 s;
``$MRTPO_ASK_ABOVE_S``).

Nothing here imports torch at import time (Explore's first render does not wait for it).
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from typing import Any, Callable, Iterator

import streamlit as st

from mrtpo_app.ui import md, short

SHOW_S = 0.25  # a progress bar is redrawn at most this often (each redraw is where a Cancel lands)
PART_S = 15.0  # a replay estimated longer than this runs in parts of about PART_S / 1.5 seconds, each shown as ready
LONG = 300  # a ready response longer than this (tokens) is shown by its hottest tokens, not in full


def ask_first(key: str, ident: Any, want: bool, make_estimate: Callable[[], Any], force: str = "") -> bool:
    """Whether work that is wanted now (``want``: its button was clicked, or the page needs it) may start in this run.

    Its estimate (``make_estimate()``: an :class:`mrtpo.replay.estimate.Estimate`, or None when nothing needs
    computing) at or below the threshold: yes.  Above it (or ``force``, a reason to ask anyway): the question
    "This will take about … : Continue / Cancel" is shown, and the work starts in the run where Continue is clicked.
    ``ident`` names what was estimated: a question about other inputs is dropped.  Session keys ``{key}_ask``,
    ``{key}_continue``, ``{key}_cancel``."""
    ss, pend = st.session_state, f"{key}_ask"
    ident = json.dumps(ident, sort_keys=True, default=str)
    if want:
        try:
            est = make_estimate()
        except Exception:  # noqa: BLE001 - an estimate never stops the work (which reports the problem itself)
            est = None
        if not force and (est is None or not est.above()):
            ss.pop(pend, None)
            return True
        text = f"This will take {est.text()}." if est is not None else ""
        ss[pend] = {"ident": ident, "text": " ".join(t for t in (force, text) if t)}
    asked = ss.get(pend)
    if asked is None or asked["ident"] != ident:
        ss.pop(pend, None)
        return False
    slot = st.empty()
    box = slot.container(border=True)
    box.warning(asked["text"] + " Continue?", icon=":material/hourglass_top:")
    c1, c2, _ = box.columns([1, 1, 4])
    go = c1.button("Continue", key=f"{key}_continue", type="primary")
    stop = c2.button("Cancel", key=f"{key}_cancel")
    if go or stop:
        ss.pop(pend, None)
        slot.empty()
    if stop:
        st.info("Cancelled: nothing was run.", icon=":material/block:")
    return go


class Work:
    """A progress callback ``(done, total)`` for the library (:func:`mrtpo.model.sample`,
    :func:`mrtpo.replay.replay_group`): ``bar`` (an ``st.progress``) from ``lo`` to ``hi`` with the text
    ``what: 37 % · 1 min 10 s left``, redrawn at most every :data:`SHOW_S` seconds and when done."""

    def __init__(self, bar, what: str, lo: float = 0.0, hi: float = 1.0):
        self.bar, self.what, self.lo, self.hi = bar, what, lo, hi
        self.t0, self.last, self.calls = time.perf_counter(), -math.inf, 0

    def __call__(self, done: float, total: float) -> None:
        self.calls += 1
        now = time.perf_counter()
        f = min(max(done / total, 0.0), 1.0) if total > 0 else 1.0
        if f < 1.0 and now - self.last < SHOW_S:
            return
        self.last = now
        from mrtpo.replay.estimate import eta_text

        self.show(self.lo + (self.hi - self.lo) * f, f"{self.what}: {eta_text(f, now - self.t0)}")

    def show(self, value: float, text: str) -> None:
        """The redraw (and so the point where Streamlit stops a cancelled script)."""
        self.bar.progress(min(max(value, 0.0), 1.0), text=text)


@contextlib.contextmanager
def working(key: str, what: str, where=None) -> Iterator[None]:
    """A Cancel button in ``where`` (default: the page) while the block runs, and ``{key}_working`` = ``what`` in the
    session: a block that ends, normally or with an error, clears both; a block that Streamlit stopped (the Cancel,
    or another click) leaves the mark, so the next run says so (:func:`stopped_notice`). Call :func:`finished`
    before an ``st.stop()`` of your own inside the block."""
    st.session_state[f"{key}_working"] = what
    slot = (where or st).empty()
    slot.button("Cancel", key=f"{key}_stop", icon=":material/stop_circle:",
                help="Stops the work within a few seconds; nothing is kept, and the model goes to the next job.")
    try:
        yield
    except Exception:
        finished(key)
        slot.empty()
        raise
    except BaseException:  # Streamlit's stop: a Cancel leaves the mark; an st.stop() after finished() does not
        if f"{key}_working" not in st.session_state:
            slot.empty()
        raise
    finished(key)
    slot.empty()


def finished(key: str) -> None:
    st.session_state.pop(f"{key}_working", None)


def stopped_notice(key: str) -> bool:
    """After a run whose work was stopped (:func:`working`): say so, once; whether it was."""
    what = st.session_state.pop(f"{key}_working", None)
    if what is None:
        return False
    st.info(f"Cancelled: {what} stopped before it finished. Nothing was kept, and the model went on to the next "
            "job.", icon=":material/cancel:")
    return True


def parts_for(est, G: int) -> int:
    """How many parts a replay estimated at ``est`` runs in: 1 up to :data:`PART_S` seconds, else enough for about
    PART_S / 1.5 seconds each (at most one per response)."""
    if est is None or est.seconds <= PART_S or G <= 1:
        return 1
    return max(1, min(G, math.ceil(est.seconds / max(PART_S / 1.5, 1e-9))))


def show_samples(samples, where=None) -> None:
    """Each sampled response's start, as soon as sampling ends (before its replay)."""
    (where or st).markdown("\n".join(f"{i}. {md(short(s.text, 110)) or '*(empty)*'} — {len(s.token_ids)} tokens"
                                     for i, s in enumerate(samples)))


def show_part(where, label: Callable[[int], str] = lambda i: f"#{i}") -> Callable:
    """``on_part(indices, replay of those responses)`` for :func:`mrtpo.replay.replay_group`: each response's
    relevance ρ per replayed reward in ``where`` as soon as its part is replayed (a response longer than :data:`LONG`
    tokens: its five hottest tokens per reward)."""
    from mrtpo.display import render

    def on_part(idx: list[int], rep) -> None:
        for i, rr in zip(idx, rep.responses):
            if len(rr.token_ids) > LONG or not rep.rewards:
                hot = "; ".join(f"{md(k)}: " + ", ".join(
                    f"“{md(rr.text[a:b])}” {rr.relevance[k][t]:.2f}" for t, (a, b) in
                    sorted(enumerate(rr.offsets), key=lambda x: -float(rr.relevance[k][x[0]]))[:5])
                    for k in rep.rewards)
                where.markdown(f"**{md(label(i))}** ready ({len(rr.token_ids)} tokens) — highest ρ: {hot or 'none'}")
                continue
            toks = rr.tokens()
            rows = [render.token_row(f"ρ {k}", toks, rr.relevance[k], "sequential",
                                     max(float(rr.relevance[k].max(initial=0)), 1e-9),
                                     [f"ρ {r:.3f} · d {d:.4f}" for r, d in zip(rr.relevance[k], rr.js[k])])
                    for k in rep.rewards]
            where.markdown(f"**{md(label(i))}** ready ({len(rr.token_ids)} tokens)")
            where.html(f"<style>{render.CSS}</style><div class='mrtpo'>{''.join(rows)}</div>")

    return on_part


def replay_page(key: str, ch, group, template: dict, label: Callable[[int], str] = lambda i: f"#{i}"):
    """A page's replay of a scored group (Your rollouts' upload; constant rewards skipped): at once when the caches
    hold it; else its exact estimate and, above the threshold or after a Cancel, the question (the page stops until
    Continue); then the replay with the time left, a Cancel and each response as it is ready (``label(i)`` names
    response i).  What :func:`mrtpo_app.caches.replay_cached` returns for the group."""
    from mrtpo_app import caches, models

    args = (ch.model, ch.device, group.prompt, group.verifier_info, [s.token_ids for s in group.samples], template,
            group.rewards.tolist())
    if caches.replay_cached.has(*args):
        return caches.replay_cached(*args)
    stopped = stopped_notice(key)
    lm = models.get_model(ch.model, ch.device)
    est = []

    def estimate():
        from mrtpo.replay import ReplayConfig
        from mrtpo.replay.estimate import estimate_scored
        from mrtpo.templates import Template

        est.append(estimate_scored(lm, [group], Template.from_dict(template), True,
                                   ReplayConfig(precision=caches.PRECISION)))
        return est[-1]

    if not ask_first(key, args, True, estimate, force="The last replay was cancelled." if stopped else ""):
        st.stop()
    parts = parts_for(est[-1] if est else None, len(group.samples))
    with st.status("Replaying the group under P_all and each P_\\k…", expanded=True) as status, \
            working(key, "the replay"):
        bar = st.progress(0.0, text="replaying")
        rep = caches.replay_cached(*args, progress=Work(bar, "replaying under P_all and each P_\\k"), parts=parts,
                                   on_part=show_part(st.container(), label) if parts > 1 else None)
        status.update(label=f"Replayed the group ({rep.seconds:.1f} s)", state="complete", expanded=False)
    return rep
