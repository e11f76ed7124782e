"""Every reward of every family says which characters its checker read (Score.evidence), for a zero as for a one.

Hand-written responses; spans checked exactly (and shown as the text they cover, so a failure is readable)."""
import pytest

from mrtpo.tasks import get_family
from mrtpo.tasks.base import MAX_EVIDENCE_SPANS, QUOTE_TOTAL_CHARS, Score, clean_spans, quote_evidence
from mrtpo.tasks.ifeval_registry import INSTRUCTIONS, validate
from mrtpo.tasks.sql_evidence import clauses
from mrtpo.tasks.tools_parse import locate_call


def covered(r: str, spans) -> list[str] | None:
    return None if spans is None else [r[s:e] for s, e in spans]


def test_score_stays_positional_and_clean_spans():
    assert Score(1.0).evidence is None and Score(0.0, "why").reason == "why"
    assert Score(1.0, "", [(0, 2)]).evidence == [(0, 2)]
    # clipped, empty dropped, sorted, overlapping merged, touching kept apart
    assert clean_spans([(5, 9), (-2, 1), (3, 3), (0, 2), (8, 12), (12, 13)], 12) == [(0, 2), (5, 12)]
    assert clean_spans([(i, i + 1) for i in range(0, 2 * MAX_EVIDENCE_SPANS + 4, 2)], 10 ** 6) is None


# ---------------------------------------------------------------------------------------------- IFEval
def ifeval(iid: str, kwargs: dict, r: str) -> tuple[float, list[str] | None, list | None]:
    ins, kw = validate(iid, kwargs)
    sc = ins.check(r, kw)
    return sc.value, covered(r, sc.evidence), sc.evidence


CASES = [
    # id, kwargs, response, value, evidence as text (None = whole response), first span (exact)
    ("keywords:existence", {"keywords": ["green", "cup"]}, "A Cup of green tea, one cup.", 1.0,
     ["Cup", "green", "cup"], (2, 5)),
    ("keywords:existence", {"keywords": ["green", "cup"]}, "A mug of green tea.", 0.0, ["green"], (9, 14)),
    ("keywords:frequency", {"keyword": "tea", "frequency": 3, "relation": "at least"}, "Tea and tea.", 0.0,
     ["Tea", "tea"], (0, 3)),
    ("keywords:forbidden_words", {"forbidden_words": ["bad"]}, "Not bad, badly.", 0.0, ["bad"], (4, 7)),
    ("keywords:forbidden_words", {"forbidden_words": ["bad"]}, "All good.", 1.0, [], None),
    ("keywords:letter_frequency", {"letter": "e", "let_frequency": 2, "let_relation": "less than"}, "EeK", 0.0,
     ["E", "e"], (0, 1)),
    ("language:response_language", {"language": "en"}, "This is an English sentence about tea.", 1.0, None,
     None),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"},
     "One. Two! Three?", 0.0, [".", "!", "?"], (3, 4)),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part\n***\nSecond part", 1.0,
     ["***"], (11, 14)),
    ("length_constraints:number_words", {"num_words": 5, "relation": "less than"}, "Three words here", 1.0,
     None, None),
    ("length_constraints:nth_paragraph_first_word",
     {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"}, "Intro text.\n\nThen, more.", 1.0,
     ["\n\n", "Then,"], (11, 13)),
    ("length_constraints:nth_paragraph_first_word",
     {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"}, "Intro text.\n\nSo, more.", 0.0,
     ["\n\n", "So,"], (11, 13)),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], at [place].", 1.0,
     ["[name]", "[place]"], (5, 11)),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\nP.S. See you soon!\nBye", 1.0,
     ["P.S. See you soon!"], (5, 23)),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi, no postscript.", 0.0, [], None),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "Tips:\n* helmet\n- lights\n  * brakes", 1.0,
     ["*", "-", "*"], (6, 7)),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "Tips:\n* helmet", 0.0, ["*"], (6, 7)),
    ("detectable_format:constrained_response", {}, "Well... My answer is no.", 1.0, ["My answer is no."],
     (8, 24)),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "A *big* and **bold** day", 1.0,
     ["*big*", "**bold**"], (2, 7)),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     "SECTION 1\nfoo\nSECTION 2\nbar", 1.0, ["SECTION 1", "SECTION 2"], (0, 9)),
    ("detectable_format:json_format", {}, '{"a": 1}', 1.0, None, None),
    ("detectable_format:title", {}, "<<My Cat>>\nsoft paws", 1.0, ["<<My Cat>>"], (0, 10)),
    ("detectable_format:title", {}, "My Cat\nsoft paws", 0.0, [], None),
    ("combination:two_responses", {}, "First one.\n******\nSecond one.", 1.0, ["******"], (11, 17)),
    ("combination:two_responses", {}, "Same.\n******\nSame.", 0.0, ["******"], (6, 12)),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "  Say hi. Hi!", 1.0, ["Say hi."], (2, 9)),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "Hello there", 0.0, ["Hello t"], (0, 7)),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, 'Rain fell. Any other questions?"\n', 1.0,
     ["Any other questions?"], (11, 31)),
    ("startend:end_checker", {"end_phrase": "Bye."}, "Rain fell down", 0.0, ["down"], (10, 14)),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     "THE big RED-HOT Dog", 1.0, ["THE", "RED-HOT"], (0, 3)),
    ("change_case:english_capital", {}, "HELLO world", 0.0, ["world"], (6, 11)),
    ("change_case:english_lowercase", {}, "<<My Cat>> is small", 0.0, ["My", "Cat"], (2, 4)),
    ("change_case:english_lowercase", {}, "the quiet cat sleeps in the warm sun all day long", 1.0, None, None),
    ("punctuation:no_comma", {}, "Tea, green, hot", 0.0, [",", ","], (3, 4)),
    ("punctuation:no_comma", {}, "Tea green hot", 1.0, [], None),
    ("startend:quotation", {}, ' "Quoted"\n', 1.0, ['"', '"'], (1, 2)),
    ("startend:quotation", {}, "Not quoted", 0.0, ["N", "d"], (0, 1)),
]


@pytest.mark.parametrize("iid,kwargs,r,value,texts,first", CASES, ids=[f"{c[0]}-{c[3]:g}" for c in CASES])
def test_ifeval_evidence(iid, kwargs, r, value, texts, first):
    v, got, spans = ifeval(iid, kwargs, r)
    assert v == value
    assert got == texts
    if first is not None:
        assert spans[0] == first


def test_every_instruction_type_has_an_evidence_case():
    assert {c[0] for c in CASES} == set(INSTRUCTIONS)


def test_instructions_family_passes_evidence_through():
    fam = get_family("instructions")
    ex = fam.example("tea-note")  # no_comma + keywords:existence (green, cup)
    r = "Tea is warm, I drink a cup."
    sc = fam.score(ex, r)
    assert sc["punctuation:no_comma"].value == 0 and covered(r, sc["punctuation:no_comma"].evidence) == [","]
    assert sc["keywords:existence"].value == 0 and covered(r, sc["keywords:existence"].evidence) == ["cup"]


# ---------------------------------------------------------------------------------------------- SQL
def test_sql_evidence_one_block():
    fam = get_family("sql")
    ex = fam.example("shop-01")  # customers in Vienna
    r = "```sql\nSELECT name FROM customers WHERE city = 'Vienna';\n```"
    sc = fam.score(ex, r)
    assert [s.value for s in sc.values()] == [1.0, 1.0, 1.0]
    assert sc["format"].evidence == [(0, 6), (57, 60)]  # ```sql and the closing fence
    assert sc["valid"].evidence == [(7, 56)]  # the query body
    # correct: the select item and the table cannot be removed; removing the WHERE condition changes the rows
    assert covered(r, sc["correct"].evidence) == ["name", "customers", "city = 'Vienna'"]


def test_sql_evidence_text_outside_and_zero_scores():
    fam = get_family("sql")
    ex = fam.example("shop-01")
    r = "Here it is:\n```sql\nSELECT name FROM customers WHERE 1 = 1 AND city = 'Vienna'\n```\nDone."
    sc = fam.score(ex, r)
    assert sc["format"].value == 0
    assert covered(r, sc["format"].evidence) == ["Here it is:", "```sql", "```", "Done."]
    # the always-true conjunct does not change the result: not read as deciding
    assert covered(r, sc["correct"].evidence) == ["name", "customers", "city = 'Vienna'"]
    wrong = "```sql\nSELECT name FROM customers WHERE city = 'Paris'\n```"
    sc = fam.score(ex, wrong)
    assert sc["correct"].value == 0 and covered(wrong, sc["correct"].evidence) == ["name", "customers",
                                                                                   "city = 'Paris'"]
    # no fence: format read the whole reply; a query that fails to run: correct read its whole body
    bad = "SELECT nme FROM customers"
    sc = fam.score(ex, bad)
    assert sc["format"].value == 0 and sc["format"].evidence == [(0, len(bad))]
    assert sc["valid"].value == 1 and sc["valid"].evidence == [(0, len(bad))]
    assert sc["correct"].value == 0 and sc["correct"].evidence == [(0, len(bad))]
    # unclosed fence, unparsable body
    r = "```sql\nSELECT (name FROM customers"
    sc = fam.score(ex, r)
    assert covered(r, sc["format"].evidence) == ["```sql"]
    assert sc["valid"].value == 0 and covered(r, sc["valid"].evidence) == ["SELECT (name FROM customers"]
    # an empty block: nothing to parse
    sc = fam.score(ex, "```sql\n\n```")
    assert sc["valid"].evidence == [] and sc["format"].evidence == [(0, 6), (8, 11)]


def test_sql_clauses():
    q = ("SELECT DISTINCT c.name, COUNT(*) AS n FROM customers c JOIN orders AS o ON o.customer_id = c.id "
         "WHERE o.status = 'x' AND o.total BETWEEN 1 AND 2 GROUP BY c.name HAVING n > 1 ORDER BY n DESC LIMIT 3;")
    got = [(q[c.span[0]:c.span[1]], c.without is not None) for c in clauses(q)]
    assert got == [("DISTINCT", True), ("c.name", True), ("COUNT(*) AS n", True), ("customers", False),
                   ("orders", False), ("o.customer_id = c.id", False), ("o.status = 'x'", True),
                   ("o.total BETWEEN 1 AND 2", True), ("GROUP BY c.name", True), ("HAVING n > 1", True),
                   ("ORDER BY n DESC", True), ("LIMIT 3", True)]
    removed = {q[c.span[0]:c.span[1]]: c.without for c in clauses(q)}
    assert " ".join(removed["o.status = 'x'"].split()) == (
        "SELECT DISTINCT c.name, COUNT(*) AS n FROM customers c JOIN orders AS o ON o.customer_id = c.id WHERE "
        "o.total BETWEEN 1 AND 2 GROUP BY c.name HAVING n > 1 ORDER BY n DESC LIMIT 3;")
    assert clauses("WITH t AS (SELECT 1) SELECT * FROM t") is None
    assert clauses("SELECT 1 UNION SELECT 2") is None


# ---------------------------------------------------------------------------------------------- tools
def tools_score(r: str, example: str = "simple_python_0"):
    fam = get_family("tools")
    return fam.score(fam.example(example), r)  # calculate_triangle_area(base=10, height=5)


def test_tools_evidence_exact_call():
    r = '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}'
    sc = tools_score(r)
    assert [s.value for s in sc.values()] == [1.0, 1.0, 1.0]
    assert sc["format"].evidence == [(0, 1), (1, 7), (36, 47), (74, 75)]  # braces and keys
    assert sc["function"].evidence == [(10, 33)]  # the name, quotes left out
    assert covered(r, sc["arguments"].evidence) == ['"base"', "10", '"height"', "5"]


def test_tools_evidence_prose_fence_and_zeros():
    r = 'Sure:\n```json\n{"name": "area", "arguments": {"base": "10"}, "x": 1}\n```'
    sc = tools_score(r)
    assert sc["format"].value == 0 and sc["function"].value == 0 and sc["arguments"].value == 0.5  # height missing
    assert covered(r, sc["format"].evidence) == ["Sure:", "```json", "{", '"name"', '"arguments"', '"x"', "}",
                                                 "```"]
    assert covered(r, sc["function"].evidence) == ["area"]
    assert covered(r, sc["arguments"].evidence) == ['"base"', '"10"']
    # a Python-style call: name and each keyword and value
    r = "Call calculate_triangle_area(base=10, height='5') now."
    sc = tools_score(r)
    assert sc["function"].value == 1 and covered(r, sc["function"].evidence) == ["calculate_triangle_area"]
    assert covered(r, sc["arguments"].evidence) == ["base", "10", "height", "'5'"]
    assert sc["format"].evidence == []  # no JSON object, no fence
    # broken JSON: the name found by the fallback; no arguments
    r = '{"name": "calculate_triangle_area", "arguments": {"base": 10,, }'
    sc = tools_score(r)
    assert covered(r, sc["function"].evidence) == ["calculate_triangle_area"] and sc["arguments"].evidence == []
    # prose only
    sc = tools_score("I cannot call functions.")
    assert sc["format"].evidence == [] and sc["function"].evidence == [] and sc["arguments"].evidence == []


def test_tools_locate_unwraps_like_the_parser():
    r = '{"tool_calls": [{"function": {"name": "f", "arguments": "{\\"a\\": 1}"}}]}'
    found = locate_call(r)
    assert found.call == {"name": "f", "arguments": {"a": 1}}
    assert covered(r, [found.name]) == ["f"] and covered(r, found.arguments) == ['"{\\"a\\": 1}"']
    assert covered(r, found.top_keys) == ['"tool_calls"']
    r = 'x {"function": "g", "parameters": {"b": [1, 2]}'  # missing brace repaired; spans stay inside the text
    found = locate_call(r)
    assert found.call == {"name": "g", "arguments": {"b": [1, 2]}}
    assert covered(r, found.arguments) == ['"b"', "[1, 2]"] and found.top == (2, len(r))


def test_hostile_text_evidence_never_raises():
    fam = get_family("instructions")
    ins, kw = validate("keywords:letter_frequency", {"letter": "a", "let_frequency": 1, "let_relation": "at least"})
    sc = ins.check("a" * 1_000_000, kw)
    assert sc.value == 1 and sc.evidence is None  # more than MAX_EVIDENCE_SPANS spans: the whole response
    for r in ["\x00\ud800" * 100, "{" * 50_000, "```" * 10_000, "[" * 100_000 + "]"]:
        for name in ("sql", "tools"):
            f = get_family(name)
            for s in f.score(f.examples()[0], r).values():
                assert s.evidence is None or all(0 <= a < b <= len(r) for a, b in s.evidence)
        for s in fam.score(fam.example("tea-note"), r).values():
            assert s.evidence is None or all(0 <= a < b <= len(r) for a, b in s.evidence)


def test_quote_evidence_hand_worked():
    r = "I love my dog, and the dog loves me."
    assert quote_evidence(r, None) == "" and quote_evidence(r, []) == ""
    # "dog" (3 characters) is quoted with the word before it; the comma with its word; a long span as it stands
    assert quote_evidence(r, [(10, 13)]) == ' The checker read: "my dog".'
    assert quote_evidence(r, [(13, 14), (23, 26)]) == ' The checker read: "dog,", "the dog".'
    assert quote_evidence(r, [(0, 13)]) == ' The checker read: "I love my dog".'
    assert quote_evidence(r, [(0, 1)]) == ' The checker read: "I".'  # nothing before it
    # overlapping and touching spans are one quote; spans outside the text are clipped
    assert quote_evidence(r, [(2, 6), (6, 13), (30, 99)]) == ' The checker read: "love my dog", "loves me.".'
    # a long span is cut at 80 characters (81 with "…"); a quote that would pass 400 characters of quotes, and
    # every span after it, is left out: 4 × 81 = 324, + 81 > 400
    long = "x" * 200 + " " + "y" * 200 + " " + "z" * 200 + " " + "w" * 200 + " " + "v" * 200 + " end"
    q = quote_evidence(long, [(0, 200), (201, 401), (402, 602), (603, 803), (804, 1004), (1005, 1009)])
    assert q == ' The checker read: ' + ", ".join(f'"{c * 80}…"' for c in "xyzw") + ", …."
    assert len(q) < QUOTE_TOTAL_CHARS + 100


def test_quote_evidence_of_hostile_text_is_bounded():
    for r in ["\x00\ud800" * 100_000, "," * 1_000_000, "a" * 10**6]:
        spans = [(i, i + 1) for i in range(0, len(r), 2)][:MAX_EVIDENCE_SPANS]
        q = quote_evidence(r, spans)
        assert q.startswith(" The checker read: ") and len(q) < QUOTE_TOTAL_CHARS * 2
    fam = get_family("instructions")
    info = fam.verifier_info(fam.example("tea-note"), "," * 1_000_000)
    assert all(len(v) < 1000 for v in info.values())
