"""The checklist family: each item's checker and its evidence (hand-written replies, spans checked as the text they
cover), the JSONL format's messages (line and field named), ``--items K``, the built-in set, and the family seen
through the interface every command uses."""
from __future__ import annotations

import json

import pytest

from mrtpo.errors import MrtpoError, TaskFileError
from mrtpo.tasks import get_family
from mrtpo.tasks.checklist import ChecklistTask
from mrtpo.tasks.checklist_items import KINDS, MAX_ITEMS, check_item, parse_item


def covered(r: str, spans) -> list[str] | None:
    return None if spans is None else [r[s:e] for s, e in spans]


def run(item: dict, reply: str):
    sc = check_item(parse_item(item, "items[0]"), reply)
    return sc.value, covered(reply, sc.evidence), sc.reason


LIST = "Here is my list:\n- a sun HAT\n* towel and Towels\n2. snacks, snack!\n\nHave fun!  \n"

CASES = [
    # item, reply, value, evidence as text
    ({"kind": "mention", "word": "towel"}, LIST, 1.0, ["towel"]),  # "Towels" is another word
    ({"kind": "mention", "word": "Hat"}, LIST, 1.0, ["HAT"]),
    ({"kind": "mention", "word": "book"}, LIST, 0.0, []),
    ({"kind": "mention", "word": "snack"}, LIST, 1.0, ["snack"]),
    ({"kind": "avoid", "word": "snacks"}, LIST, 0.0, ["snacks"]),
    ({"kind": "avoid", "word": "sunscreen"}, LIST, 1.0, []),
    ({"kind": "capitalized", "word": "hat"}, LIST, 1.0, ["HAT"]),
    ({"kind": "capitalized", "word": "towel"}, LIST, 0.0, ["towel"]),
    ({"kind": "starts_with", "phrase": "here is"}, "  Here is it", 1.0, ["Here is"]),
    ({"kind": "starts_with", "phrase": "Dear"}, "Hi Dear", 0.0, ["Hi D"]),
    ({"kind": "starts_with", "phrase": "Dear friend"}, "", 0.0, []),
    ({"kind": "ends_with", "phrase": "Have fun!"}, LIST, 1.0, ["Have fun!"]),
    ({"kind": "ends_with", "phrase": "Thanks!"}, LIST, 0.0, ["ve fun!"]),
    ({"kind": "bullets", "count": 3, "relation": "at least"}, LIST, 1.0, ["-", "*", "2."]),
    ({"kind": "bullets", "count": 2, "relation": "exactly"}, LIST, 0.0, ["-", "*", "2."]),
    ({"kind": "bullets", "count": 3, "relation": "at most"}, LIST, 1.0, ["-", "*", "2."]),
    ({"kind": "bullets", "count": 1, "relation": "at least"}, "no list here", 0.0, []),
    ({"kind": "bullet_mentions", "bullet": 2, "word": "towel"}, LIST, 1.0, ["towel"]),
    ({"kind": "bullet_mentions", "bullet": 1, "word": "towel"}, LIST, 0.0, ["- a sun HAT"]),
    ({"kind": "bullet_mentions", "bullet": 4, "word": "towel"}, LIST, 0.0, []),
    ({"kind": "first_line", "word": "list"}, "\n\n  My list:\nlist", 1.0, ["list"]),
    ({"kind": "first_line", "word": "towel"}, "\n\n  My list:\ntowel", 0.0, ["  My list:"]),
    ({"kind": "first_line", "word": "towel"}, " \n ", 0.0, []),
    ({"kind": "question"}, "Why? And how?", 1.0, ["?", "?"]),
    ({"kind": "question"}, "No.", 0.0, []),
    ({"kind": "exclaim"}, LIST, 1.0, ["!", "!"]),
    ({"kind": "number"}, "At 10 to 7.", 1.0, ["10", "7"]),
    ({"kind": "number"}, "ten", 0.0, []),
]


@pytest.mark.parametrize("item, reply, value, evidence", CASES)
def test_each_item_kind_checks_its_part_and_states_its_evidence(item, reply, value, evidence):
    got, ev, reason = run(item, reply)
    assert (got, ev) == (value, evidence)
    assert bool(reason) == (value == 0.0)  # a zero says why


def test_every_kind_is_tested():
    assert {c[0]["kind"] for c in CASES} == set(KINDS)


def test_reasons_say_what_was_found():
    assert run({"kind": "bullets", "count": 4, "relation": "at least"}, LIST)[2] == \
        "3 bullet points, needs at least 4"
    assert run({"kind": "avoid", "word": "towel"}, "towel, Towel")[2] == "uses 'towel' 2 times"
    assert run({"kind": "bullet_mentions", "bullet": 5, "word": "x"}, LIST)[2] == \
        "there is no bullet point 5 (3 bullet points)"


@pytest.mark.parametrize("reply", ["\x00" * 10, "a\x00towel\x00", "\ud800 towel", "- " * 300_000,
                                   "towel " * 200_000, "\n" * 100_000])
def test_any_reply_scores_without_raising(reply):
    ex = get_family("checklist").examples()[0]
    scores = get_family("checklist").score(ex, reply)
    assert set(scores) == set(get_family("checklist").reward_names(ex))
    assert all(s.value in (0.0, 1.0) and (s.value == 1.0 or s.reason) for s in scores.values())


def test_the_built_in_checklists():
    fam = get_family("checklist")
    exs = fam.examples()
    assert len(exs) >= 40 and len({e.id for e in exs}) == len(exs)
    assert all(len(fam.reward_names(e)) == MAX_ITEMS for e in exs)
    ex = fam.example("beach")
    assert ex.prompt.splitlines()[:3] == ["Write a packing list for a day at the beach.", 'Mention "towel".',
                                         'Mention "water".']
    assert fam.replay_prompt(ex) == "Write a packing list for a day at the beach."
    info = fam.rule_info(ex)
    assert list(info) == fam.reward_names(ex) and info["mention:towel"] == 'Mention "towel".'
    # P_all (the template filled with every item) is the prompt the policy was sampled under
    from mrtpo.templates import Template

    t = Template.from_dict(fam.template)
    assert t.fill(fam.replay_prompt(ex), info) == ex.prompt


def test_items_k_takes_the_first_k_items_of_every_example():
    fam = get_family("checklist")
    exs = fam.examples()[:3]
    for k in (1, 2, 4, 8):
        got = fam.with_items(exs, k)
        assert [fam.reward_names(e) for e in got] == [fam.reward_names(e)[:k] for e in exs]
        assert [e.prompt.count("\n") for e in got] == [k] * 3
    assert fam.examples()[0].prompt == exs[0].prompt  # the built-in examples are not changed
    for bad in (0, 9, -1, True, "4"):
        with pytest.raises(MrtpoError, match="items must be an integer from 1 to 8"):
            fam.with_items(exs, bad)
    short = ChecklistTask().parse_example({"id": "s", "task": "t", "items": [{"kind": "question"}]})
    with pytest.raises(MrtpoError, match="example 's' has 1 item; items 2 asks for more"):
        fam.with_items([short], 2)


GOOD = {"id": "x", "task": "Write a list.", "items": [{"kind": "mention", "word": "towel"}, {"kind": "question"}]}


def _bad(**change):
    line = json.loads(json.dumps(GOOD))
    for k, v in change.items():
        if v is None:
            del line[k]
        else:
            line[k] = v
    return line


@pytest.mark.parametrize("line, field, problem", [
    (_bad(items=[{"kind": "shout"}]), "items[0].kind", "unknown item kind 'shout' (kinds: mention, avoid"),
    (_bad(items=[{"kind": "mention"}]), "items[0].word", "missing (required by a 'mention' item)"),
    (_bad(items=[{"word": "x"}]), "items[0].kind", "missing"),
    (_bad(items=[]), "items", "must be a list of 1 to 8 items, got 0"),
    (_bad(items=[{"kind": "question", "id": f"q{i}"} for i in range(9)]), "items",
     "must be a list of 1 to 8 items, got 9"),
    (_bad(items=[{"kind": "question"}, {"kind": "question"}]), "items[1].id",
     "duplicate item id 'question' (also items[0]); each item is its own reward"),
    (_bad(items=[{"kind": "bullets", "count": 0, "relation": "at least"}]), "items[0].count",
     "must be an integer from 1 to 50, got 0"),
    (_bad(items=[{"kind": "bullets", "count": 2, "relation": "more"}]), "items[0].relation", "must be one of"),
    (_bad(items=[{"kind": "mention", "word": "a\nb"}]), "items[0].word", "must be a non-empty one-line string"),
    (_bad(items=[{"kind": "mention", "word": "a", "size": 2}]), "items[0].size", "unknown field for a 'mention'"),
    (_bad(task=""), "task", "must be a non-empty string"),
    (_bad(id=None), "id", "missing"),
    (_bad(items="towel"), "items", "must be a list of 1 to 8 items, got str"),
])
def test_a_malformed_checklist_file_names_the_line_and_field(tmp_path, line, field, problem):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(GOOD | {"id": "ok"}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(TaskFileError) as e:
        get_family("checklist").load_examples(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: line 2: field '{field}': ") and problem in msg


def test_a_duplicate_example_id_names_both_lines(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(TaskFileError, match="line 2: field 'id': duplicate id 'x' \\(also on line 1\\)"):
        get_family("checklist").load_examples(path)


def test_a_users_checklist_with_own_ids():
    ex = ChecklistTask().parse_example({"id": 7, "task": "Write.", "items": [
        {"kind": "mention", "word": "tea", "id": "tea"}, {"kind": "bullet_mentions", "bullet": 2, "word": "cup"}]})
    fam = get_family("checklist")
    assert ex.id == "7" and fam.reward_names(ex) == ["tea", "bullet_mentions:2:cup"]
    assert ex.prompt == 'Write.\nMention "tea".\nBullet point 2 must mention "cup".'
    sc = fam.score(ex, "- tea\n- a cup")
    assert {k: v.value for k, v in sc.items()} == {"tea": 1.0, "bullet_mentions:2:cup": 1.0}
    assert fam.verifier_info(ex, "- tea\n- a cup", sc, "quoted")["tea"] == 'Mention "tea". The checker read: "- tea".'
