"""Explore's "Compare measures" (issue 36, item 3): on its toggle, for the response shown and the reward picked, one
row per measure on one color scale with its token AUROC and its cost, equal to the library's rows
(mrtpo.display.compare). AppTest, tiny model, hand-written responses (so that the evidence is known)."""
from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.testing.v1 import AppTest  # noqa: E402

from mrtpo.display.compare import COMPARED, compare_result, compare_rows  # noqa: E402
from mrtpo.groups import score_group, template_for  # noqa: E402
from mrtpo.model import Sample, tokenize_response  # noqa: E402
from mrtpo.replay import replay_scored  # noqa: E402
from mrtpo.tasks import get_family  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "app.py")
RESPONSES = ["Tea, green tea, and a cup.", "Green tea in a cup is calm.", "Black tea, hot.", "Tea is nice."]
LAB = re.compile(r'<div class="lab">(.*?)<span class="faith">(.*?)</span></div>')


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.fixture()
def app(tiny):
    from mrtpo_app import state

    fam = get_family("instructions")
    ex = fam.example("tea-note")
    group = score_group(fam, ex, [Sample(tokenize_response(tiny, t)[0], t) for t in RESPONSES])
    template = template_for(fam).to_dict()
    ch = state.Choices("tiny-random", "auto", "instructions", "tea-note")
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["mrtpo_family"], at.session_state["mrtpo_example"] = "instructions", "tea-note"
    at.session_state["mrtpo_group"] = state.SessionGroup(
        "task", ch, group, replay_scored(tiny, group, template_for(fam)), template, {"id": 1}, {})
    at.run()
    _ok(at)
    return at, group


def test_compare_measures_shows_every_row_with_auroc_and_cost(app, tiny):
    at, group = app
    assert not any("Relevance ρ (mean 1) of each measure" in h.proto.body for h in at.get("html"))  # off by default
    at.toggle(key="explore_compare").set_value(True).run()
    _ok(at)
    at.selectbox(key="explore_compare_reward").set_value("punctuation:no_comma").run()
    _ok(at)
    body = next(h.proto.body for h in at.get("html") if "of each measure on one color scale" in h.proto.body)
    labels = [(html.unescape(lab), note) for lab, note in LAB.findall(body)]
    want = compare_rows(group, compare_result(tiny, group, template_for(get_family("instructions"))), 0,
                        "punctuation:no_comma")
    assert [lab for lab, _ in labels] == [r.label for r in want.rows] and len(labels) == len(COMPARED)
    for (_, note), r in zip(labels, want.rows):
        assert note.startswith(f"AUROC {r.auroc:.3f}"), (note, r.measure)  # the same ρ, so the same AUROC
    assert body.count('<span class="ev">') == 2 * len(COMPARED)  # the two commas the checker read, in every row
    df = next(d.value for d in at.dataframe if "what it costs" in d.value.columns)
    assert df["measure"].tolist() == [r.label for r in want.rows]
    assert df.set_index("measure").loc["uniform (GDPO)", "token AUROC"] == 0.5
    assert df.set_index("measure").loc["oracle (the evidence)", "token AUROC"] == 1.0
    costs = df.set_index("measure")["seconds (this group)"]
    assert costs["uniform (GDPO)"] == 0 and costs["js (the paper's)"] > 0 and costs["attention (attn-contrast)"] > 0
    # another response: the rows follow the Explore picker
    at.selectbox(key="explore_response_1").set_value(2).run()
    _ok(at)
    body = next(h.proto.body for h in at.get("html") if "of each measure on one color scale" in h.proto.body)
    assert "Response #2, reward <b>punctuation:no_comma</b>" in body
