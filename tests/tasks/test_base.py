"""mrtpo/tasks/base.py with a toy family: evidence spans in canonical form, the quotes of what a checker read
(cases tests/tasks/test_evidence.py does not cover: the 8-character and 20-character limits, the whitespace kept,
the 80 / 400-character cuts at their edges), finding examples, loading them from JSONL, and verifier_info."""
import pytest

from mrtpo.errors import MrtpoError, TaskFileError
from mrtpo.tasks.base import (
    MAX_EVIDENCE_SPANS,
    QUOTE_CONTEXT_BELOW,
    QUOTE_SPAN_CHARS,
    QUOTE_TOTAL_CHARS,
    Example,
    Score,
    TaskFamily,
    clean_spans,
    quote_evidence,
    sample_data,
)


class Toy(TaskFamily):
    """Three examples; one reward "comma" (no comma allowed) whose evidence is every comma, one "short" whose
    evidence is the whole response."""

    name = "toy"

    def __init__(self, exs=None):
        self.exs = exs if exs is not None else [Example("a", "Say hi."), Example("b", "Count."),
                                                Example("c", "Name a color.")]
        self.scored = 0

    def examples(self):
        return list(self.exs)

    def parse_example(self, obj):
        if not isinstance(obj["prompt"], str):
            raise TypeError("prompt: must be a string")
        if obj.get("level", 0) < 0:
            raise ValueError("level: must be >= 0: got a negative level")
        if "bad" in obj:
            raise ValueError("something is off")
        return Example(str(obj["id"]), obj["prompt"], {"level": obj.get("level", 0)})

    def reward_names(self, example):
        return ["comma", "short"]

    def score(self, example, response):
        self.scored += 1
        commas = [(i, i + 1) for i, c in enumerate(response) if c == ","]
        return {"comma": Score(0.0 if commas else 1.0, "comma used" if commas else "", commas),
                "short": Score(float(len(response) < 20))}

    def rule_info(self, example):
        return {"comma": "Use no commas.", "short": "Answer in under 20 characters."}


# ---------------------------------------------------------------------------------------------- clean_spans
def test_clean_spans_clips_sorts_and_merges():
    assert clean_spans([], 10) == []
    assert clean_spans([(20, 30), (4, 4), (7, 3)], 10) == []  # outside the text, empty, reversed: dropped
    assert clean_spans([(8, 15), (-5, 2)], 10) == [(0, 2), (8, 10)]  # clipped to [0, n], sorted
    assert clean_spans([(0, 10), (2, 5)], 12) == [(0, 10)]  # nested
    assert clean_spans([(4, 8), (0, 3), (2, 5)], 12) == [(0, 8)]  # a chain of overlaps is one span
    assert clean_spans([(0, 3), (3, 5)], 12) == [(0, 3), (3, 5)]  # touching: two things read
    assert clean_spans([(1.0, 3.9)], 12) == [(1, 3)]  # offsets are ints
    assert clean_spans([(0, 5)], 0) == []  # an empty response has nothing to point at


def test_clean_spans_cap_counts_spans_after_merging():
    n = 3 * MAX_EVIDENCE_SPANS
    at_cap = clean_spans([(2 * i, 2 * i + 1) for i in range(MAX_EVIDENCE_SPANS)], n)
    assert len(at_cap) == MAX_EVIDENCE_SPANS and at_cap[-1] == (2 * MAX_EVIDENCE_SPANS - 2, 2 * MAX_EVIDENCE_SPANS - 1)
    assert clean_spans([(2 * i, 2 * i + 1) for i in range(MAX_EVIDENCE_SPANS + 1)], n) is None  # the whole response
    assert clean_spans([(i, i + 2) for i in range(MAX_EVIDENCE_SPANS + 1)], n) == [(0, MAX_EVIDENCE_SPANS + 2)]


def test_score_defaults():
    s = Score(0.5)
    assert (s.value, s.reason, s.evidence) == (0.5, "", None)  # a checker that does not say: the whole response


# ---------------------------------------------------------------------------------------------- quote_evidence
def test_short_span_rule_at_its_edge():
    r = "Say abcdefgh now"
    assert QUOTE_CONTEXT_BELOW == 8
    assert quote_evidence(r, [(4, 12)]) == ' The checker read: "abcdefgh".'  # 8 characters: as it stands
    assert quote_evidence(r, [(4, 11)]) == ' The checker read: "Say abcdefg".'  # 7: with the word before it
    # text order; the second short span's word does not reach back into the first quote
    assert quote_evidence(r, [(13, 16), (4, 12)]) == ' The checker read: "abcdefgh", "now".'


def test_word_before_keeps_the_whitespace_and_stops_at_20_characters():
    assert quote_evidence("my dog\n\n,", [(8, 9)]) == ' The checker read: "dog\n\n,".'
    r = "x" * 30 + " ,"  # the comma at 31; 20 characters before it are the space and 19 x's
    assert quote_evidence(r, [(31, 32)]) == ' The checker read: "' + "x" * 19 + ' ,".'
    assert quote_evidence(" ,", [(1, 2)]) == ' The checker read: " ,".'  # whitespace alone before it


def test_quote_cut_at_80_characters():
    assert QUOTE_SPAN_CHARS == 80
    r = "a" * 81
    assert quote_evidence(r, [(0, 80)]) == ' The checker read: "' + "a" * 80 + '".'
    assert quote_evidence(r, [(0, 81)]) == ' The checker read: "' + "a" * 80 + '…".'


def test_quotes_stop_at_400_characters():
    """The quotes of one reward hold at most 400 characters, their marks and separators included (each quote costs
    its length + 4): many short quotes cannot add up past it."""
    assert QUOTE_TOTAL_CHARS == 400
    blocks = [c * 76 for c in "abcde"]
    r = " ".join(blocks) + " tailword"
    spans = [(77 * i, 77 * i + 76) for i in range(5)]
    five = ' The checker read: ' + ", ".join(f'"{b}"' for b in blocks)
    assert quote_evidence(r, spans) == five + "."  # 5 × (76 + 4) = exactly 400: all of them
    assert quote_evidence(r, spans + [(385, 393)]) == five + ", …."  # one more ("tailword"): left out
    short = quote_evidence("," * 10_000, [(i, i + 1) for i in range(0, 10_000, 2)])
    body = short[len(" The checker read: "):-len(", ….")]  # the quotes, their marks and separators
    assert short.endswith(", ….") and len(body) + 2 <= 400  # + the last quote's ", " that the join does not write


def test_no_quotes_for_the_whole_response_or_nothing():
    assert quote_evidence("a, b", None) == ""
    assert quote_evidence("a, b", []) == ""
    assert quote_evidence("a, b", [(10, 20)]) == ""  # nothing left after clipping


# ---------------------------------------------------------------------------------------------- examples
def test_example_by_id_and_by_index():
    fam = Toy()
    assert fam.example("b").prompt == "Count."
    assert fam.example(2).id == "c" and fam.example("0").id == "a"  # an index, as an int or a digit string
    assert Example("x", "p").data == {}
    digits = Toy([Example("a", "first"), Example("b", "second"), Example("0", "an id that looks like an index")])
    assert digits.example("0").prompt == "an id that looks like an index"  # an id wins over an index


@pytest.mark.parametrize("key", ["z", 3, "3", -1, "-1", "1.0"])
def test_example_error_names_the_ids_and_the_index_range(key):
    with pytest.raises(MrtpoError) as e:
        Toy().example(key)
    assert str(e.value) == f"task 'toy' has no example '{key}' (ids: a ... c, or an index 0..2)"


def test_replay_prompt_defaults_to_the_task_prompt():
    ex = Example("a", "Say hi.", {"x": 1})
    assert Toy().replay_prompt(ex) == "Say hi."


def test_sample_data_is_inside_the_package():
    p = sample_data("sql", "shop.sql")
    assert p.is_file() and p.parts[-3:] == ("sample_data", "sql", "shop.sql") and p.parent.parent.parent.name == "mrtpo"


# ---------------------------------------------------------------------------------------------- load_examples
def test_load_examples(tmp_path):
    p = tmp_path / "mine.jsonl"
    p.write_text('{"id": "q1", "prompt": "One?"}\n\n{"id": 2, "prompt": "Two?", "level": 3}\n', encoding="utf-8")
    exs = Toy().load_examples(p)
    assert [(e.id, e.prompt, e.data) for e in exs] == [("q1", "One?", {"level": 0}), ("2", "Two?", {"level": 3})]


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "x"}', "line 2: field 'id': missing"),  # KeyError
    ('{"id": "q", "prompt": 5}', "line 2: field 'prompt': must be a string"),  # TypeError "field: problem"
    ('{"id": "q", "prompt": "x", "level": -1}', "line 2: field 'level': must be >= 0: got a negative level"),
    ('{"id": "q", "prompt": "x", "bad": 1}', "line 2: something is off"),  # no field named
    ('{"id": "q", "prompt": }', "line 2: not valid JSON (Expecting value at column 23)"),
    ('["q", "x"]', "line 2: each line must be a JSON object"),
])
def test_load_examples_errors_name_line_and_field(tmp_path, line, message):
    p = tmp_path / "mine.jsonl"
    p.write_text('{"id": "ok", "prompt": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError) as e:
        Toy().load_examples(p)
    assert str(e.value) == f"{p}: {message}"
    assert e.value.line == 2


def test_load_examples_unreadable_file(tmp_path):
    with pytest.raises(TaskFileError) as e:
        Toy().load_examples(tmp_path / "missing.jsonl")
    assert (e.value.line, e.value.problem) == (0, "cannot read: file not found")
    assert str(e.value) == f"{tmp_path / 'missing.jsonl'}: cannot read: file not found"  # no "line 0", no field


# ---------------------------------------------------------------------------------------------- verifier_info
def test_verifier_info_is_the_rule_then_the_quotes():
    fam = Toy()
    ex = fam.example("a")
    r = "Hello, dear friend, hi"
    rule = {"comma": "Use no commas.", "short": "Answer in under 20 characters."}
    assert fam.verifier_info(ex, r) == rule and fam.scored == 0  # the rule: no scoring at all
    info = fam.verifier_info(ex, r, info="quoted")  # the rule, the finding (the reason of a zero), the quotes
    assert info == {"comma": 'Use no commas. This reply: comma used. The checker read: "Hello,", "friend,".',
                    "short": "Answer in under 20 characters."}  # the whole response: no quote
    assert fam.scored == 1
    given = {"comma": Score(0.0, "", [(0, 5)]), "short": Score(1.0)}  # scores given: used, not computed again
    assert fam.verifier_info(ex, r, given, "quoted") == {"comma": 'Use no commas. The checker read: "Hello".',
                                                         "short": "Answer in under 20 characters."}  # no reason
    assert fam.scored == 1
