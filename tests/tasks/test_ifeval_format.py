"""IFEval's own input format ({"key", "prompt", "instruction_id_list", "kwargs"}) as instructions examples: the
prompt as written, each constraint's verifier information its sentence of the prompt."""
from __future__ import annotations

import json

import pytest

from mrtpo.errors import TaskFileError
from mrtpo.tasks import get_family
from mrtpo.templates import Template

# two lines of google-research's input_data.jsonl (Apache-2.0), and one with a constraint stated in no sentence
LINES = [
    {"key": 1000, "prompt": 'Write a 300+ word summary of the wikipedia page "https://en.wikipedia.org/wiki/'
                            'Raymond_III,_Count_of_Tripoli". Do not use any commas and highlight at least 3 sections '
                            "that has titles in markdown format, for example *highlighted section part 1*, "
                            "*highlighted section part 2*, *highlighted section part 3*.",
     "instruction_id_list": ["punctuation:no_comma", "detectable_format:number_highlighted_sections",
                             "length_constraints:number_words"],
     "kwargs": [{}, {"num_highlights": 3}, {"relation": "at least", "num_words": 300}]},
    {"key": 1001, "prompt": "I am planning a trip to Japan, and I would like thee to write an itinerary for my journey "
                            "in a Shakespearean style. You are not allowed to use any commas in your response.",
     "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
    {"key": "x-7", "prompt": "Tell me about tea.\nEnd your reply with the phrase Is there anything else?",
     "instruction_id_list": ["startend:end_checker", "change_case:english_lowercase"],
     "kwargs": [{"end_phrase": "Is there anything else?", "relation": None}, {}]},
]


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    path = tmp_path_factory.mktemp("ifeval") / "input_data.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in LINES) + "\n")
    return get_family("instructions").load_examples(path)


def test_ifeval_lines_load_with_their_keys_and_prompts(examples):
    fam = get_family("instructions")
    assert [e.id for e in examples] == ["1000", "1001", "x-7"]
    for ex, line in zip(examples, LINES):
        assert ex.prompt == line["prompt"] and fam.reward_names(ex) == line["instruction_id_list"]
    info = fam.rule_info(examples[1])
    assert info == {"punctuation:no_comma": "You are not allowed to use any commas in your response."}
    assert fam.replay_prompt(examples[1]) == ("I am planning a trip to Japan, and I would like thee to write an "
                                              "itinerary for my journey in a Shakespearean style.")
    # a reply is scored by IFEval's checkers, the constraints' arguments from kwargs (null ones dropped)
    scores = fam.score(examples[2], "tea is nice. is there anything else?")
    assert {k: s.value for k, s in scores.items()} == {"startend:end_checker": 1.0,
                                                       "change_case:english_lowercase": 1.0}


def test_p_all_holds_the_prompts_sentences_and_p_minus_k_leaves_one_out(examples):
    fam = get_family("instructions")
    t = Template.from_dict(fam.template)
    ex = examples[0]
    info = fam.rule_info(ex)
    located = [n for n, sp in zip(fam.reward_names(ex), ex.data["located"]) if sp]
    assert located == ["punctuation:no_comma", "length_constraints:number_words"]
    for name in located:
        assert info[name] in ex.prompt  # the prompt's own sentence
    p_all = t.fill(fam.replay_prompt(ex), info)
    assert all(info[n] in p_all for n in located)
    p_minus = t.fill(fam.replay_prompt(ex), info, drop="punctuation:no_comma")
    assert "Do not use any commas" not in p_minus and info["length_constraints:number_words"] in p_minus
    # the highlight constraint shares its sentence with no_comma: IFEval's wording stands in, and a note says so
    assert info["detectable_format:number_highlighted_sections"].startswith("Highlight at least 3 sections")
    assert fam.notes(ex) and "number_highlighted_sections" in fam.notes(ex)[0]
    assert fam.notes(examples[1]) == []


@pytest.mark.parametrize("line, field", [
    ({"key": 1, "prompt": "p", "instruction_id_list": ["punctuation:no_comma", "x:y"], "kwargs": [{}, {}]},
     "instruction_id_list[1]"),
    ({"key": 1, "prompt": "p", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]}, "kwargs"),
    ({"key": 1, "prompt": "", "instruction_id_list": ["punctuation:no_comma"]}, "prompt"),
    ({"key": 1, "prompt": "p", "instruction_id_list": []}, "instruction_id_list"),
    ({"key": True, "prompt": "p", "instruction_id_list": ["punctuation:no_comma"]}, "key"),
    ({"key": 1, "prompt": "p", "instruction_id_list": ["keywords:existence"], "kwargs": [{"keywords": "tea"}]},
     "kwargs[0].keywords"),
    ({"key": 1, "prompt": "p", "instruction_id_list": ["combination:repeat_prompt"], "kwargs": [{}]},
     "kwargs[0].prompt_to_repeat"),
])
def test_bad_ifeval_lines_name_line_and_field(tmp_path, line, field):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(LINES[1]) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(TaskFileError) as e:
        get_family("instructions").load_examples(path)
    assert e.value.line == 2 and e.value.field == field, str(e.value)
