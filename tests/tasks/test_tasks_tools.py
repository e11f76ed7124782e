"""The tool-calling family: rewards on hand-written answers, example files, bundled data."""
import json
from pathlib import Path

import pytest

from mrtpo.errors import TaskFileError
from mrtpo.tasks import get_family
from mrtpo.tasks.tools import EXAMPLES_PATH, ToolsTask, from_bfcl, values_equal
from mrtpo.tasks.tools_parse import parse_call

ROOT = Path(__file__).resolve().parents[2]

TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "default": "celsius"},
        },
        "required": ["city", "days"],
    },
}
OTHER = {"name": "get_time", "description": "Local time.",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
LINE = {
    "id": "w1",
    "request": "Weather in Paris for 5 days, in celsius.",
    "tools": [TOOL, OTHER],
    "expected": {"name": "get_weather", "arguments": {"city": "Paris", "days": 5, "unit": "celsius"}},
    "accept": {"city": ["Paris", "Paris, France"]},
}


@pytest.fixture(scope="module")
def task() -> ToolsTask:
    return ToolsTask()


@pytest.fixture(scope="module")
def ex(task):
    return task.parse_example(json.loads(json.dumps(LINE)))


def values(task, ex, response):
    return {k: s.value for k, s in task.score(ex, response).items()}


EXACT = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 5, "unit": "celsius"}}'


def test_registered_and_reward_order(task, ex):
    assert isinstance(get_family("tools"), ToolsTask)
    assert isinstance(get_family("tool-calling"), ToolsTask)
    assert task.reward_names(ex) == ["format", "function", "arguments"]
    assert list(task.score(ex, EXACT)) == ["format", "function", "arguments"]


def test_prompt_has_schemas_request_and_format(ex):
    assert '"name": "get_weather"' in ex.prompt and '"name": "get_time"' in ex.prompt
    assert "Weather in Paris for 5 days" in ex.prompt
    assert '{"name": "<function name>", "arguments"' in ex.prompt
    assert "get_weather\", \"arguments\": {\"city\": \"Paris\"" not in ex.prompt  # no answer leak


def test_exact_call(task, ex):
    s = task.score(ex, EXACT)
    assert {k: v.value for k, v in s.items()} == {"format": 1.0, "function": 1.0, "arguments": 1.0}
    assert all(v.reason == "" for v in s.values())


def test_optional_argument_may_be_omitted_and_alternatives_accepted(task, ex):
    r = '{"name": "get_weather", "arguments": {"city": "Paris, France", "days": 5}}'
    assert values(task, ex, r) == {"format": 1.0, "function": 1.0, "arguments": 1.0}


def test_wrong_name(task, ex):
    s = task.score(ex, '{"name": "get_time", "arguments": {"city": "Paris", "days": 5}}')
    assert s["format"].value == 1.0 and s["function"].value == 0.0
    assert "get_time" in s["function"].reason and "get_weather" in s["function"].reason
    assert s["arguments"].value == 1.0


def test_wrong_argument_value(task, ex):
    s = task.score(ex, '{"name": "get_weather", "arguments": {"city": "London", "days": 5}}')
    assert s["arguments"].value == pytest.approx(0.5)
    assert "'city'" in s["arguments"].reason and "London" in s["arguments"].reason
    # a wrong optional argument counts as an error: hits 2 / (needed 2 + errors 1)
    r = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 5, "unit": "kelvin"}}'
    assert values(task, ex, r)["arguments"] == pytest.approx(2 / 3)


def test_number_and_string_normalization(task, ex):
    for days in ['"5"', "5.0", '" 5 "']:
        r = '{"name": "get_weather", "arguments": {"city": "  paris ", "days": %s}}' % days
        assert values(task, ex, r)["arguments"] == 1.0, days
    r = '{"name": "get_weather", "arguments": {"city": "Paris", "days": "five"}}'
    assert values(task, ex, r)["arguments"] == pytest.approx(0.5)
    assert values_equal("New  York", "new york") and not values_equal("NewYork", "new york")
    assert values_equal(True, "true") and not values_equal(True, 1) and not values_equal(1, True)
    assert values_equal([1, "a"], ["1", "A"]) and not values_equal([1, 2], [2, 1])
    assert values_equal(None, None) and not values_equal(None, "")


def test_extra_argument_is_penalized(task, ex):
    r = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 5, "country": "FR"}}'
    s = task.score(ex, r)
    assert s["arguments"].value == pytest.approx(2 / 3)
    assert "country" in s["arguments"].reason


def test_missing_required_argument(task, ex):
    s = task.score(ex, '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert s["arguments"].value == pytest.approx(0.5)
    assert "missing 'days'" in s["arguments"].reason
    assert values(task, ex, '{"name": "get_weather", "arguments": {}}')["arguments"] == 0.0


def test_fenced_json(task, ex):
    for fence in ["```json\n%s\n```", "```\n%s\n```", "```json %s```", "  ```JSON\n%s\n```\n"]:
        assert values(task, ex, fence % EXACT) == {"format": 1.0, "function": 1.0, "arguments": 1.0}, fence
    two = "```json\n%s\n```\n```json\n%s\n```" % (EXACT, EXACT)
    assert values(task, ex, two) == {"format": 0.0, "function": 1.0, "arguments": 1.0}


def test_prose_around_json(task, ex):
    r = "Sure! Here is the call:\n" + EXACT + "\nThis returns the weather."
    s = task.score(ex, r)
    assert s["format"].value == 0.0 and s["format"].reason
    assert s["function"].value == 1.0 and s["arguments"].value == 1.0
    r = "I will call get_weather.\n```json\n" + EXACT + "\n```"
    assert values(task, ex, r) == {"format": 0.0, "function": 1.0, "arguments": 1.0}


def test_invalid_json(task, ex):
    # missing closing brace: repaired for function/arguments, format fails
    assert values(task, ex, EXACT[:-1]) == {"format": 0.0, "function": 1.0, "arguments": 1.0}
    # trailing comma: only the name can be read
    r = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 5,},}'
    assert values(task, ex, r) == {"format": 0.0, "function": 1.0, "arguments": 0.0}
    s = task.score(ex, "The weather in Paris is sunny.")
    assert {k: v.value for k, v in s.items()} == {"format": 0.0, "function": 0.0, "arguments": 0.0}
    assert s["function"].reason == "no function call found in the answer"
    assert values(task, ex, "") == {"format": 0.0, "function": 0.0, "arguments": 0.0}


def test_format_needs_exact_keys_and_types(task, ex):
    bad = [
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 5}, "id": 1}',
        '{"name": ["get_weather"], "arguments": {}}',
        '{"name": "get_weather", "arguments": "city=Paris"}',
        '[{"name": "get_weather", "arguments": {"city": "Paris", "days": 5}}]',
    ]
    for r in bad:
        assert task.score(ex, r)["format"].value == 0.0, r


def test_tolerant_call_shapes():
    assert parse_call('{"function": "f", "parameters": {"a": 1}}') == {"name": "f", "arguments": {"a": 1}}
    assert parse_call('{"tool_calls": [{"function": {"name": "f", "arguments": "{\\"a\\": 1}"}}]}') == {
        "name": "f", "arguments": {"a": 1}}
    assert parse_call("Answer: get_weather(city='Paris', days=5)") == {
        "name": "get_weather", "arguments": {"city": "Paris", "days": 5}}
    assert parse_call("call os.system(__import__('os'))") is None  # nothing is evaluated
    assert parse_call('{"city": "Paris"} then {"name": "f", "arguments": {}}') == {"name": "f", "arguments": {}}


def test_verifier_info(task, ex):
    info = task.verifier_info(ex, EXACT)
    assert list(info) == task.reward_names(ex)
    assert "get_weather" in info["function"] and "Paris" not in info["function"]
    assert '{"city":"Paris","days":5,"unit":"celsius"}' in info["arguments"]
    assert "JSON object" in info["format"] and "get_weather" not in info["format"]
    t = task.template
    assert t["prompt"].index("{prompt}") < t["prompt"].index("{verifier_info}")
    assert "{text}" in t["item"]


def test_optional_default_and_explicit(task):
    line = json.loads(json.dumps(LINE))
    assert task.parse_example(line).data["optional"] == ["unit"]
    line["optional"] = []
    ex = task.parse_example(line)
    r = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 5}}'
    assert task.score(ex, r)["arguments"].value == pytest.approx(2 / 3)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("expected"), "expected"),
    (lambda d: d.pop("request"), "request"),
    (lambda d: d["tools"][0].__setitem__("parameters", "none"), "tools[0].parameters"),
    (lambda d: d["tools"][1]["parameters"].__setitem__("required", ["zip"]), "tools[1].parameters"),
    (lambda d: d["tools"][0]["parameters"]["properties"]["days"].__setitem__("type", "int"), "tools[0].parameters"),
    (lambda d: d["tools"][1].__setitem__("name", "get_weather"), "tools[1].name"),
    (lambda d: d.__setitem__("tools", []), "tools"),
    (lambda d: d["expected"].__setitem__("name", "nope"), "expected.name"),
    (lambda d: d["expected"]["arguments"].__setitem__("zip", 1), "expected.arguments"),
    (lambda d: d["expected"]["arguments"].pop("days"), "expected.arguments"),
    (lambda d: d.__setitem__("accept", {"city": "Paris"}), "accept"),
    (lambda d: d.__setitem__("optional", ["zip"]), "optional"),
])
def test_load_examples_errors_name_line_and_field(task, tmp_path, mutate, field):
    bad = json.loads(json.dumps(LINE))
    mutate(bad)
    path = tmp_path / "ex.jsonl"
    path.write_text(json.dumps(LINE) + "\n\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError) as e:
        task.load_examples(path)
    assert e.value.line == 3 and e.value.field == field, str(e.value)
    assert f"line 3: field '{field}'" in str(e.value)


def test_load_examples_bad_json_and_missing_file(task, tmp_path):
    path = tmp_path / "ex.jsonl"
    path.write_text(json.dumps(LINE) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match="line 2"):
        task.load_examples(path)
    with pytest.raises(TaskFileError, match="cannot read"):
        task.load_examples(tmp_path / "missing.jsonl")


def test_bundled_examples(task):
    exs = task.examples()
    assert len(exs) >= 30 and len({e.id for e in exs}) == len(exs)
    assert all(1 <= len(e.data["tools"]) <= 4 for e in exs)
    assert any(len(e.data["tools"]) > 1 for e in exs)
    assert task.load_examples(EXAMPLES_PATH)[0].id == exs[0].id
    assert (EXAMPLES_PATH.parent / "NOTICE").read_text().count("Apache License") >= 1
    # the reference call, written as the model should, gets full marks on every example
    for e in exs:
        r = json.dumps(e.data["expected"])
        assert values(task, e, r) == {"format": 1.0, "function": 1.0, "arguments": 1.0}, e.id
        assert set(task.verifier_info(e, r)) == set(task.reward_names(e))


def test_from_bfcl():
    # BFCL's answer goes in as it is (possible_answer, compared as bfcl): the former conversion copied an object
    # parameter's {key: [alternatives]} in as its value and marked required arguments optional
    entry = {"id": "simple_0", "question": [[{"role": "user", "content": "Area of base 10, height 5."}]],
             "function": [{"name": "area", "description": "Area.", "parameters": {
                 "type": "dict", "properties": {"base": {"type": "integer"}, "height": {"type": "float"},
                                                "unit": {"type": "string"}, "box": {"type": "dict"}},
                 "required": ["base", "height"]}}]}
    gt = [{"area": {"base": [10], "height": [5.0, 5, ""], "unit": ["units", ""],
                    "box": [{"w": [1, 2], "h": [3, ""]}]}}]
    line = from_bfcl(entry, {"id": "simple_0", "ground_truth": gt})
    assert line["tools"][0]["parameters"]["type"] == "object"
    assert line["tools"][0]["parameters"]["properties"]["height"]["type"] == "number"
    assert line["possible_answer"] == gt and line["compare"] == "bfcl"
    ex = ToolsTask().parse_example(line)
    call = ex.data["calls"][0]
    assert call["optional"] == ["height", "unit"] and call["values"]["height"] == [5.0, 5]
    assert ex.data["expected"] == [{"name": "area", "arguments": {"base": 10, "height": 5.0, "unit": "units",
                                                                   "box": {"w": 1, "h": 3}}}]
    assert values(ToolsTask(), ex, ToolsTask().reference_reply(ex)) == {"format": 1.0, "function": 1.0,
                                                                          "arguments": 1.0}
    # height is required by the schema although its answer lists "": leaving it out fails, as in BFCL
    r = '[{"name": "area", "arguments": {"base": 10, "box": {"w": 2}}}]'
    s = ToolsTask().score(ex, r)
    assert s["arguments"].value == pytest.approx(2 / 3) and s["arguments"].reason == "missing 'height'"


def test_localization_data(task):
    text = (ROOT / "sample_data/localization/tools.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert len(lines) >= 12
    n_bad = 0
    for d in lines:
        ex = task.example(d["example_id"])
        names = task.reward_names(ex)
        assert set(d["spans"]) <= set(names) and d["spans"], d["example_id"]
        for reward, spans in d["spans"].items():
            assert spans, (d["example_id"], reward)
            for start, end in spans:
                assert 0 <= start < end <= len(d["response"]), (d["example_id"], reward, start, end)
        n_bad += any(s.value < 1 for s in task.score(ex, d["response"]).values())
    assert 0 < n_bad < len(lines)  # a mix of good and bad answers


# -- hostile text (issue 11) --------------------------------------------------------------------------------
def test_deeply_nested_json_scores_with_reasons(task, ex):
    s = task.score(ex, "[" * 2000 + "]" * 2000)
    assert {k: v.value for k, v in s.items()} == {"format": 0.0, "function": 0.0, "arguments": 0.0}
    assert s["format"].reason == "the answer's JSON is nested too deeply to read"
    assert s["function"].reason == "no function call found in the answer"
    deep_args = '{"name": "get_weather", "arguments": {"city": ' + "[" * 2000 + "]" * 2000 + "}}"
    s = task.score(ex, deep_args)
    assert s["format"].value == 0.0 and s["function"].value == 1.0  # the name is still read from the broken JSON
    assert s["arguments"].value == 0.0 and s["arguments"].reason == "no arguments object found in the answer"
    # nested 500 deep: decodable, but arguments deeper than 64 levels are not read as a call's arguments
    s = task.score(ex, '{"name": "get_weather", "arguments": {"city": ' + "[" * 500 + "]" * 500 + "}}")
    assert [v.value for v in s.values()] == [1.0, 1.0, 0.0]
    # a deep but shallow-enough wrong value is shown shortened
    s = task.score(ex, '{"name": "get_weather", "arguments": {"city": ' + "[" * 60 + "]" * 60 + ', "days": 5}}')
    reason = s["arguments"].reason
    assert s["arguments"].value == 0.5 and reason.startswith("'city' is [[[[") and len(reason) < 150


def test_python_style_call_nested_deeply_or_negated_long_is_not_a_call():
    assert parse_call("f(a=" + "[" * 3000 + "]" * 3000 + ")") is None
    assert parse_call("f(a=" + "-" * 100_000 + "1)") is None
    assert parse_call("x " * 1000 + "get_weather(city='Paris', days=5)") == {
        "name": "get_weather", "arguments": {"city": "Paris", "days": 5}}


def test_long_answers_are_read_in_bounded_time(task, ex):
    import time

    for text in ("a" * 5_000_000, "```" + " " * 5_000_000 + "x", '{"a": [' * 64 + "1" * 5_000_000, "[" * 5_000_000,
                 '{"name": "get_weather", "arguments": {"days": ' + "1" * 5000 + "}}"):
        t0 = time.perf_counter()
        s = task.score(ex, text)
        assert time.perf_counter() - t0 < 1.0
        assert s["format"].value == 0.0 and s["format"].reason
    # a call after the first MAX_PARSE_CHARS characters is not searched for
    from mrtpo.tasks.tools_parse import MAX_PARSE_CHARS

    late = "x" * MAX_PARSE_CHARS + EXACT
    assert task.score(ex, late)["function"].reason == "no function call found in the answer"
    assert task.score(ex, "x" * (MAX_PARSE_CHARS - len(EXACT)) + EXACT)["function"].value == 1.0


def test_reasons_stay_short_for_huge_names_and_keys(task, ex):
    s = task.score(ex, json.dumps({"name": "n" * 50_000, "arguments": {f"k{i}": i for i in range(3000)}}))
    assert s["function"].reason.startswith("called 'nnn") and len(s["function"].reason) < 150
    assert len(s["arguments"].reason) < 400
    s = task.score(ex, json.dumps({f"k{i}": i for i in range(10_000)}))
    assert len(s["format"].reason) < 200
