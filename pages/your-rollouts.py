"""App page: follow a training run's log (the run viewer, :mod:`mrtpo_app.run_viewer`), or upload your own rollouts
(TRL completions parquet or verl JSONL) and see relevance heatmaps.

Upload: the uploaded file is parsed by :mod:`mrtpo.integrations.rollouts`, grouped by (step, prompt); the verifier
template (JSON {reward column: text over the row's fields}) says which columns are rewards and what each checker
reads. The replay of the chosen group runs once (cached by :func:`mrtpo_app.caches.replay_cached`); the β slider and
the method only re-color. A group with a row of more than 300 tokens shows its overview first (every row's strips
and hottest spans) and one row × one reward in full (:mod:`mrtpo_app.long_view`). Session keys: ``rollouts_file``
((name, bytes), set by the uploader), ``rollouts_vt``, ``rollouts_format``, ``rollouts_group``, ``rollouts_method``,
``rollouts_beta``, ``rollouts_long_*`` (the long view's); ``rollouts_source`` picks the view.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import streamlit as st

from mrtpo.core.advantages import method_names
from mrtpo.display import render, token_view
from mrtpo.display.overview import is_long
from mrtpo.display.page import PAGE_BUDGET
from mrtpo.errors import MrtpoError
from mrtpo.integrations import rollout_explain as rx
from mrtpo.integrations import rollouts as ro
from mrtpo.model import TooLong
from mrtpo.wording import plural
from mrtpo_app import long_view, models, run_viewer, state, wait
from mrtpo_app.sidebar import page
from mrtpo_app.ui import beta_slider, guard, md

EXAMPLE_VT = '{\n  "correct": "The answer must contain: {reference}",\n  "short": "Answer in under 10 characters."\n}'


@st.cache_data(show_spinner=False, max_entries=8)
def load_rows(name: str, data: bytes, fmt: str) -> list[ro.RolloutRow]:
    """Rows of an uploaded file; messages name the uploaded file, not the temporary copy."""
    safe = Path(name).name or "upload"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / safe
        path.write_bytes(data)
        try:
            rows = ro.read_rollouts(path, fmt)
        except MrtpoError as e:
            raise MrtpoError(str(e).replace(str(path), safe)) from None
    for r in rows:
        r.source = safe
    return rows


def _label(g: ro.RolloutGroup) -> str:
    step = f"step {g.step} · " if g.step is not None else ""
    text = " ".join(g.prompt.split())
    return f"{step}{len(g.rows)} rows · {text[:60] + ('…' if len(text) > 60 else '')}"


SOURCES = {"log": "Follow a run's log", "upload": "Upload a file"}

ch = page("Your rollouts")
st.title("Your rollouts")
source = st.segmented_control("Source", list(SOURCES), format_func=SOURCES.get, default="log", required=True,
                              key="rollouts_source")
if source == "log":
    st.caption("A training run's log, read as it grows: an mrtpo credit log (TRL's `MRTPOGRPOTrainer` or `mrtpo "
               "train` with `--credit-log`), OpenRLHF's board JSONL, prime-rl's token export, TRL's completions "
               "parquet or verl's dumps. Only new steps are read at each check.")
    run_viewer.show()
    st.stop()
st.caption("Upload a TRL completions log (`completions_*.parquet`, written with `log_completions=True`) or a "
           "verl-style JSONL dump (`input`, `output`, `score`, `step`, extra fields). Rows are grouped by step and "
           "prompt; the verifier template names the reward columns and what each reward's checker reads, with the "
           "row's columns as `{placeholders}`.")

up = st.file_uploader("Rollout file", type=["parquet", "jsonl", "json"], key="rollouts_upload")
if up is not None:
    st.session_state["rollouts_file"] = (up.name, up.getvalue())
c1, c2 = st.columns([1, 3])
fmt = c1.selectbox("Format", ["auto", "trl", "verl"], key="rollouts_format",
                   help="auto: .parquet → trl, .jsonl → verl")
vt_text = c2.text_area("Verifier template", value=EXAMPLE_VT, key="rollouts_vt", height=110,
                       help="JSON object {reward column: text}; placeholders are the row's columns, e.g. {reference}; "
                            "plain names only (no attribute or index access); {{ and }} are literal braces")

if "rollouts_file" not in st.session_state:
    st.info("Upload a file to start. Example verifier template above; see docs/integrations.md for the formats.")
    st.stop()

name, data = st.session_state["rollouts_file"]
with guard(f"reading {name}"):  # (show_error escapes the file name)
    rows = load_rows(name, data, fmt)
    vt = rx.RolloutVerifierInfo.from_json(vt_text)
groups = ro.group_rows(rows)
st.markdown(f"**{md(name)}**: {len(rows)} rows in {len(groups)} groups; columns: "
            + ", ".join(md(c) for c in rows[0].fields))

gi = st.selectbox("Group", list(range(len(groups))), key="rollouts_group", format_func=lambda i: _label(groups[i]))
group = groups[gi]
methods = method_names()
m1, m2 = st.columns(2)
method = m1.selectbox("Method", methods, index=methods.index("mrtpo"), key="rollouts_method")
beta = beta_slider(m2, "β (share of each reward's advantage moved by relevance)", "rollouts_beta")


with guard("replay"):
    lm = models.get_model(ch.model, ch.device)
    sg = rx.scored_group(group, vt, lm)
    keep = [i for i, s in enumerate(sg.samples) if s.token_ids]
    if not keep:
        raise rx.empty_group_error(group)
    if len(keep) < len(sg.samples):
        st.warning(f"{plural(len(sg.samples) - len(keep), 'empty completion')} left out (nothing to explain).")
        sg = sg.subset(keep)
    try:  # a completion too long for the model fails here, before any offset or forward pass
        replay = wait.replay_page("rollouts", ch, sg, state.current_template(None),  # asks first when long; Cancel
                                  label=lambda i: f"#{i} (file row {group.rows[keep[i]].row})")
    except TooLong as e:
        raise rx.too_long_error(group, [group.rows[i] for i in keep], e) from None
    # the token view, once per input in this session (the replay object is the cached one: the same tokens, rewards)
    view = long_view.memo(("rollouts_view", name, gi, fmt, vt_text, method, float(beta), tuple(keep)), (replay,),
                          lambda: token_view(sg, replay, method, beta))

st.html(f"<style>{render.CSS}</style><div class='mrtpo'>{render.rewards_table(view, sg)}</div>")
vm = render.scales(view)
kept_rows = [group.rows[i] for i in keep]


titles = [rx.response_title(i, r, view.final[i], "#") for i, r in enumerate(kept_rows)]  # # as in the table


def _in_full() -> list[str] | None:
    """Every row drawn in full, or None where the rows together would pass the page budget (many medium rows)."""
    out, size = [], 0
    for i in range(len(titles)):
        out.append(render.response_html(view, i, vmax=vm))
        size += len(out[-1].encode())
        if size > PAGE_BUDGET:
            return None
    return out


full = None if is_long(view) else long_view.memo(("rollouts_in_full", vm), (view,), _in_full)
if full is None:  # overview first (every row's strips, the hottest spans), one row × one reward in full
    long_view.show(view, "rollouts_long", group=sg, vmax=vm, titles=titles,
            why=None if is_long(view) else f"These rows drawn in full would pass {PAGE_BUDGET / 1e6:g} MB: an "
                                           "overview first.")
else:
    for i, title in enumerate(titles):
        with st.expander(title, expanded=i < 2):
            st.html(f"<style>{render.CSS}</style>{full[i]}")
