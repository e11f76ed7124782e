"""Property tests: any template text and any values give a filled text or a TemplateError, never another exception,
never more than the limit in characters, and never evaluate anything (the result equals a plain reference fill)."""
import json

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from mrtpo.errors import MrtpoError
from mrtpo.templates import MAX_FILLED_CHARS, Template, TemplateError, fill_fields, template_fields

# pieces that look like format syntax, literal braces, field names, and awkward characters
PIECES = ["{prompt}", "{verifier_info}", "{reward}", "{text}", "{", "}", "{{", "}}", "{}", "{ }", "{0}",
          "{prompt.__class__}", "{prompt[0]}", "{prompt!r}", "{prompt:>99999999}", "{text!s:{x}}", "{a.b}", "{a}",
          "x", " ", "\n", "\x00", "\ud800", "é", "🙂", ":", "!", ".", "[", "]"]
texts = st.one_of(st.text(max_size=30), st.lists(st.sampled_from(PIECES), max_size=12).map("".join))
SAFE = ["x", " ", "\n", "{{", "}}", "é", "\x00", "🙂", ":", "."]


def _plain(fields):
    """Templates that are mostly valid: the given fields among literal text and escaped braces."""
    return st.lists(st.sampled_from(SAFE + fields), max_size=10).map(lambda p: "".join(p + fields))


prompts = st.one_of(_plain(["{prompt}", "{verifier_info}"]), _plain(["{verifier_info}", "{prompt}", "{prompt}"]), texts)
items = st.one_of(_plain(["{text}"]), _plain(["{reward}", "{text}"]), texts)
settings_ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Refused(Exception):
    pass


def reference_fill(template: str, values: dict[str, str]) -> str:
    """Scan left to right: ``{{`` → ``{``, ``}}`` → ``}``, ``{name}`` → values[name] (whole name, no nesting);
    any other brace, or a name not in ``values``, is refused."""
    out, i = [], 0
    while i < len(template):
        if template.startswith("{{", i) or template.startswith("}}", i):
            out.append(template[i])
            i += 2
        elif template[i] == "{":
            j = template.find("}", i + 1)
            name = template[i + 1:j] if j >= 0 else None
            if name is None or "{" in name or name not in values:
                raise Refused
            out.append(values[name])
            i = j + 1
        elif template[i] == "}":
            raise Refused
        else:
            out.append(template[i])
            i += 1
    return "".join(out)


def reference_names(template: str) -> list[str] | None:
    """The whole-name fields of ``template`` in order, or None where a brace is stray."""
    names = []

    class Any(dict):
        def __contains__(self, k):
            return True

        def __getitem__(self, k):
            names.append(k)
            return ""

    try:
        reference_fill(template, Any())
    except Refused:
        return None
    return names


def _template_or_error(prompt, item, sep):
    try:
        return Template(prompt=prompt, item=item, separator=sep)
    except TemplateError:
        return None


@settings_
@given(prompt=prompts, item=items, sep=texts)
@example(prompt="{prompt}{verifier_info}", item="{text}", sep="")
@example(prompt="{prompt.__class__}{verifier_info}", item="{text}", sep="")
@example(prompt="{prompt}{verifier_info}", item="{0}{text}", sep="")
@example(prompt="{prompt!r}{verifier_info}", item="{text}", sep="")
@example(prompt="{prompt:>99999999}{verifier_info}", item="{text}", sep="")
def test_any_template_is_accepted_exactly_when_plain(prompt, item, sep):
    t = _template_or_error(prompt, item, sep)
    pn, inn = reference_names(prompt), reference_names(item)
    plain = (prompt.strip() and item.strip() and pn is not None and inn is not None
             and set(pn) == {"prompt", "verifier_info"} and set(inn) <= {"reward", "text"} and "text" in inn)
    event("accepted" if t is not None else "refused")
    assert (t is not None) == bool(plain), (prompt, item)


@settings_
@given(prompt=prompts, item=items, sep=texts, x=texts, names=st.lists(texts, max_size=4, unique=True),
       vals=st.lists(texts, min_size=4, max_size=4), drop=st.integers(-1, 3), limit=st.integers(0, 300))
def test_any_fill_is_the_plain_fill_or_refused_for_length(prompt, item, sep, x, names, vals, drop, limit):
    t = _template_or_error(prompt, item, sep)
    event("accepted" if t is not None else "refused")
    if t is None:
        return
    info = dict(zip(names, vals))
    gone = names[drop] if 0 <= drop < len(names) else None
    items = [reference_fill(item, {"reward": k, "text": v}) for k, v in info.items() if k != gone]
    expect = reference_fill(prompt, {"prompt": x, "verifier_info": sep.join(items)})
    for lim in (limit, None):
        cap = MAX_FILLED_CHARS if lim is None else lim
        try:
            out = t.fill(x, info, drop=gone, limit=lim)
        except TemplateError as e:
            event("fill refused")
            assert len(expect) > cap and f"would be {len(expect):,} characters" in str(e)
        else:
            event("filled")
            assert out == expect and len(out) <= cap


@settings_
@given(template=st.one_of(texts, _plain(["{a}", "{b.c}"]), _plain(["{0}"])),
       keys=st.one_of(st.lists(texts, max_size=4, unique=True), st.just(["a", "b.c", "0"])),
       vals=st.lists(texts, min_size=4, max_size=4),
       limit=st.integers(0, 200))
@example(template="{a.b}", keys=["a.b"], vals=["v", "", "", ""], limit=10)
@example(template="{a.b}", keys=["a"], vals=["v", "", "", ""], limit=10)
@example(template="{0}", keys=["prompt"], vals=["v", "", "", ""], limit=10)
def test_fill_fields_is_plain_lookup_or_refused(template, keys, vals, limit):
    values = dict(zip(keys, vals))
    try:
        expect = reference_fill(template, values)
    except Refused:
        expect = None
    try:
        out = fill_fields(template, values, "t", limit=limit)
    except TemplateError as e:
        event("refused" if expect is None else "refused for length")
        blank = not template.strip()
        assert expect is None or blank or (len(expect) > limit and f"would be {len(expect):,} characters" in str(e))
    else:
        event("filled")
        assert out == expect and len(out) <= limit
    try:
        names = template_fields(template)
    except TemplateError:
        names = None
    ref = reference_names(template)
    if template.strip() and ref is not None and all(n.strip() for n in ref):
        assert names == ref


@settings_
@given(d=st.one_of(st.none(), st.integers(), texts,
                   st.dictionaries(st.sampled_from(["prompt", "item", "separator", "system", "x"]),
                                   st.one_of(texts, st.integers(), st.none()), max_size=4)))
def test_from_dict_raises_only_template_errors(d):
    try:
        t = Template.from_dict(d)
    except MrtpoError as e:
        assert isinstance(e, TemplateError)
        assert "template" in str(e) or any(f"'{k}'" in str(e) for k in d)  # it names the part that is wrong
    else:  # the keys given are used as given, the others keep their defaults (None: every default)
        assert t.to_dict() == {**Template().to_dict(), **(d or {})}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=60), texts.map(lambda s: s.encode("utf-8", "surrogatepass"))))
def test_from_file_raises_only_template_errors(tmp_path, data):
    p = tmp_path / "t.json"
    p.write_bytes(data)
    try:
        t = Template.from_file(p)
    except TemplateError as e:  # the file itself (named), or the template it holds (the part named)
        assert str(p) in str(e) or "template" in str(e) or "prompt" in str(e)
    else:  # a JSON object is a template; anything else is the prompt string itself
        text = data.decode("utf-8")
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        assert t == (Template.from_dict(obj) if isinstance(obj, dict) else Template(prompt=text))


@pytest.mark.parametrize("field", ["{prompt.__class__}", "{0}", "{prompt!r}", "{prompt:>99999999}", "{prompt[0]}",
                                   "{verifier_info.__init__.__globals__}"])
def test_format_syntax_is_refused_everywhere(field):
    with pytest.raises(TemplateError, match="unknown placeholder"):
        Template(prompt="{prompt} {verifier_info} " + field)
    with pytest.raises(TemplateError, match="unknown placeholder"):
        Template(item="{text} " + field)
    with pytest.raises(TemplateError, match="unknown placeholder"):
        fill_fields(field, {"prompt": "x", "verifier_info": "y"})
