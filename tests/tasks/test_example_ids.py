"""Every example loader refuses an id given twice (file and both rows named), an empty file, and a benchmark of
another task (issue 33, items 4 and 15)."""
from __future__ import annotations

import json

import pytest

from mrtpo.errors import MrtpoError, TaskFileError
from mrtpo.tasks import get_family
from mrtpo.tasks.base import sample_data
from tests.tasks.test_sql_bench import QUESTIONS, _db


def _first_line(*parts):
    return json.loads(sample_data(*parts).read_text(encoding="utf-8").splitlines()[0])


SQL = {"id": "q1", "schema_sql": "CREATE TABLE t (a INT); INSERT INTO t VALUES (1);", "question": "?",
       "reference": "SELECT a FROM t"}
IFEVAL = {"key": 1000, "prompt": "Write a poem. Do not use any commas.", "instruction_id_list":
          ["punctuation:no_comma"], "kwargs": [{}]}


@pytest.mark.parametrize("family, line, field", [
    ("sql", SQL, "id"),
    ("instructions", None, "id"),
    ("instructions", IFEVAL, "key"),
    ("tools", None, "id"),
])
def test_jsonl_ids_given_twice_are_refused_naming_both_lines(tmp_path, family, line, field):
    """IFEval's `key` twice (and any family's `id` twice) was accepted: `score` took the last, `sample` the first."""
    if line is None:
        line = _first_line(*{"instructions": ("instructions", "prompts.jsonl"),
                             "tools": ("tools", "examples.jsonl")}[family])
    other = dict(line, **({"key": 7} if "key" in line else {"id": "other"}))
    path = tmp_path / "ex.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in (line, other, line)) + "\n")
    with pytest.raises(TaskFileError) as e:
        get_family(family).load_examples(path)
    ex_id = str(line.get("key", line.get("id")))
    assert str(e.value) == (f"{path}: line 3: field '{field}': duplicate id {ex_id!r} (also on line 1); every example "
                            f"needs its own id")


def test_an_empty_examples_file_says_so(tmp_path):
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n\n  \n")):
        path = tmp_path / name
        path.write_text(text)
        for family in ("sql", "instructions", "tools", "checklist"):
            with pytest.raises(TaskFileError) as e:
                get_family(family).load_examples(path)
            assert str(e.value) == f"{path}: the examples file is empty (no examples in it)"


def _bird(tmp_path, questions):
    folder = tmp_path / "bird"
    _db(folder / "dev_databases" / "shop" / "shop.sqlite")
    (folder / "dev.json").write_text(json.dumps(questions))
    return folder


def test_bird_question_ids_given_twice_are_refused(tmp_path):
    q = [{"question_id": qid, "db_id": "shop", "question": text, "SQL": sql}
         for qid, (text, sql) in zip([3, 4, 3], QUESTIONS)]
    folder = _bird(tmp_path, q)
    with pytest.raises(MrtpoError) as e:
        get_family("sql").load_examples(f"bird:{folder}")
    assert str(e.value) == (f"{folder / 'dev.json'}: questions 1 and 3 have the same id 'bird-3' (question 1 has "
                            f"question_id 3; question 3 has question_id 3); every question needs its own id: give "
                            f"each its own question_id")


def test_bird_position_colliding_with_a_question_id_is_refused(tmp_path):
    """A BIRD question without an id was `bird-<position>`, the id of another question: bird-1 was two questions."""
    q = [{"question_id": 1, "db_id": "shop", "question": QUESTIONS[0][0], "SQL": QUESTIONS[0][1]},
         {"db_id": "shop", "question": QUESTIONS[1][0], "SQL": QUESTIONS[1][1]}]  # position 1, no id: bird-1
    folder = _bird(tmp_path, q)
    with pytest.raises(MrtpoError, match=r"questions 1 and 2 have the same id 'bird-1' \(question 1 has question_id "
                                         r"1; question 2 has no question_id, so it is named by its position 1\)"):
        get_family("sql").load_examples(f"bird:{folder}")
    q[1]["question_id"] = 2
    (folder / "dev.json").write_text(json.dumps(q))
    assert [e.id for e in get_family("sql").load_examples(f"bird:{folder}")] == ["bird-1", "bird-2"]


def test_benchmark_of_another_task_names_the_task():
    for family, spec, owner in (("sql", "bfcl:parallel", "tools"), ("tools", "bird:x", "sql"),
                                ("instructions", "spider:x", "sql"), ("tools", "ifeval:x.jsonl", "instructions")):
        with pytest.raises(MrtpoError, match=f"examples belong to the {owner} task \\(--task {owner}\\), not to "
                                             f"'{family}'"):
            get_family(family).load_examples(spec)


def test_ifeval_prefix_reads_the_file(tmp_path):
    path = tmp_path / "input_data.jsonl"
    path.write_text(json.dumps(IFEVAL) + "\n")
    assert [e.id for e in get_family("instructions").load_examples(f"ifeval:{path}")] == ["1000"]
