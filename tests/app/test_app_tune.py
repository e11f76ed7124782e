"""Templates → Tune under AppTest with the tiny model: the search runs from the page (tuning draw, then held-out
draw), the ranking and the held-out judgement are shown, one group under both configurations side by side, and the
button makes the choice this session's configuration only (another session keeps today's)."""
from __future__ import annotations

import os

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.testing.v1 import AppTest  # noqa: E402

from mrtpo.tasks import get_family  # noqa: E402
from mrtpo.templates import Template  # noqa: E402
from mrtpo_app import tune_panel as TP  # noqa: E402
from tests.app.test_app import APP, _ok, shown  # noqa: E402


def _sampled_sql() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.selectbox(key="mrtpo_family").set_value("sql").run()
    at.number_input(key="explore_max").set_value(16).run()
    at.button(key="explore_sample").click().run()
    _ok(at)
    return at


def _small(at: AppTest) -> None:
    at.number_input(key="tune_n").set_value(1).run()
    at.number_input(key="tune_m").set_value(1).run()
    at.number_input(key="tune_g").set_value(2).run()
    at.number_input(key="tune_t").set_value(8).run()
    at.multiselect(key="tune_measures").set_value(["js", "attn-contrast"]).run()
    at.multiselect(key="tune_wordings").set_value(["rule", "checker"]).run()
    at.multiselect(key="tune_layouts").set_value(["after", "inline"]).run()


def test_tune_on_the_templates_page_and_adopt_for_this_session_only():
    at = _sampled_sql()
    at.switch_page("pages/template-editor.py").run()
    at.segmented_control(key="tpl_mode").set_value("Tune").run()
    _ok(at)
    _small(at)
    at.button(key="tune_go").click().run()
    _ok(at)
    res = at.session_state[TP.RESULT]
    assert res["family"] == "sql" and res["model"] == "tiny-random"
    rep = res["choice"]["report"]
    assert rep["draws"]["tuning"]["seeds"] == [0] and rep["draws"]["held_out"]["seeds"] == [1]
    frames = [df.value for df in at.dataframe]
    assert any("held-out: tuned" in f.columns for f in frames)  # today vs tuned on the held-out draw
    ranking = next(f for f in frames if "rank" in f.columns)
    assert set(ranking["reward kind"]) >= {"all", "format"} and {"tuning", "held-out"} <= set(ranking.columns)
    heat = [h.proto.body for h in at.get("html")]
    assert len(heat) == 2 and all('class="tok"' in b for b in heat)  # the same response under both, side by side
    assert any("Today: the family's template" in shown(m.value) for m in at.markdown)
    at.button(key="tune_adopt").click().run()
    _ok(at)
    assert at.session_state[TP.KEY]["sql"] == res["choice"]
    assert at.session_state["mrtpo_measure"] == TP.TUNED
    run = at.session_state["mrtpo_group"]
    assert run.template == res["choice"]["layout"]["template"]
    assert any("This is your configuration" in shown(s.value) for s in at.success)
    at.switch_page("app.py").run()  # Explore: the measure picker offers "tuned", and the heatmaps use it
    _ok(at)
    assert "tuned" in at.selectbox(key="explore_measure").options
    assert at.selectbox(key="explore_measure").value == "tuned"
    # another session of the same server keeps today's configuration
    other = _sampled_sql()
    assert TP.KEY not in other.session_state and "tuned" not in other.selectbox(key="explore_measure").options
    assert other.session_state["mrtpo_group"].template == Template.from_dict(get_family("sql").template
                                                                             or {}).to_dict()
