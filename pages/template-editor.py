"""Templates: edit the verifier-info template and each reward's text, re-run only the replay on the same
responses, and compare relevance before and after, token by token."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from mrtpo.core.credit import MEASURE
from mrtpo.core.info import INFO_LABELS, INFO_REGIMES
from mrtpo.display import faithfulness_table, panels, relevance_change, render, token_view
from mrtpo.errors import MrtpoError
from mrtpo.templates import Template
from mrtpo_app import caches, state, tune_panel
from mrtpo_app.sidebar import page
from mrtpo_app.timer import Timer
from mrtpo_app.ui import guard, md, short, show_error


def _faithfulness_change(g, before, after) -> None:
    """Did the edit move relevance onto what the checkers read? Per reward over the group: token AUROC and lift
    against the verifiers' evidence, before and after (the measure picked on Explore)."""
    measure = st.session_state.get(state.MEASURE_KEY, MEASURE)
    with guard("faithfulness"):
        rb = {r["reward"]: r for r in faithfulness_table(token_view(g, before, measure=measure))}
        ra = {r["reward"]: r for r in faithfulness_table(token_view(g, after, measure=measure))}
    if not ra and not rb:
        return
    d = lambda a, b: None if a is None or b is None else round(a - b, 4)  # noqa: E731
    rows = []
    for k in dict.fromkeys([*rb, *ra]):
        b, a = rb.get(k, {}), ra.get(k, {})
        rows.append({"reward": k, "pairs": a.get("pairs", b.get("pairs")),
                     "AUROC before": b.get("token AUROC"), "AUROC after": a.get("token AUROC"),
                     "Δ AUROC": d(a.get("token AUROC"), b.get("token AUROC")),
                     "lift before": b.get("lift"), "lift after": a.get("lift"),
                     "Δ lift": d(a.get("lift"), b.get("lift"))})
    st.markdown(f"**Faithfulness to the verifiers' evidence, before → after** (measure {md(measure)}, all "
                "responses)")
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.caption("Token AUROC (0.5 = uniform credit) and lift (1 = uniform) of relevance against the characters each "
               "checker read: a rise means the edited template moved relevance onto what the checker reads.")


ch = page("Templates")
st.title("Templates")
st.caption("P_all = the task prompt with every reward's verifier information (filled into the template); P_\\k "
           "leaves reward k's item out. Fields: prompt: `{prompt}`, `{verifier_info}`; item: `{reward}`, `{text}`; "
           "write `{{` and `}}` for literal braces. The template is data: nothing in it runs.")
run = state.require_group()
g = run.group
fam_key = run.choices.family if run.mode == "task" else None
st.markdown(f"Group **{md(run.label)}**, G = {len(g.samples)}; rewards: {md(', '.join(g.reward_names))}")
if st.segmented_control("What to do", ["Edit by hand", "Tune"], default="Edit by hand", required=True,
                        key="tpl_mode", help="Tune: search each reward's wording and relevance measure on a tuning "
                                             "draw, judge the choice on a held-out draw") == "Tune":
    tune_panel.show(run)
    st.stop()

cur = run.template
c1, c2 = st.columns([3, 1])
t_prompt = c1.text_area("prompt", cur["prompt"], height=120, key="tpl_prompt")
t_item = c2.text_area("item", cur["item"], height=60, key="tpl_item")
t_sep = c2.text_input("separator (use \\n for a new line)", cur["separator"].replace("\n", "\\n"), key="tpl_sep")

i = st.selectbox("Response", list(range(len(g.samples))), key="tpl_response",
                 format_func=lambda j: f"#{j} — {short(g.samples[j].text, 70)}")
st.markdown("**Each reward's verifier text.** Prefilled with response #%d's text; a changed text replaces that "
            "reward's text for every response of the group (unchanged ones keep their per-response texts)." % i)
fam = state.family(fam_key) if fam_key else None
regime = g.info
if fam is not None:
    regime = st.segmented_control(
        "Verifier information v_k", list(INFO_REGIMES), default=g.info, required=True, key="tpl_info",
        format_func=INFO_LABELS.get,
        help="Start the texts from the checkers' rule alone (the same for every reply), the rule + what the checker "
             "found in each reply, or + what it read, quoted (told where the evidence is: that is what moves "
             "relevance onto those characters). Replay to compare with the group's own (Explore's).")
base = g.verifier_info if fam is None or regime == g.info else g.with_info(fam, regime).verifier_info
edits: dict[str, str] = {}
for k in g.reward_names:
    orig = base[i][k]
    new = st.text_area(md(k), orig, height=68, key=f"tpl_text_{i}_{k}_{regime}")
    if new != orig:
        edits[k] = new

try:
    new_template = Template.from_dict({"prompt": t_prompt, "item": t_item, "separator": t_sep.replace("\\n", "\n")})
except MrtpoError as e:
    show_error(e, "template")
    st.stop()

infos = [{k: edits.get(k, v) for k, v in info.items()} for info in base]
with st.expander("P_all for this response with the edited template (what the model reads)"):
    st.code(new_template.fill(g.prompt, infos[i]), language=None, wrap_lines=True)

every = st.checkbox("Replay every reward, also those constant in the group (their advantage is 0 anyway)",
                    key="tpl_every", value=run.mode == "custom")
skip = not every and run.mode == "task"
if st.button("Re-run replay (same responses)", type="primary", key="tpl_rerun"):
    with st.status("Replaying with the edited template…") as status, guard("replay"):
        measure = st.session_state.get(state.MEASURE_KEY, MEASURE)
        need = caches.replay_inputs(measure)  # js-reworded also reads P_k′, attn-contrast P_all's attention
        with Timer({}, "replay") as tm:
            reuse = (not every or run.mode == "custom") and not caches.lacks_inputs(run.replay, measure)
            before_all = run.replay if reuse else caches.replay_for(run.choices, g, run.template, skip_constant=skip,
                                                                    **need)
            after = caches.replay_for(run.choices, g, new_template.to_dict(), skip_constant=skip, verifier_info=infos,
                                      **need)
        status.update(label=f"Replay done ({tm.text}; {after.forward_passes} forward passes)" if not tm.cached
                      else "Replay done (cached: this template and these texts were replayed before)",
                      state="complete")
    st.session_state["tpl_after"] = {"template": new_template.to_dict(), "infos": infos, "replay": after,
                                     "before": before_all, "run_id": run.settings.get("id")}

after = st.session_state.get("tpl_after")
if not after or after["run_id"] != run.settings.get("id"):
    st.info("Edit the template or a reward's text, then press **Re-run replay** to compare relevance.")
    st.stop()

measure = st.session_state.get(state.MEASURE_KEY, MEASURE)  # the measure picked on Explore (ρ from the stored replays)
# (ktae reads the group's rewards, entropy the sampler's entropies, the oracle the evidence: none reads the template)
before, new = (r.with_context(g.samples, g.reward_names, g.rewards).with_measure(measure, g.evidence or None)
               .responses[i] for r in (after["before"], after["replay"]))
shown = [k for k in g.reward_names if k in before.relevance or k in new.relevance]
if not shown:
    st.info("Every reward is constant in this group, so none was replayed (their advantage is 0). Tick "
            "**Replay every reward** to compare relevance anyway.")
    st.stop()
st.subheader(f"Relevance of response #{i}: before and after (measure {md(measure)})")
st.html(f"<style>{render.CSS}</style>{panels.relevance_diff_html(before, new, shown)}")
st.dataframe(pd.DataFrame(relevance_change(before, new, shown)), hide_index=True, width="stretch")
_faithfulness_change(g, after["before"], after["replay"])
if st.button("Use this template and these texts in Explore", key="tpl_adopt"):
    run.template, run.replay = after["template"], after["replay"]
    run.group.verifier_info = after["infos"]
    if run.mode == "task":
        state.set_template(fam_key, after["template"])
    state.set_group(run)
    st.success("Explore, Methods and Teach now use the edited template and texts.")
