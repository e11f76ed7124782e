"""Explore's first render imports nothing that imports torch (the page is up while the model loads in the
background), and a click while that load is still running gets the preloaded model and its heatmaps. Each case runs
in a fresh Python process: in the test process torch is imported long before."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("torch", "transformers", "mrtpo.groups", "mrtpo.replay", "mrtpo.display", "mrtpo.core.advantages")

FIRST_RENDER = """
import json, sys
from concurrent.futures import Future
from streamlit.testing.v1 import AppTest
from mrtpo_app import models
held = []
class Held:  # the preload thread, held back: whatever it would import stays unimported
    def submit(self, fn, *args):
        held.append([fn.__name__, *args])
        return Future()
models._MODEL_THREAD = Held()
at = AppTest.from_file("app.py", default_timeout=60).run()
print(json.dumps({"exceptions": [e.value for e in at.exception], "errors": [e.value for e in at.error],
                  "imported": [m for m in HEAVY if m in sys.modules], "held": held,
                  "buttons": [b.label for b in at.button], "info": [i.value for i in at.info],
                  "families": list(at.selectbox(key="mrtpo_family").options)}))
"""

CLICK_DURING_PRELOAD = """
import json, sys, threading
from streamlit.testing.v1 import AppTest
from mrtpo_app import models
gate, preload = threading.Event(), models._preload
models._preload = lambda *a: (gate.wait(60), preload(*a))[1]  # the preload thread starts its imports at the click
at = AppTest.from_file("app.py", default_timeout=120).run()  # asks for the preload (tiny-random)
started = "torch" not in sys.modules  # so the click below comes before torch is imported
threading.Timer(1.0, gate.set).start()  # the click waits at least a second for the load
at.button(key="explore_sample").click().run()
html = " ".join(h.proto.body for h in at.get("html"))
print(json.dumps({"exceptions": [e.value for e in at.exception], "errors": [e.value for e in at.error],
                  "clicked_before_imports": started, "tokens": html.count('class="tok"'),
                  "preload_taken": models._PRELOADS == {} and ("tiny-random", "auto") in models._PRELOADED,
                  "group": len(at.session_state["mrtpo_group"].group.samples),
                  "timing": [c.value for c in at.caption if c.value.startswith("model ")]}))
"""


def run_fresh(code: str) -> dict:
    env = dict(os.environ, MRTPO_MODEL="tiny-random", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n" + code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_explore_first_render_imports_no_torch():
    r = run_fresh(FIRST_RENDER)
    assert r["exceptions"] == [] and r["errors"] == []
    assert r["imported"] == []  # none of torch, transformers or the library's model side
    assert r["held"] == [["_preload", "tiny-random", "auto"]]  # the model's load was asked for, in the background
    assert "Sample group" in r["buttons"]
    assert r["info"] == ["Press **Sample group** to sample, score and replay a group."]
    # the sidebar works: every family without torch
    assert r["families"] == ["sql", "instructions", "tools", "checklist"]


def test_click_while_the_model_preloads_gets_heatmaps():
    r = run_fresh(CLICK_DURING_PRELOAD)
    assert r["exceptions"] == [] and r["errors"] == []
    assert r["clicked_before_imports"] is True
    assert r["preload_taken"] is True and r["group"] == 4  # the group came from the preloaded model
    assert r["tokens"] > 0  # and its heatmaps are on the page
    # the click's wait for the load is the model's time on the page (it happens in the click's estimate), not "cached"
    model_time = r["timing"][0].split(" · ")[0]
    assert model_time != "model cached" and float(model_time.split()[1]) >= 1.0, r["timing"]
