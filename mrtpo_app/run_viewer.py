"""The run viewer of the Your rollouts page: follow a training run's log (mrtpo's credit log, OpenRLHF's board JSONL,
prime-rl's token export, TRL's completions parquet, verl's dumps; :mod:`mrtpo.integrations.run_follow`) while it
trains.  Only its Streamlit glue is here, not in ``mrtpo/creditlog/`` with the log's other pieces: the library never
imports Streamlit, and what the viewer shows is the library's (:mod:`mrtpo.display.log_view`,
:mod:`mrtpo.display.run_stats`, :mod:`mrtpo.creditlog`).

The follower of each (path, format) lives in the session (``rollouts_runs``), so every rerun — the Follow toggle's
timer (a fragment with ``run_every``), the Check button, any widget — reads only the steps written since the last
one; each new step's reward components are computed once (:func:`mrtpo.display.run_stats.add_step`).  What a step
shows comes from :mod:`mrtpo.display.log_view` (no model).  Session keys: ``rollouts_log`` (the path),
``rollouts_log_format``, ``rollouts_follow``, ``rollouts_step``, ``rollouts_resp_<step>``, ``rollouts_table_<step>``,
``rollouts_log_pick_<n>`` (which of a folder's credit logs).

The app reads logs only under its roots (:func:`mrtpo.creditlog.access.log_roots`: ``mrtpo app --logs-root DIR`` or
``$MRTPO_LOGS_ROOT``; by default the working folder's ``runs/`` and the run store's folder): a path typed or given as
``?log=`` that resolves outside them, a device, a FIFO, anything not a regular file or folder is refused with a
message before anything is opened, and no follower (no timer) is started for it; uploads bring other files.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import streamlit as st

from mrtpo.creditlog import CreditLogError, CreditStep
from mrtpo.creditlog.access import check_log_path, log_roots
from mrtpo.display import log_view, render
from mrtpo.display.log_tokens import token_table
from mrtpo.display.overview import is_long
from mrtpo.display.run_stats import add_step
from mrtpo.integrations.run_follow import QUIET_S, RunFollower
from mrtpo.integrations.tool_logs import FORMATS, credit_logs_in
from mrtpo_app import charts, long_view, state
from mrtpo_app.ui import guard, md, short, show_error

FOLLOW_SECONDS = 3.0  # how often the Follow toggle checks the log for new steps
PROBLEMS_SHOWN = 3  # skipped rows named in the warning (the count says how many more)
RUNS_KEY = "rollouts_runs"
FORMAT_LABELS = {"auto": "auto-detect", "credit-log": "mrtpo credit log", "board": "OpenRLHF board JSONL",
                 "prime-rl": "prime-rl token export", "trl": "TRL completions parquet", "verl": "verl JSONL dump"}


@dataclass
class FollowedRun:
    """A log being followed: its follower, the steps read so far and their reward components over steps."""

    path: str  # resolved (under the app's logs roots)
    follower: RunFollower
    steps: dict[int, CreditStep] = field(default_factory=dict)
    curves: dict = field(default_factory=dict)
    checked: float = 0.0  # unix time of the last poll

    def poll(self) -> list[int]:
        """Read the steps written since the last poll (only those); their numbers."""
        new = self.follower.poll()
        for s in new:
            self.steps[s.step] = s
            add_step(self.curves, s)
        self.checked = time.time()
        return [s.step for s in new]


def followed(real: str, fmt: str) -> FollowedRun:
    """The session's follower of the checked, resolved path ``real`` in ``fmt`` (created at the first look), reading
    only under the app's logs roots."""
    runs = st.session_state.setdefault(RUNS_KEY, {})
    key = (real, fmt)
    if key not in runs:
        runs[key] = FollowedRun(real, RunFollower(real, fmt, roots=log_roots()))
    return runs[key]


def _stick_to_newest(nums: list[int]) -> None:
    """The step picker shows the newest step, and moves on with the run, unless an older step was picked."""
    newest, seen = nums[-1], st.session_state.get("rollouts_step_newest")
    if st.session_state.get("rollouts_step") not in nums or st.session_state.get("rollouts_step") == seen:
        st.session_state["rollouts_step"] = newest
    st.session_state["rollouts_step_newest"] = newest


def _header(run: FollowedRun, new: list[int]) -> None:
    f = run.follower
    meta = f.meta or {}
    nums = sorted(run.steps)
    what = "".join(f" · {k} {md(meta[k])}" for k in ("source", "model", "task", "method", "measure") if meta.get(k))
    got = "" if not new or len(new) == len(nums) else f" · new: step{'s' * (len(new) > 1)} {', '.join(map(str, new))}"
    where = "" if str(f.path) == run.path else f" · in {md(f.path)}"  # a run folder: where it keeps its log
    st.markdown(f"**{len(nums)} step{'s' if len(nums) != 1 else ''}** ({nums[0]}–{nums[-1]}){got} · checked "
                f"{time.strftime('%H:%M:%S', time.localtime(run.checked))}  \n"
                f"{md(FORMAT_LABELS.get(f.fmt, f.fmt))}{where}{what}")
    if f.fmt == "board":
        st.caption(f"OpenRLHF's board: a step is shown once a later step is in the log (another rank may still be "
                   f"writing it), or once the log has not changed for {QUIET_S:g} s (the run has finished).")


def _problems(run: FollowedRun) -> None:
    """The rows skipped so far (they could not be read; the rest of the log is shown), the first few named."""
    probs = run.follower.problems
    if probs:
        more = len(probs) - PROBLEMS_SHOWN
        st.warning(f"**{len(probs)} row{'s' if len(probs) != 1 else ''} skipped** (they cannot be read; the rest of "
                   "the log is shown): " + "; ".join(md(p) for p in probs[:PROBLEMS_SHOWN])
                   + (f"; and {more} more" if more > 0 else ""))


def _response(step: CreditStep, i: int, meta: dict) -> None:
    """One response of the step: prompt, reference, its group's heatmaps (or its logged series), its tokens."""
    r = step.rows[i]
    rows, j = log_view.group_of(step, i)
    with st.expander("Prompt", expanded=False):
        st.text(r.prompt if r.prompt is not None else "(not in the log)")
    ref = log_view.reference(r)
    if ref is not None:
        st.markdown(f"**Reference** ({md(ref[0])})")
        st.text(ref[1])
    if log_view.has_credit(rows):
        with guard("the logged credit"):
            view, lg = long_view.memo(
                ("log_view", step.step, r.group, meta.get("method"), meta.get("measure")), (step,),
                lambda: log_view.log_view(rows, meta.get("method"), meta.get("measure") or "js"))
            if is_long(view, j):  # overview first, one reward in full
                long_view.show(view, f"rollouts_long_{step.step}_{i}", group=lg, responses=[j],
                               titles={j: log_view.title(r)})
            else:
                st.html(f"<style>{render.CSS}</style>{render.response_html(view, j, group=lg)}")
        st.caption(f"As logged (no model): per reward, {md(view.method)}'s estimator's uniform advantage Â_ik / scale "
                   "beside the token advantages A'_ikt the update used, what was moved beside the relevance ρ (1 "
                   f"where the credit was uniform); this step's β_s = {view.beta:.3g}. Colors are scaled to this "
                   "response; hover a token for its numbers.")
    elif r.n_tokens:
        body = long_view.memo(("log_series", step.step, i), (step,), lambda: log_view.series_html(r))
        st.html(f"<style>{render.CSS}</style>{body}")
        st.caption("This log has no per-reward token credit (an mrtpo credit log has it): its per-token series."
                   + ("" if r.tokens else " It holds token ids without their texts (⟨id⟩)."))
    else:
        st.markdown("**Response**")
        st.text(r.completion or "")
        st.caption("This log has no tokens: choose **Upload a file** above to replay the rows with the model and a "
                   "verifier template (`mrtpo rollouts` on the command line).")
    if r.n_tokens:
        st.markdown("**Tokens** (p = e^log-prob; A: the combined advantage; A:k, ρ:k per reward)")
        st.dataframe(pd.DataFrame(token_table(r)), hide_index=True, width="stretch", key=f"rollouts_tokens_{step.step}")


def viewer(path: str, real: str, fmt: str) -> None:
    """The viewer's body (a fragment: the Follow timer reruns only this): poll ``real`` (``path`` as typed, checked
    and resolved), then the curves and a step."""
    run = followed(real, fmt)
    c1, c2 = st.columns([6, 1])
    c2.button("Check now", key="rollouts_check", icon=":material/refresh:",
              help="read the steps written since the last check")
    try:
        new = run.poll()
    except Exception as e:  # noqa: BLE001 - a message, never a traceback; the steps read before stay shown
        show_error(e, f"reading {path}")
        if not run.steps:
            return
        new = []
    if not run.steps:
        board = (" OpenRLHF's board: a step is shown once a later one is in the log, or once the log has not "
                 f"changed for {QUIET_S:g} s.") if run.follower.fmt == "board" else ""
        c1.info(f"No complete step in **{md(path)}** yet ({md(FORMAT_LABELS.get(run.follower.fmt, run.follower.fmt))}"
                f"). Steps appear as the run writes them (Follow on, or **Check now**).{board}")
        _problems(run)
        return
    with c1:
        _header(run, new)
    _problems(run)
    meta = run.follower.meta or {}
    st.subheader("Reward components over steps")
    st.plotly_chart(charts.component_curves_chart(run.curves), key="rollouts_curves", width="stretch")
    st.caption("Per reward and step, over the logged responses: its mean; its share of zeros; the share of groups "
               "where it is constant (Â = 0: it teaches nothing there); its share of Σ|Â| over the rewards; and how "
               "concentrated its token credit is (the share of |A'| on the top 10 % of tokens; uniform credit: about "
               "0.1). A panel the log cannot give is left out.")
    nums = sorted(run.steps)
    _stick_to_newest(nums)
    st.subheader("A step's groups")
    n = st.selectbox("Step", nums, key="rollouts_step", help="the newest step, and it moves on with the run, "
                     "unless you pick an older one")
    step = run.steps[n]
    if not step.rows:
        st.info(f"Step {n}: empty step (no row of it to show: its file has none, or only rows skipped above).")
        return
    sel = st.dataframe(pd.DataFrame(log_view.step_table(step)), hide_index=True, width="stretch", on_select="rerun",
                       selection_mode="single-row", key=f"rollouts_table_{n}")
    st.session_state.setdefault(f"rollouts_resp_{n}", log_view.first_informative(step))  # a response with colors first
    state.follow_table(st.session_state, sel.selection.rows, f"rollouts_resp_{n}", f"rollouts_table_seen_{n}")
    i = st.selectbox(
        "Response (or select a row above)", list(range(len(step.rows))), key=f"rollouts_resp_{n}",
        format_func=lambda k: f"{log_view.title(step.rows[k])} — {short(step.rows[k].completion or '', 50)}")
    _response(step, i, meta)


def show() -> None:
    """The log's path, its format and the Follow toggle, then the viewer (a fragment rerun every
    :data:`FOLLOW_SECONDS` while Follow is on)."""
    if "rollouts_log" not in st.session_state and st.query_params.get("log"):
        st.session_state["rollouts_log"] = st.query_params["log"]  # ?log=PATH: a link to a run
    path = st.text_input("Run log (a folder or a file on this machine)", key="rollouts_log",
                         placeholder="runs/demo/credit",
                         help="an mrtpo credit log folder (meta.json + step-NNNNNN.jsonl), a TRL output folder or "
                              "completions parquet, an OpenRLHF board JSONL (or its folder), a prime-rl output folder "
                              "or token_exports, a verl dump folder or file")
    c1, c2 = st.columns([1, 2])
    fmt = c1.selectbox("Format", ["auto", *FORMATS], key="rollouts_log_format",
                       format_func=lambda f: FORMAT_LABELS.get(f, f))
    follow = c2.toggle(f"Follow (check for new steps every {FOLLOW_SECONDS:g} s)", value=True, key="rollouts_follow")
    if not path.strip():
        st.info("Give a run's log above: `python examples/trl_train.py --model tiny-random --credit-log "
                "runs/demo/credit` writes one as it trains (docs/integrations.md, the credit log).")
        return
    path = path.strip()
    try:  # before anything is opened, and before a timer starts: outside the roots, a device, a FIFO → refused
        real = check_log_path(path, log_roots())
    except CreditLogError as e:
        show_error(e)
        st.caption("This app reads run logs only under its logs root (`mrtpo app --logs-root DIR`); bring another "
                   "file with **Upload a file** above.")
        return
    logs = credit_logs_in(real)
    if len(logs) > 1:  # a folder of several runs' logs: which one
        pick = st.selectbox(f"This folder holds {len(logs)} credit logs, one per run: which one?",
                            [d.name for d in logs], index=None, placeholder="pick a log",
                            key=f"rollouts_log_pick_{zlib.crc32(str(real).encode())}")
        if pick is None:
            st.info(f"**{md(path)}** holds {len(logs)} credit logs ({md(', '.join(d.name for d in logs))}): pick "
                    "the one to follow above.")
            return
        path, real = str(Path(path) / pick), real / pick
    st.fragment(viewer, run_every=FOLLOW_SECONDS if follow else None)(path, str(real), fmt)
