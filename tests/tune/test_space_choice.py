"""The tuning search space (wordings, layouts, measures and their combinations) and the choice file: hand-worked
values, validation with messages that name the problem, stale files refused, entries resolved by name, kind, default."""
import json

import numpy as np
import pytest

from mrtpo.core.measures import MeasureInput, measure_relevance
from mrtpo.errors import MrtpoError
from mrtpo.templates import Template
from mrtpo.tune import Choice, ChoiceError, Entry, load_choice, save_choice
from mrtpo.tune.apply import tuned_texts, word
from mrtpo.tune.space import (
    check_measure,
    combo_parts,
    layout_template,
    measure_needs,
    relevance_of,
    reward_kind,
    short_rule,
    variants,
)


def test_reward_kind_and_short_rule():
    assert reward_kind("detectable_format:json_format") == "detectable_format"
    assert reward_kind("mention:towel") == "mention" and reward_kind("format") == "format"
    assert short_rule("Answer in JSON. Nothing else.") == "Answer in JSON."
    long = "word " * 40
    cut = short_rule(long, 20)
    assert cut == "word word word word…" and len(cut) <= 20


def test_wording_fields_are_filled_as_data():
    assert word("The {kind} checker: {rule}", "Use no commas.", "punctuation:no_comma", "") == \
        "The punctuation checker: Use no commas."
    assert word("{rule} {findings}", "R.", "format", "This reply: no fence.") == "R. This reply: no fence."
    # a text given without a checker has no findings: a wording that reads them is refused, naming the reward
    with pytest.raises(MrtpoError, match="reward 'format'.*findings"):
        word("{rule} {findings}", "R.", "format", None)
    # braces in the values are values, never fields
    assert word("{rule}", "SELECT {x}", "correct", "") == "SELECT {x}"


def test_layouts_over_a_family_template():
    base = Template("{prompt}\n{verifier_info}", "{text}", "\n")
    assert layout_template("after", base) == base
    before = layout_template("before", base)
    assert before.fill("TASK", {"a": "A", "b": "B"}).endswith("\n\nTASK")
    assert layout_template("inline", base).fill("T", {"a": "A", "b": "B"}) == "T\nA B"
    with pytest.raises(MrtpoError, match="unknown layout 'sideways'"):
        layout_template("sideways", base)
    assert [v.name for v in variants(["after", "before"], ["rule", "checker"])] == \
        ["after/rule", "after/checker", "before/rule"]


def test_measures_and_combinations_are_checked():
    assert combo_parts("attn-contrast+js-support") == ["attn-contrast", "js-support"]
    assert combo_parts("js") is None
    assert check_measure("attn-contrast+js-support") == "attn-contrast+js-support"
    with pytest.raises(MrtpoError, match="oracle"):
        check_measure("evidence")
    with pytest.raises(MrtpoError, match="unknown relevance measure 'nope' in 'js\\+nope'"):
        check_measure("js+nope")
    with pytest.raises(MrtpoError, match="each measure once"):
        check_measure("js+js")
    assert measure_needs(["js", "attn-contrast+js-support"]) == {"replay": True, "reword": False, "attention": True}
    assert measure_needs(["ktae"]) == {"replay": False, "reword": False, "attention": False}


def test_a_combination_is_the_mean_rank_of_its_parts():
    # js ranks the tokens 1, 3, 2 (d = 0, 0.3, 0.1); logratio |log .5 − log .25|, 0, |log .9 − log .3| ranks 2, 1, 3
    inp = MeasureInput(js=np.array([0.0, 0.3, 0.1], np.float32), logp_all=np.log(np.array([0.5, 0.2, 0.9])),
                       logp_without=np.log(np.array([0.25, 0.2, 0.3])), offsets=[(0, 2), (2, 3), (3, 6)],
                       text="abc de")
    rho = relevance_of("js+logratio", inp)
    s = np.array([(1 + 2) / 2, (3 + 1) / 2, (2 + 3) / 2])  # mean ranks 1.5, 2, 2.5 (÷ T: the same after normalizing)
    np.testing.assert_allclose(rho, 3 * s / s.sum(), rtol=1e-6)
    np.testing.assert_allclose(relevance_of("js", inp), measure_relevance("js", inp))


def _choice(**kw) -> Choice:
    return Choice(Template(), "after", Entry("rule", "{rule}", "js"),
                  {"format": Entry("checker", "The {kind} checker: {rule}", "attn-contrast")},
                  {"punctuation:no_comma": Entry("imperative", "Make sure: {rule_short}", "ktae")},
                  "tiny-random", "tiny-random", "sql", {"note": 1}, **kw)


def test_entries_by_name_then_kind_then_default():
    c = _choice()
    assert c.entry("punctuation:no_comma").measure == "ktae"  # by name
    assert c.entry("format").measure == "attn-contrast"  # by kind
    assert c.entry("correct").measure == "js"  # the default
    assert c.entry("format:anything").wording == "checker"  # the kind of a name with a colon
    assert tuned_texts(c, {"format": "One fence.", "correct": "Equal rows."}) == \
        {"format": "The format checker: One fence.", "correct": "Equal rows."}
    assert set(c.measures()) == {"js", "attn-contrast", "ktae"}


def test_the_file_round_trips(tmp_path):
    path = tmp_path / "choice.json"
    save_choice(_choice(), path)
    back = load_choice(path)
    assert back.to_dict() == _choice().to_dict()
    assert json.loads(path.read_text())["kind"] == "mrtpo-tune-choice"


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(kind="other"), "is not a choice file"),
    (lambda d: d.update(version=7), "version 7; this mrtpo reads choice files of version 1"),
    (lambda d: d["default"].update(measure="nope"), "default.measure: unknown relevance measure 'nope'"),
    (lambda d: d["kinds"]["format"].update(measure="evidence"), "kinds.format.measure: .*oracle"),
    (lambda d: d["kinds"]["format"].update(text="{rule} {secret.__class__}"), "kinds.format.text.*placeholder|field"),
    (lambda d: d["kinds"]["format"].update(text="{verdict}"), "unknown field \\{verdict\\}"),
    (lambda d: d["layout"].update(template={"prompt": "no fields"}), "layout.template: .*must contain"),
    (lambda d: d.pop("default"), "default: missing"),
    (lambda d: d["rewards"].update(x={"text": "{rule}", "measure": "js", "colour": 1}), "unknown key 'colour'"),
])
def test_a_bad_file_is_refused_naming_the_problem(tmp_path, edit, message):
    d = _choice().to_dict()
    edit(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ChoiceError, match=message):
        load_choice(path)


def test_not_json_and_missing_files(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ChoiceError, match="x.json"):
        load_choice(tmp_path / "x.json")
    with pytest.raises(ChoiceError, match="file not found"):
        load_choice(tmp_path / "none.json")


def test_a_stale_file_is_refused():
    c = _choice(source="choice file c.json")
    assert c.check("tiny-random", "sql") is c
    with pytest.raises(ChoiceError, match="c.json was tuned for the 'sql' task, not 'tools'"):
        c.check(family="tools")
    with pytest.raises(ChoiceError, match="tuned on model 'tiny-random'.*not on 'SmolLM2.*stale"):
        c.check(model_id="SmolLM2-135M-Instruct")
    assert c.check(None, None) is c  # nothing to check against
