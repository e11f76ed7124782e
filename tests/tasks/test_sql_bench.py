"""Spider / BIRD folders as users have them on disk (spider:DIR, bird:DIR) and the three ways of comparing rows
(strict, spider, bird), on small hand-built databases where they differ; the user's files are never written."""
from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from mrtpo.errors import MrtpoError, TaskFileError
from mrtpo.tasks import apply_options, get_family
from mrtpo.tasks.sql_compare import compare_rows, order_matters

ITEMS = [(1, "pen", 3.0, "Paris"), (2, "ink", 1.5, "Lyon"), (3, "cap", 3.0, "Paris"), (4, "mug", 7.25, "Nice")]


def _db(path):
    path.parent.mkdir(parents=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL, city TEXT)")
    con.executemany("INSERT INTO items VALUES (?, ?, ?, ?)", ITEMS)
    con.commit()
    con.close()


QUESTIONS = [
    ("Names and prices of the items.", "SELECT name, price FROM items"),
    ("The cities of the items.", "SELECT city FROM items"),
    ("Item names from the cheapest.", "SELECT name FROM items ORDER BY price, id"),
    ("The two cheapest items' names.", "SELECT name FROM items WHERE id IN (SELECT id FROM items ORDER BY price, "
                                       "id LIMIT 2)"),
    ("Three tenths.", "SELECT 0.3"),
]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """A Spider folder (dev.json + database/shop/shop.sqlite) and a BIRD one (dev.json + dev_databases/...)."""
    root = tmp_path_factory.mktemp("bench")
    spider, bird = root / "spider", root / "bird"
    _db(spider / "database" / "shop" / "shop.sqlite")
    _db(bird / "dev_databases" / "shop" / "shop.sqlite")
    (spider / "dev.json").write_text(json.dumps([{"db_id": "shop", "question": q, "query": r} for q, r in QUESTIONS]))
    (bird / "dev.json").write_text(json.dumps([
        {"question_id": 10 + i, "db_id": "shop", "question": q, "SQL": r, "evidence": "price is in euros",
         "difficulty": "simple"} for i, (q, r) in enumerate(QUESTIONS)]))
    return spider, bird


@pytest.fixture(scope="module")
def task():
    return get_family("sql")


def correct(task, ex, sql, mode):
    ex = task.with_compare([ex], mode)[0]
    return task.score(ex, f"```sql\n{sql}\n```")["correct"].value


@pytest.mark.parametrize("n, reply, want", [
    (0, "SELECT name, price FROM items", (1, 1, 1)),
    (0, "SELECT price, name FROM items", (0, 1, 0)),  # columns in another order: only Spider permutes them
    (1, "SELECT DISTINCT city FROM items", (0, 0, 1)),  # duplicates dropped: BIRD compares sets
    (2, "SELECT name FROM items ORDER BY price DESC", (0, 0, 1)),  # the reference orders; BIRD never looks
    (3, "SELECT name FROM items WHERE price < 3 OR id = 1 ORDER BY name", (1, 0, 1)),  # "order by" in a subquery
    (4, "SELECT 0.1 + 0.2", (1, 0, 0)),  # strict rounds to 6 decimals; the benchmarks compare exactly
    (4, "SELECT 3 / 10.0", (1, 1, 1)),
])
def test_the_three_comparisons_differ_where_the_benchmarks_do(task, bench, n, reply, want):
    ex = task.load_examples(f"spider:{bench[0]}")[n]
    assert tuple(correct(task, ex, reply, m) for m in ("strict", "spider", "bird")) == want


def test_spider_rule_on_rows():
    gold = [(1, "a", None), (2, "b", None), (2, "b", None)]
    assert compare_rows([("b", 2, None), ("a", 1, None), ("b", 2, None)], gold, "spider", False) == ""
    assert compare_rows([("a", 1, None), ("b", 2, None), ("b", 2, None)], gold, "spider", True) == ""
    assert "wrong order" in compare_rows([("b", 2, None), ("a", 1, None), ("b", 2, None)], gold, "spider", True)
    assert compare_rows([(1, "a", None), (1, "a", None), (2, "b", None)], gold, "spider", False) != ""
    assert compare_rows([], [], "spider", True) == "" and compare_rows([(1,)], [], "spider", False) != ""
    assert compare_rows([("3",)], [(3,)], "spider", False) != "" and compare_rows([(3.0,)], [(3,)], "bird", False) == ""
    assert order_matters("SELECT a FROM (SELECT a FROM t ORDER BY a)", "spider")
    assert not order_matters("SELECT a FROM (SELECT a FROM t ORDER BY a)", "strict")
    assert not order_matters("SELECT a FROM t ORDER BY a", "bird")


def test_spider_and_bird_folders_load(task, bench):
    spider, bird = bench
    s = task.load_examples(f"spider:{spider}")
    assert [e.id for e in s] == [f"spider-{i}" for i in range(len(QUESTIONS))]
    assert s[0].data["compare"] == "spider" and "CREATE TABLE items" in s[0].prompt
    assert QUESTIONS[0][0] in s[0].prompt
    assert task.load_examples(f"spider:{spider / 'dev.json'}")[2].id == "spider-2"  # the file itself
    b = task.load_examples(f"bird:{bird}")
    assert b[0].id == "bird-10" and b[0].data["compare"] == "bird" and b[0].data["difficulty"] == "simple"
    assert "Evidence: price is in euros" in b[0].prompt
    ref = b[2].data["reference"]
    assert task.score(b[2], f"```sql\n{ref}\n```")["correct"].value == 1.0
    info = task.verifier_info(b[1], "```sql\nSELECT 1\n```")["correct"]
    assert "as BIRD compares results" in info
    assert apply_options(task, b, sql_compare="strict")[0].data["compare"] == "strict"
    with pytest.raises(MrtpoError, match="--sql-compare applies to the sql task"):
        apply_options(get_family("tools"), [], sql_compare="bird")


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_users_databases_are_never_written(task, bench):
    spider = bench[0]
    before = _snapshot(spider)
    ex = task.load_examples(f"spider:{spider}")[0]
    for sql in ("SELECT * FROM items", "DELETE FROM items", "DROP TABLE items", "PRAGMA journal_mode=WAL",
                "ATTACH DATABASE 'x.db' AS x", "SELECT 1; UPDATE items SET price = 0",
                "WITH x AS (SELECT 1) INSERT INTO items VALUES (9, 'x', 1, 'y')", "VACUUM INTO 'copy.db'"):
        s = task.score(ex, f"```sql\n{sql}\n```")
        assert s["correct"].value in (0.0, 1.0)
    assert _snapshot(spider) == before  # no journal, no -wal/-shm, the bytes unchanged


def test_broken_benchmark_folders_get_messages(task, bench, tmp_path):
    spider = bench[0]
    with pytest.raises(MrtpoError, match="no such file or folder"):
        task.load_examples(f"spider:{tmp_path / 'none'}")
    with pytest.raises(MrtpoError, match="no dev.json or train_spider.json"):
        task.load_examples(f"spider:{tmp_path}")
    (tmp_path / "dev.json").write_text(json.dumps([{"db_id": "shop", "question": "q", "query": "SELECT 1"}]))
    with pytest.raises(MrtpoError, match="no database/ folder beside dev.json"):
        task.load_examples(f"spider:{tmp_path}")
    (tmp_path / "database" / "shop").mkdir(parents=True)
    with pytest.raises(MrtpoError, match=r"question 1: the database file of db_id 'shop' is missing: .*shop\.sqlite"):
        task.load_examples(f"spider:{tmp_path}")
    (tmp_path / "database" / "shop" / "shop.sqlite").write_text("these are not the tables you are looking for")
    with pytest.raises(MrtpoError, match=r"shop\.sqlite: not a SQLite database"):
        task.load_examples(f"spider:{tmp_path}")
    truncated = (spider / "database" / "shop" / "shop.sqlite").read_bytes()[:100]  # a header, then nothing
    (tmp_path / "database" / "shop" / "shop.sqlite").write_bytes(truncated)
    with pytest.raises(MrtpoError, match=r"shop\.sqlite: cannot be read as a SQLite database"):
        task.load_examples(f"spider:{tmp_path}")
    for items, message in [({"db_id": "shop"}, "question 1: field 'question': missing"),
                           ({"db_id": "../shop", "question": "q", "query": "x"}, "is not a database name"),
                           ({"db_id": "shop", "question": "q", "SQL": "SELECT 1"}, "field 'query': missing"),
                           ("not a list", "expected a JSON list of questions")]:
        (tmp_path / "dev.json").write_text(json.dumps([items] if isinstance(items, dict) else items))
        with pytest.raises(MrtpoError, match=message):
            task.load_examples(f"spider:{tmp_path}")
    (tmp_path / "dev.json").write_text("[{")
    with pytest.raises(MrtpoError, match="dev.json"):
        task.load_examples(f"spider:{tmp_path}")


def test_a_reference_that_fails_is_named_when_scored(task, bench, tmp_path):
    spider = bench[0]
    (tmp_path / "database").symlink_to(spider / "database")
    (tmp_path / "dev.json").write_text(json.dumps([{"db_id": "shop", "question": "q", "query": "SELECT nope"}]))
    ex = task.load_examples(f"spider:{tmp_path}")[0]
    with pytest.raises(MrtpoError, match="example spider-0: its reference query does not run"):
        task.score(ex, "```sql\nSELECT 1\n```")


def test_jsonl_examples_carry_a_comparison(task, tmp_path):
    line = {"id": "q", "schema_sql": "CREATE TABLE t (a INT, b TEXT); INSERT INTO t VALUES (1, 'x');",
            "question": "?", "reference": "SELECT a, b FROM t", "compare": "spider"}
    ex = task.parse_example(line)
    assert ex.data["compare"] == "spider" and task.score(ex, "```sql\nSELECT b, a FROM t\n```")["correct"].value
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({**line, "compare": "exact"}) + "\n")
    with pytest.raises(TaskFileError, match="field 'compare': must be one of strict, spider, bird"):
        task.load_examples(path)
