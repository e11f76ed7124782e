"""Templates are data: plain named fields only; malformed ones get a message naming the problem."""
import pytest

from mrtpo import templates as T
from mrtpo.templates import MAX_FILLED_CHARS, MAX_TEMPLATE_CHARS, Template, TemplateError, fill_fields

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


# ---------------------------------------------------------------------------------------------- size bounds


@pytest.mark.parametrize("bad", ["{0} {prompt} {verifier_info}", "{prompt:>99999999} {verifier_info}",
                                 "{prompt} {verifier_info.__class__.__init__.__globals__}",
                                 "{prompt!s:>9} {verifier_info}"])
def test_format_syntax_is_never_evaluated(bad):
    with pytest.raises(TemplateError, match="unknown placeholder"):
        Template(prompt=bad)
    with pytest.raises(TemplateError, match="unknown placeholder"):
        fill_fields(bad, {"prompt": "x", "verifier_info": "y"})


def test_issue_template_repeating_prompt_is_refused_at_construction():
    # issue 11: "{prompt}" written 100,000 times was accepted, and the replay was killed at 21.5 GB
    with pytest.raises(TemplateError, match=r"template 'prompt' is 800,015 characters, more than the limit of 100,000"):
        Template(prompt="{prompt}" * 100_000 + "{verifier_info}")
    with pytest.raises(TemplateError, match=r"template 'item' is 10,000,006 characters"):
        Template(item="{text}" + "x" * 10_000_000)
    with pytest.raises(TemplateError, match=r"template 'separator' is 100,001 characters"):
        Template(separator="-" * (MAX_TEMPLATE_CHARS + 1))
    with pytest.raises(TemplateError, match=r"template 'reward a' is 100,001 characters"):
        fill_fields("{x}" + "y" * (MAX_TEMPLATE_CHARS - 2), {"x": ""}, "reward a")
    Template(prompt="{prompt}{verifier_info}" + "x" * (MAX_TEMPLATE_CHARS - 23))  # exactly at the cap: fine


def test_fill_length_is_computed_before_building():
    import tracemalloc

    # 9,000 uses of a 10,000-character prompt: 90 M characters if built
    t = Template(prompt="<{prompt}>" * 9_000 + "\n{verifier_info}", item="[{reward}] {text}", separator="; ")
    info = {"a": "x" * 40, "bb": "y" * 7}
    tracemalloc.start()
    try:
        with pytest.raises(TemplateError) as e:
            t.fill("p" * 10_000, info)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000  # nothing near 90 MB was allocated
    # literal: 2 × 9,000 + 1; items: "[a] " + 40 and "[bb] " + 7, joined by "; " → 44 + 12 + 2 = 58
    assert str(e.value) == (
        "template 'prompt': the filled prompt would be 90,018,059 characters, more than the limit of 250,000; "
        "it is 18,001 characters of template text, {prompt} 9,000 times with 10,000 characters, "
        "{verifier_info} once with 58 characters (2 items of up to 44 characters from template 'item'); "
        "shorten the template or the values")


def test_fill_limit_is_exact_and_configurable():
    t = Template(prompt="{prompt}|{verifier_info}", item="{reward}={text}", separator=",")
    info = {"a": "1", "b": "22"}
    full = t.fill("Q", info)
    assert full == "Q|a=1,b=22" and len(full) == 10
    assert t.fill("Q", info, limit=10) == full  # exactly at the limit
    with pytest.raises(TemplateError, match=r"would be 10 characters, more than the limit of 9;"):
        t.fill("Q", info, limit=9)
    assert t.fill("Q", info, drop="a", limit=6) == "Q|b=22"
    assert t.variants("Q", info, limit=10) == {"__all__": full, "a": "Q|b=22", "b": "Q|a=1"}
    assert fill_fields("{a}{a}{{", {"a": "xy"}, limit=5) == "xyxy{"
    with pytest.raises(TemplateError, match=r"template 'reward r': the filled text would be 5 characters, more than "
                                            r"the limit of 4; it is 1 characters of template text, \{a\} 2 times"):
        fill_fields("{a}{a}{{", {"a": "xy"}, "reward r", limit=4)
    # the default cap
    big = "z" * (MAX_FILLED_CHARS // 2)
    assert len(fill_fields("{a}{a}", {"a": big})) == MAX_FILLED_CHARS
    with pytest.raises(TemplateError, match=f"would be {MAX_FILLED_CHARS + 1:,} characters"):
        fill_fields("{a}{a}.", {"a": big})


def test_values_must_be_text():
    t = Template()
    with pytest.raises(TemplateError, match="verifier information of reward 'a' must be text, not NoneType"):
        t.fill("Q", {"a": None})
    with pytest.raises(TemplateError, match=r"the value of \{prompt\} must be text, not int"):
        t.fill(3, {})
    with pytest.raises(TemplateError, match=r"the value of \{n\} must be text, not int"):
        fill_fields("{n}", {"n": 3})
    assert fill_fields("{n}", {"n": "3", "unused": 4}) == "3"
    with pytest.raises(TemplateError, match="'prompt' must be a string, not bytes"):
        Template(prompt=b"{prompt}{verifier_info}")


def test_template_file_bounds(tmp_path):
    p = tmp_path / "big.txt"
    p.write_bytes(b"{prompt}{verifier_info}" + b"x" * (T.MAX_TEMPLATE_FILE_BYTES))
    with pytest.raises(TemplateError, match=f"is more than {T.MAX_TEMPLATE_FILE_BYTES:,} bytes"):
        Template.from_file(p)
    p.write_bytes(b"{prompt}{verifier_info}\xff\xfe")
    with pytest.raises(TemplateError, match=r"is not UTF-8 text \(byte 23\)"):
        Template.from_file(p)
    p.write_text("[" * 100_000)  # deeply nested JSON is read as plain text, which lacks the fields
    with pytest.raises(TemplateError, match="must contain {prompt}, {verifier_info}"):
        Template.from_file(p)


# ---------------------------------------------------------------------------------------------- in the replay
def _no_forward(monkeypatch):
    import mrtpo.replay.engine as rel

    def boom(*a, **k):
        raise AssertionError("a forward pass ran")

    monkeypatch.setattr(rel, "shared_hidden", boom)


def test_replay_refuses_an_overlong_fill_before_building_it(tiny, monkeypatch):
    from mrtpo.replay import replay_group

    _no_forward(monkeypatch)
    longest = []
    encode = type(tiny).encode
    monkeypatch.setattr(type(tiny), "encode", lambda self, text: longest.append(len(text)) or encode(self, text))
    t = Template(prompt="{prompt}\n" * 1000 + "{verifier_info}")
    with pytest.raises(TemplateError, match=r"^the prompts for response 0: template 'prompt': the filled prompt "
                                            r"would be 1,001,019 characters, more than the limit of 250,000;"):
        replay_group(tiny, "q" * 1000, {"a": "check a", "b": "check b"}, ["ok", "no"], template=t)
    assert max(longest, default=0) < 100  # only the responses were tokenized


def test_replay_refuses_a_prompt_longer_than_the_context_in_tokens(tiny, monkeypatch):
    from mrtpo.errors import MrtpoError
    from mrtpo.replay import replay_group

    _no_forward(monkeypatch)
    t = Template(prompt="{prompt}\n{verifier_info}")
    info = [{"a": "short"}, {"a": "y" * 5000}]  # the second response's verifier information overflows the context
    msg = t.fill("Q", info[1])
    n = len(tiny.encode(tiny.chat_prompt(msg))) + len(tiny.encode("no"))
    assert n > tiny.max_length
    with pytest.raises(MrtpoError, match=rf"^P_all \+ response 1 is {n} tokens, more than model "
                                         rf"'tiny-random' accepts \({tiny.max_length}\)"):
        replay_group(tiny, "Q", info, ["ok", "no"], template=t, rewards=[[1.0], [0.0]])
