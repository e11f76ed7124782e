"""Templates → Tune: ``mrtpo tune`` in the app — its estimate (asked about first when long), a progress bar with the
time left and a Cancel, then the ranking per reward kind (the top candidates with their tuning and held-out token
AUROC and intervals), today's and the chosen configuration on the held-out draw, one group's heatmaps under both side
by side, and a button that makes the choice *this session's* configuration (other users of the server keep theirs):
the template, each reward's wording (the session's groups are worded as it says, :func:`worded`) and each reward's
measure (Explore's measure picker offers ``tuned``, :func:`tuned_replay`).  A choice file from ``mrtpo tune`` can be
uploaded instead.

A cancelled run leaves what it computed in the session's own cache folder (:class:`mrtpo.tune.cache.TuneCache`):
pressing Tune again with the same settings resumes it.
"""
from __future__ import annotations

import hashlib
import json
import tempfile

import pandas as pd
import streamlit as st

from mrtpo_app import caches, long_view, models, state, wait, work
from mrtpo_app.ui import guard, md, short, show_error

KEY = "mrtpo_tuned"  # session state: {family: the choice (its JSON object)} this session uses
RESULT = "tune_result"  # session state: the last choice made or uploaded here, with its family and model
TUNED = "tuned"  # Explore's measure name for "each reward its own measure, as the choice says"


def session_choice(family: str | None):
    """The choice this session uses for ``family`` (None: today's configuration)."""
    from mrtpo.tune import Choice  # noqa: F401 - typing only
    from mrtpo.tune.choice import choice_from_dict

    d = st.session_state.get(KEY, {}).get(family or "")
    return None if d is None else choice_from_dict(d, "the tuned configuration")


def worded(family: str | None, group):
    """``group`` with each reward's text worded as this session's choice for ``family`` says (as it is without one;
    a group of typed texts is never worded)."""
    choice = session_choice(family)
    if choice is None or family is None:
        return group
    from mrtpo.tune.apply import tuned_group

    return tuned_group(choice, state.family(family), group)


def _digest(choice) -> str:
    return hashlib.sha256(json.dumps(choice.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def tuned_replay(run: state.SessionGroup, replay):
    """``replay`` (the group's) with each reward's ρ from the measure this session's choice gives it; replayed once
    more where a measure reads P_all's attention and the replay did not."""
    from mrtpo.tune.apply import choice_relevance, replay_inputs

    choice = session_choice(run.choices.family)
    if choice is None:
        return replay
    need = replay_inputs(choice)
    if (need["attention"] and not any(r.attn for r in replay.responses)) or \
            (need["reword"] and not any(r.js_reworded for r in replay.responses)):
        with st.spinner("the tuned measures read P_all's attention: replaying the group once more…"), work.job():
            replay = caches.replay_for(run.choices, run.group, run.template, skip_constant=run.mode == "task", **need)
    g = run.group
    return long_view.memo(("tuned_relevance", _digest(choice)), (g, replay), lambda: choice_relevance(
        replay.with_context(g.samples, g.reward_names, g.rewards), choice))


# ---------------------------------------------------------------------------------------------- the run
def _spec(fam, n_examples: int):
    """The search the widgets ask for (a TuneSpec; MrtpoError for a bad one)."""
    from mrtpo.model import SamplingConfig
    from mrtpo.tune.search import Draw, TuneSpec
    from mrtpo.tune.space import DEFAULT_MEASURES, LAYOUTS, WORDINGS

    exs = fam.examples()
    c = st.columns(5)
    n = c[0].number_input("Tuning examples", 1, max(1, n_examples - 1), min(3, n_examples - 1), key="tune_n")
    m = c[1].number_input("Held-out examples", 1, max(1, n_examples - n), min(3, n_examples - n), key="tune_m",
                          help="the examples after the tuning draw's: never read before the choice is made")
    g = c[2].number_input("Group size G", 2, 16, 4, key="tune_g")
    t = c[3].number_input("Max new tokens", 8, 512, 48, key="tune_t")
    seeds = c[4].text_input("Seeds: tuning / held-out", "0 / 1", key="tune_seeds",
                            help="sampling seeds of each draw (comma-separated), different for the two draws")
    measures = st.multiselect("Measures (a+b: mean rank of both)", list(dict.fromkeys([*DEFAULT_MEASURES])),
                              list(DEFAULT_MEASURES), key="tune_measures")
    c1, c2 = st.columns(2)
    wordings = c1.multiselect("Wordings", list(WORDINGS), list(WORDINGS), key="tune_wordings",
                              help="; ".join(f"{w.name}: {w.help}" for w in WORDINGS.values()))
    layouts = c2.multiselect("Layouts", list(LAYOUTS), list(LAYOUTS), key="tune_layouts")
    a, _, b = seeds.partition("/")
    to_ints = lambda s: [int(x) for x in s.replace(" ", "").split(",") if x]  # noqa: E731
    try:
        draws = (to_ints(a), to_ints(b))
    except ValueError:
        draws = ([], [])
    return TuneSpec(fam, Draw(exs[:n], draws[0]), Draw(exs[n:n + m], draws[1]),
                    SamplingConfig(group_size=int(g), max_new_tokens=int(t)), layouts=layouts, wordings=wordings,
                    measures=measures, min_pairs=3, boot=1000)


def _cache_dir() -> str:
    """This session's own cache folder (a cancelled run resumes from it; other sessions have theirs)."""
    if "tune_cache_dir" not in st.session_state:
        st.session_state["tune_cache_dir"] = tempfile.mkdtemp(prefix="mrtpo-tune-")
    return st.session_state["tune_cache_dir"]


def _run(run: state.SessionGroup, spec) -> None:
    """Estimate (asked about when long), then the run with progress, the time left and a Cancel."""
    from mrtpo.tune.cache import TuneCache
    from mrtpo.tune.search import estimate_tune, run_tune

    ch = run.choices
    stopped = wait.stopped_notice("tune")
    want = st.button("Tune", type="primary", key="tune_go", icon=":material/tune:")
    ident = [ch.model, ch.device, ch.family, [e.id for e in spec.tuning.examples], spec.tuning.seeds,
             [e.id for e in spec.held_out.examples], spec.held_out.seeds, repr(spec.sampling), spec.measures,
             spec.wordings, spec.layouts]
    est = lambda: estimate_tune(models.get_model(ch.model, ch.device), spec, TuneCache(_cache_dir()))  # noqa: E731
    if not wait.ask_first("tune", ident, want, est, force="The last tuning was cancelled (what it computed is "
                                                         "kept: it resumes)." if stopped and want else ""):
        return
    with st.status("Tuning…", expanded=True) as status, work.job(), wait.working("tune", "the tuning"):
        bar, line = st.progress(0.0, text="tuning"), st.empty()
        try:
            lm = models.get_model(ch.model, ch.device)
            with TuneCache(_cache_dir()) as cache, work.model_turn():
                res = run_tune(lm, spec, cache, on_stage=lambda s: line.caption(s), progress=wait.Work(bar, "tuning"))
        except Exception as e:  # noqa: BLE001 - shown as st.error, never a traceback
            status.update(label="Tuning failed", state="error")
            show_error(e, "tuning")
            wait.finished("tune")
            return
        status.update(label=f"Tuned ({res.seconds:.0f} s)", state="complete", expanded=False)
    st.session_state[RESULT] = {"choice": res.choice.to_dict(), "family": ch.family, "model": ch.model}


# ---------------------------------------------------------------------------------------------- the result
def _ranking(choice) -> None:
    """Today's and the chosen configuration on the held-out draw, then per reward kind its top candidates."""
    from mrtpo.tune.select import ci_text, summary_rows

    rep = choice.report
    if not rep.get("held_out"):
        st.info("This choice file holds no report (it was written by hand or edited): nothing to rank.")
        return
    t, h = rep["draws"]["tuning"], rep["draws"]["held_out"]
    st.markdown(f"**Chosen on the tuning draw** ({len(t['examples'])} examples × seeds {t['seeds']}), **judged on "
                f"the held-out draw** ({len(h['examples'])} other examples × seeds {h['seeds']}): layout "
                f"**{md(choice.layout)}**. Token AUROC against the checkers' evidence [95 % bootstrap interval over "
                "the examples]; Δ is paired (the same held-out pairs).")
    st.dataframe(pd.DataFrame(summary_rows(choice)), hide_index=True, width="stretch")
    for kind, why in rep.get("refused", {}).items():
        st.warning(f"Reward kind **{md(kind)}** refused: {md(why)}; it keeps the default entry.",
                   icon=":material/block:")
    st.markdown("**The ranking per reward kind** (the top candidates by their tuning score; the held-out score "
                "beside it was not used to choose)")
    rows = [{"reward kind": "all" if k == "*" else k, "rank": j + 1, "wording": r["wording"], "layout": r["layout"],
             "measure": r["measure"], "tuning": ci_text(r["tuning"]), "held-out": ci_text(r["held_out"]),
             "pairs (tuning / held-out)": f"{r['tuning'][3]} / {r['held_out'][3]}"}
            for k, rs in rep["ranking"].items() for j, r in enumerate(rs)]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


def _side_by_side(run: state.SessionGroup, choice) -> tuple:
    """The session's group under today's configuration and under the chosen one, one response, side by side."""
    from mrtpo.display import render, token_view
    from mrtpo.groups import template_for
    from mrtpo.tune.apply import choice_relevance, replay_inputs, tuned_group

    fam = state.family(run.choices.family)
    g = run.group.with_info(fam, "rule")  # today's texts: the rule as written
    i = st.selectbox("Response", list(range(len(g.samples))), key="tune_response",
                     format_func=lambda j: f"#{j} — {short(g.samples[j].text, 70)}")
    with st.spinner("replaying the group under both configurations (cached by their inputs)…"), work.job():
        today = caches.replay_for(run.choices, g, template_for(fam).to_dict(), skip_constant=False)  # every reward's ρ
        tg = tuned_group(choice, fam, g)
        tuned = caches.replay_for(run.choices, tg, choice.template.to_dict(), skip_constant=False,
                                  **replay_inputs(choice))
    tuned = choice_relevance(tuned.with_context(tg.samples, tg.reward_names, tg.rewards), choice)
    c1, c2 = st.columns(2)
    for col, grp, rep, title in ((c1, g, today, "Today: the family's template, the rule as written, js"),
                                 (c2, tg, tuned, "Tuned: the chosen layout, wordings and measures")):
        v = token_view(grp, rep, measure=None if rep is tuned else "js")
        col.markdown(f"**{title}**")
        col.html(f"<style>{render.CSS}</style>{render.response_html(v, i, scale='response', group=grp)}")
    st.caption("The same response and advantages; only the relevance ρ that spreads each reward's advantage differs "
               "(every reward replayed, also one constant in the group). Underlined: the characters each checker "
               "read.")
    return tg, tuned  # the worded group and its tuned replay


def _adopt(run: state.SessionGroup, choice, worded_group, replay) -> None:
    """Make the choice this session's configuration (session state only)."""
    fam = run.choices.family
    st.session_state.setdefault(KEY, {})[fam] = choice.to_dict()
    state.set_template(fam, choice.template)
    run.template, run.group, run.replay = choice.template.to_dict(), worded_group, replay
    st.session_state[state.MEASURE_KEY] = TUNED
    state.set_group(run)


def _upload(run: state.SessionGroup) -> None:
    """A choice file from ``mrtpo tune``: validated and checked against this session's model and family."""
    from mrtpo.tune import model_identity, parse_choice

    up = st.file_uploader("…or load a choice file written by `mrtpo tune`", type=["json"], key="tune_upload")
    if up is None or st.session_state.get("tune_uploaded") == up.file_id:
        return
    st.session_state["tune_uploaded"] = up.file_id
    ch = run.choices
    with guard("the choice file"):
        choice = parse_choice(up.getvalue().decode("utf-8", "replace"), f"choice file {up.name}")
        choice.check(model_identity(models.get_model(ch.model, ch.device)), ch.family)
        st.session_state[RESULT] = {"choice": choice.to_dict(), "family": ch.family, "model": ch.model}


def show(run: state.SessionGroup) -> None:
    """The Tune section of the Templates page (module docstring)."""
    from mrtpo.tune.choice import choice_from_dict

    st.subheader("Tune")
    if run.mode != "task":
        st.info("Tuning needs a task family's checkers (they say which characters they read): sample a task example "
                "on Explore.")
        return
    fam = state.family(run.choices.family)
    st.caption(f"Which wording of each reward's verifier information and which relevance measure put its credit on "
               f"the tokens its checker reads? Chosen per reward kind on a tuning draw of **{md(fam.name)}**, then "
               "judged on a held-out draw — other examples and other sampling seeds, never read before the choice — "
               "beside today's configuration. Nothing here changes other users' configuration.")
    with guard("the tuning settings"):
        spec = _spec(fam, len(fam.examples()))
        _run(run, spec)
    _upload(run)
    res = st.session_state.get(RESULT)
    if not res or res["family"] != run.choices.family or res["model"] != run.choices.model:
        return
    choice = choice_from_dict(res["choice"], "the tuned configuration")
    _ranking(choice)
    st.markdown("**One group under both configurations** (the session's group, from Explore)")
    with guard("the side-by-side view"):
        tg, tuned = _side_by_side(run, choice)
        active = session_choice(run.choices.family)
        if active is not None and _digest(active) == _digest(choice):
            st.success("This is your configuration: Explore, Methods and Teach use its template, wordings and "
                       "measures (measure `tuned` on Explore).", icon=":material/check_circle:")
        elif st.button("Use the tuned configuration", key="tune_adopt", icon=":material/done_all:",
                       help="for this session only: other users of this server keep theirs"):
            _adopt(run, choice, tg, tuned)
            st.rerun()
