"""Every page starts with :func:`page`: its browser title, then the sidebar — links to the pages (Streamlit's own
list of the ``pages/`` folder is hidden by ``client.showSidebarNavigation = false``, so the links carry titles and
icons) and the choices every page reads (model, device, task family, example; shareable as ``?family=&example=``).

The app is Streamlit's documented multipage layout: ``app.py`` is the home page (Explore, at ``/``), each file in
``pages/`` is a page at ``/<file name>``.
"""
from __future__ import annotations

import contextlib

import streamlit as st
from streamlit.errors import StreamlitAPIException

from mrtpo.model import DEFAULT_MODEL, TINY_MODEL
from mrtpo.tasks import get_family
from mrtpo_app.models import DEVICES, default_model_name, preload_model
from mrtpo_app.state import PREFERRED_FAMILY, Choices, available_families, choices
from mrtpo_app.ui import guard, short

# (script, title, icon): the links in the sidebar, in order; a page's url is its file name
PAGES = [
    ("app.py", "Explore", ":material/search:"),
    ("pages/template-editor.py", "Templates", ":material/edit_note:"),
    ("pages/method-comparison.py", "Methods", ":material/balance:"),
    ("pages/teach-mrtpo.py", "Teach", ":material/school:"),
    ("pages/your-rollouts.py", "Your rollouts", ":material/upload_file:"),
    ("pages/training.py", "Train", ":material/model_training:"),
]
CHOICE_KEYS = ("mrtpo_model", "mrtpo_device", "mrtpo_family", "mrtpo_example", "mrtpo_items")


def _nav(sb) -> None:
    """The links to the pages; none when a page script runs on its own (a test's ``AppTest.from_file`` of one page:
    it has no app around it to link to)."""
    try:
        for path, title, icon in PAGES:
            sb.page_link(path, label=title, icon=icon)
    except StreamlitAPIException:
        return
    sb.divider()


def page(title: str) -> Choices:
    """Start a page: its title (browser tab), the wide layout and the sidebar; returns the sidebar's choices."""
    st.set_page_config(page_title=f"{title} · mrtpo", page_icon=":material/target:", layout="wide")
    with guard("sidebar"):
        return sidebar()
    return choices()  # not reached: guard stops the page on an error


def _init_from_query() -> None:
    """First run of a session: take family / example from the URL (``?family=sql&example=shop-01``)."""
    if "mrtpo_family" in st.session_state:
        return
    fams = available_families()
    fam = st.query_params.get("family")
    st.session_state["mrtpo_family"] = fam if fam in fams else (PREFERRED_FAMILY if PREFERRED_FAMILY in fams
                                                                  else (fams[0] if fams else None))
    ex = st.query_params.get("example")
    if ex and st.session_state["mrtpo_family"]:
        ids = [e.id for e in get_family(st.session_state["mrtpo_family"]).examples()]
        if ex in ids:
            st.session_state["mrtpo_example"] = ex


def sidebar() -> Choices:
    """Render the sidebar (the pages, then model, device, task family, example) and return the choices."""
    for key in CHOICE_KEYS:  # keep the choices across pages (Streamlit drops a widget's value on a page switch)
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]
    _init_from_query()
    sb = st.sidebar
    sb.title("mrtpo")
    _nav(sb)
    default = default_model_name()
    options = list(dict.fromkeys([default, DEFAULT_MODEL, TINY_MODEL]))
    if "mrtpo_model" not in st.session_state:
        st.session_state["mrtpo_model"] = default
    sb.selectbox("Model", options, key="mrtpo_model", accept_new_options=True,
                 help="default = SmolLM2-135M-Instruct; tiny-random = a 2-layer random model for tests; "
                      "or type a Hugging Face id / local folder (must be in the local cache: no model hub here)")
    sb.selectbox("Device", DEVICES, key="mrtpo_device", help="auto = CUDA (bfloat16) when available, else CPU")
    preload_model(st.session_state["mrtpo_model"], st.session_state["mrtpo_device"])
    fams = available_families()
    if not fams:
        sb.error("No task family could be loaded; check the installation (mrtpo/tasks).")
        return Choices(st.session_state["mrtpo_model"], st.session_state["mrtpo_device"], None, None)
    if st.session_state.get("mrtpo_family") not in fams:
        st.session_state["mrtpo_family"] = fams[0]
    fam = sb.selectbox("Task family", fams, key="mrtpo_family")
    exs = get_family(fam).examples()
    ids = [e.id for e in exs]
    if st.session_state.get("mrtpo_example") not in ids:
        st.session_state["mrtpo_example"] = ids[0]
    prompts = {e.id: e.prompt for e in exs}
    ex = sb.selectbox("Example", ids, key="mrtpo_example",
                      format_func=lambda i: f"{i} — {short(prompts[i], 40)}")
    if hasattr(get_family(fam), "with_items"):  # the checklist task: K items = K rewards per response
        most = min(len(get_family(fam).reward_names(e)) for e in exs)
        if not 1 <= int(st.session_state.get("mrtpo_items") or 0) <= most:
            st.session_state["mrtpo_items"] = most
        sb.number_input("Items (rewards per response)", 1, most, key="mrtpo_items",
                        help="the first K items of the checklist, each its own reward (mrtpo --items K): token "
                             "credit should matter more as K grows")
    with contextlib.suppress(Exception):  # the URL is a convenience (shareable link), never an error
        st.query_params["family"], st.query_params["example"] = fam, ex
    return choices()
