"""The SQL sandbox: hostile queries get reward 0 with a reason, quickly, and change nothing."""
from __future__ import annotations

import os
import time

import pytest

from mrtpo.tasks import get_family, sql_sandbox
from mrtpo.tasks.sql import bundled_db, script_db
from mrtpo.tasks.sql_sandbox import Database, SqlRunError

HOSTILE = {
    "drop": "DROP TABLE customers",
    "delete": "DELETE FROM customers",
    "insert": "INSERT INTO customers VALUES (99, 'Eve', 'X', 'Y', '2024-01-01')",
    "update": "UPDATE products SET price = 0",
    "attach": "ATTACH DATABASE '/tmp/x.db' AS x",
    "pragma": "PRAGMA writable_schema=1",
    "load_extension": "SELECT load_extension('x')",
    "temp_table": "CREATE TEMP TABLE t (a)",
    "chained": "SELECT 1; DROP TABLE customers",
    "endless_cte": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c",
    "endless_cte_count": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
    "cross_join_rows": "SELECT * FROM customers a, customers b, customers c",
    "cross_join_count": "SELECT count(*) FROM customers a, customers b, customers c, customers d, customers e, customers f",
    "randomblob": "SELECT randomblob(1e9)",
    "zeroblob": "SELECT length(zeroblob(1000000000))",
    "vacuum_into": "VACUUM INTO '/tmp/mrtpo_vacuum_test.db'",
    "long_input": "SELECT " + "1+" * 50_000 + "1",
    "sqlite_version": "SELECT sqlite_version()",
    "temp_schema": "SELECT * FROM temp.sqlite_master",
}


@pytest.fixture(scope="module")
def task():
    return get_family("sql")


@pytest.fixture(scope="module")
def shop_example(task):
    return task.example("shop-01")


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_query_scores_zero_fast_and_changes_nothing(task, shop_example, name):
    sql = HOSTILE[name]
    db = bundled_db("shop")
    before = db.content_hash()
    t0 = time.perf_counter()
    scores = task.score(shop_example, f"```sql\n{sql}\n```")
    elapsed = time.perf_counter() - t0
    assert scores["correct"].value == 0.0
    assert scores["correct"].reason.startswith("the query failed: ")
    assert elapsed < 2.0, f"{name} took {elapsed:.2f} s"
    assert db.content_hash() == before
    assert not os.path.exists("/tmp/mrtpo_vacuum_test.db")


def test_reasons_name_the_problem():
    db = bundled_db("shop")
    reasons = {}
    for name, sql in HOSTILE.items():
        with pytest.raises(SqlRunError) as e:
            db.run(sql)
        reasons[name] = str(e.value)
    assert "only one statement" in reasons["chained"]
    assert "DROP" in reasons["drop"]
    assert reasons["endless_cte"] == "returned more than 1000 rows"
    assert reasons["cross_join_rows"] == "returned more than 1000 rows"
    assert "time limit" in reasons["endless_cte_count"]
    assert "time limit" in reasons["cross_join_count"]
    assert "load_extension" in reasons["load_extension"]
    assert "randomblob" in reasons["randomblob"]
    assert "too long" in reasons["long_input"]
    assert "temp" in reasons["temp_schema"]


def test_attach_creates_no_file(tmp_path):
    db = bundled_db("shop")
    target = tmp_path / "x.db"
    with pytest.raises(SqlRunError):
        db.run(f"ATTACH DATABASE '{target}' AS x")
    with pytest.raises(SqlRunError):
        db.run(f"VACUUM INTO '{target}'")
    assert not target.exists()


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE customers", "DELETE FROM customers", "UPDATE products SET price = 0",
        "INSERT INTO customers VALUES (99, 'Eve', 'X', 'Y', '2024-01-01')", "ATTACH DATABASE '/tmp/x.db' AS x",
        "PRAGMA writable_schema=1", "CREATE TEMP TABLE t (a)", "CREATE VIEW v AS SELECT 1", "VACUUM INTO '/tmp/x.db'",
        "BEGIN", "SELECT 1; DROP TABLE customers",
    ],
)
def test_deeper_layers_hold_without_the_text_precheck(monkeypatch, sql):
    """With the SELECT-only pre-check switched off, authorizer + read-only connection still refuse writes."""
    monkeypatch.setattr(sql_sandbox, "precheck", lambda s: None)
    db = bundled_db("shop")
    before = db.content_hash()
    try:
        result = db.run(sql)
        assert result.rows == [(1,)]  # only the chained case runs: its first statement alone
    except SqlRunError as e:
        assert "not allowed" in str(e) or "readonly" in str(e)
    assert db.content_hash() == before
    assert not os.path.exists("/tmp/x.db")


def test_value_length_limit_stops_string_bombs():
    db = bundled_db("shop")
    with pytest.raises(SqlRunError, match="exceeds"):
        db.run("WITH RECURSIVE c(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM c) SELECT length(s) FROM c")


def test_ordinary_queries_still_work():
    db = bundled_db("school")
    assert db.run("SELECT COUNT(*) FROM students").rows == [(30,)]
    assert db.run("SELECT 1; -- done").rows == [(1,)]
    assert db.run("select 'a;b' as x;").rows == [("a;b",)]
    assert db.run("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 3) SELECT x FROM c").rows == [(1,), (2,), (3,)]
    assert db.run("SELECT name, RANK() OVER (ORDER BY year DESC) FROM students LIMIT 1").columns == ["name", "RANK() OVER (ORDER BY year DESC)"]


def test_build_script_is_sandboxed_too(tmp_path):
    target = tmp_path / "y.db"
    for script in (f"ATTACH DATABASE '{target}' AS y; CREATE TABLE y.t (a);", "PRAGMA writable_schema=1; CREATE TABLE t (a);",
                   "CREATE TABLE t (a); INSERT INTO t SELECT load_extension('x');"):
        with pytest.raises(SqlRunError, match="not allowed"):
            Database("bad", script)
    assert not target.exists()
    with pytest.raises(SqlRunError, match="no table"):
        Database("empty", "SELECT 1;")


def test_databases_are_cached_and_isolated():
    assert bundled_db("shop") is bundled_db("shop")
    a, b = script_db("CREATE TABLE t (x); INSERT INTO t VALUES (1);"), script_db("CREATE TABLE t (x); INSERT INTO t VALUES (2);")
    assert a.run("SELECT x FROM t").rows == [(1,)]
    assert b.run("SELECT x FROM t").rows == [(2,)]
    t0 = time.perf_counter()
    Database("shop-again", bundled_db("shop").script)
    assert time.perf_counter() - t0 < 0.05
