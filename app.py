"""mrtpo workbench — Streamlit entry: sidebar (model, device, task family, example) and page navigation.

Run:  mrtpo app [--port 8501]    (what `make app` runs; `streamlit run app.py` works too, but on a fresh server its
      first run takes pages/ for old-style pages, and a link straight to a page shows "Page not found" once:
      see mrtpo/cli/app.py)
``MRTPO_MODEL=tiny-random`` makes the tiny random model the sidebar's default (tests, demos).
"""
from __future__ import annotations

import streamlit as st

from pages import _state

# (file, title, icon, url path).
# The url paths differ from the file names on purpose: Streamlit also auto-detects a ``pages/`` folder (its
# "v1" multipage mode, active in AppTest runs and, unless started by `mrtpo app`, a server's first run) and would
# run a page whose url path equals its file name directly, skipping this script and its sidebar.
PAGES = [
    ("pages/explore.py", "Explore", ":material/search:", "explorer"),
    ("pages/templates.py", "Templates", ":material/edit_note:", "template-editor"),
    ("pages/methods.py", "Methods", ":material/balance:", "method-comparison"),
    ("pages/teach.py", "Teach", ":material/school:", "teach-mrtpo"),
    ("pages/rollouts.py", "Your rollouts", ":material/upload_file:", "your-rollouts"),
    ("pages/train.py", "Train", ":material/model_training:", "training"),
]

st.set_page_config(page_title="mrtpo", page_icon=":material/target:", layout="wide")
nav = st.navigation([st.Page(f, title=t, icon=i, url_path=u, default=(f == "pages/explore.py"))
                     for f, t, i, u in PAGES])
with _state.guard("sidebar"):
    _state.sidebar()
nav.run()
