"""Templates are data: plain named fields only; malformed ones get a message naming the problem."""
import pytest

from mrtpo.templates import Template, TemplateError

INFO = {"format": "one sql block", "correct": "SELECT 1"}


def test_fill_all_and_leave_one_out():
    t = Template(prompt="{prompt}\nChecks:\n{verifier_info}", item="[{reward}] {text}", separator="; ")
    v = t.variants("Q?", INFO)
    assert v["__all__"] == "Q?\nChecks:\n[format] one sql block; [correct] SELECT 1"
    assert v["format"] == "Q?\nChecks:\n[correct] SELECT 1"
    assert v["correct"] == "Q?\nChecks:\n[format] one sql block"


def test_literal_braces_and_values_are_not_reparsed():
    t = Template(prompt="{{json}} {prompt} {verifier_info}", item="{text}")
    out = t.fill("x {verifier_info} {prompt.__class__}", {"a": "{reward} }{"})
    assert out == "{json} x {verifier_info} {prompt.__class__} {reward} }{"


@pytest.mark.parametrize("bad, match", [
    ("{prompt} {verifier_info} {secret}", "unknown placeholder '{secret}'"),
    ("{prompt.__class__} {verifier_info}", "unknown placeholder"),
    ("{prompt[0]} {verifier_info}", "unknown placeholder"),
    ("{prompt!r} {verifier_info}", "unknown placeholder"),
    ("{prompt:>40} {verifier_info}", "unknown placeholder"),
    ("{prompt} {verifier_info} }", "stray '}'"),
    ("{prompt} {verifier_info", "stray '{'"),
    ("   ", "is empty"),
    ("{prompt} only", "must contain {verifier_info}"),
])
def test_malformed_prompt_templates(bad, match):
    with pytest.raises(TemplateError, match=match):
        Template(prompt=bad)


def test_item_template_rules():
    with pytest.raises(TemplateError, match="must contain {text}"):
        Template(item="- {reward}")
    with pytest.raises(TemplateError, match="unknown placeholder '{prompt}'"):
        Template(item="{prompt} {text}")


def test_from_dict_and_file(tmp_path):
    with pytest.raises(TemplateError, match="unknown template key"):
        Template.from_dict({"prompt": "{prompt}{verifier_info}", "system": "x"})
    p = tmp_path / "t.json"
    p.write_text('{"prompt": "{prompt} -- {verifier_info}", "item": "{text}"}')
    assert Template.from_file(p).prompt == "{prompt} -- {verifier_info}"
    p.write_text("{prompt}\n\n{verifier_info}\n")
    assert Template.from_file(p).prompt.startswith("{prompt}")
    with pytest.raises(TemplateError, match="cannot read"):
        Template.from_file(tmp_path / "missing.json")
