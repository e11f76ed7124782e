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
    "cross_join_count": ("SELECT count(*) FROM customers a, customers b, customers c, customers d, customers e, "
                         "customers f"),
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
    counted = db.run("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 3) SELECT x FROM c")
    assert counted.rows == [(1,), (2,), (3,)]
    ranked = db.run("SELECT name, RANK() OVER (ORDER BY year DESC) FROM students LIMIT 1")
    assert ranked.columns == ["name", "RANK() OVER (ORDER BY year DESC)"]


def test_build_script_is_sandboxed_too(tmp_path):
    target = tmp_path / "y.db"
    for script in (f"ATTACH DATABASE '{target}' AS y; CREATE TABLE y.t (a);",
                   "PRAGMA writable_schema=1; CREATE TABLE t (a);",
                   "CREATE TABLE t (a); INSERT INTO t SELECT load_extension('x');"):
        with pytest.raises(SqlRunError, match="not allowed"):
            Database("bad", script)
    assert not target.exists()
    with pytest.raises(SqlRunError, match="no table"):
        Database("empty", "SELECT 1;")


def test_databases_are_cached_and_isolated():
    assert bundled_db("shop") is bundled_db("shop")
    a = script_db("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
    b = script_db("CREATE TABLE t (x); INSERT INTO t VALUES (2);")
    assert a.run("SELECT x FROM t").rows == [(1,)]
    assert b.run("SELECT x FROM t").rows == [(2,)]
    t0 = time.perf_counter()
    Database("shop-again", bundled_db("shop").script)
    assert time.perf_counter() - t0 < 0.05


# -- single-call bombs: one SQLite C call that runs long or allocates much, out of the progress handler's reach --
def _doubled(name: str, n: int, ch: str = "a") -> str:
    """CTEs giving ``name(s)``: one string of 2**n copies of ``ch``, built by doubling."""
    return (f"{name}0(s, n) AS (SELECT '{ch}', 0 UNION ALL SELECT s || s, n + 1 FROM {name}0 WHERE n < {n}), "
            f"{name}(s) AS (SELECT s FROM {name}0 WHERE n = {n})")


# (query, reason); before the worker process these ran 30 s to minutes, or took 0.5-1 GB (see the report of issue 11)
SINGLE_CALL_BOMBS = {
    # a 768 KB string against a 32 KB pattern: O(n*m) inside one LIKE / GLOB call
    "like": ("WITH RECURSIVE " + _doubled("h", 18) + ", " + _doubled("p", 14)
             + " SELECT (SELECT s || s || s FROM h) LIKE (SELECT '%' || s || s || 'b' FROM p)", "time limit (1 s)"),
    "glob": ("WITH RECURSIVE " + _doubled("h", 18) + ", " + _doubled("p", 14)
             + " SELECT (SELECT s || s || s FROM h) GLOB (SELECT '*' || s || s || 'b' FROM p)", "time limit (1 s)"),
    # a 994 KB haystack and a 497 KB needle, both just under the 1,000,000-byte value limit: 5 s in plain sqlite3
    # here (512 KB / 256 KB took 1.3 s here and less than the 1 s limit on CI's machine)
    "instr": ("WITH RECURSIVE " + _doubled("h", 19)
              + " SELECT instr((SELECT s || substr(s, 1, 470000) FROM h), (SELECT substr(s, 1, 497000) || 'b' FROM h))",
              "time limit (1 s)"),
    "trim_charset": ("WITH RECURSIVE " + _doubled("h", 19) + ", " + _doubled("p", 16, "b")
                     + " SELECT length(trim((SELECT s FROM h), (SELECT s || 'a' FROM p)))", "time limit (1 s)"),
    # prepare flattens the CTEs into an expression of 2**39 nodes: time and memory before the first step (SQLite's
    # 512 MiB share fills in about 1.1 s, so which limit comes first depends on the machine's load)
    "cte_expr_doubling": ("WITH a0(x) AS (SELECT 1), "
                          + ", ".join(f"a{i}(x) AS (SELECT x + x FROM a{i - 1})" for i in range(1, 40))
                          + " SELECT x FROM a39", "memory limit (1 GiB)|time limit (1 s)"),
    # one 512 KB string 1,900 times in one row
    # (it reaches 1 GiB in about 1 s: on a busy machine the time limit can come first; either bound holds)
    "wide_row": ("WITH RECURSIVE " + _doubled("h", 19) + " SELECT " + ", ".join(["s"] * 1900) + " FROM h",
                 "memory limit (1 GiB)|time limit (1 s)"),
    # 1,000 rows of 512 KB
    "big_result": ("WITH RECURSIVE " + _doubled("h", 19)
                   + ", r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 1000) SELECT s FROM h, r",
                   "the result is larger than 1000000 bytes"),
}


@pytest.mark.parametrize("name", list(SINGLE_CALL_BOMBS))
def test_single_call_bombs_stop_at_their_limit(task, shop_example, name):
    sql, reason = SINGLE_CALL_BOMBS[name]
    db = bundled_db("shop")
    before = db.content_hash()
    t0 = time.perf_counter()
    scores = task.score(shop_example, f"```sql\n{sql}\n```")
    elapsed = time.perf_counter() - t0
    assert scores["correct"].value == 0.0
    assert scores["correct"].reason in [f"the query failed: {r}" for r in reason.split("|")]
    # the limit's second, plus ending a worker that may hold 1 GiB and starting the next, which a busy host slows;
    # without the limits these ran 30 s to minutes
    assert elapsed < sql_sandbox.TIME_LIMIT_S + 1.0, f"{name} took {elapsed:.2f} s"
    assert db.content_hash() == before
    # and the sandbox answers the next query normally
    count = "SELECT COUNT(*) FROM customers"
    assert db.run(count).rows == bundled_db("shop").run(count).rows


def test_a_worker_is_reused_and_replaced_after_a_kill():
    db = bundled_db("shop")
    db.run("SELECT 1")
    pids = {w.proc.pid for w in sql_sandbox._pool._idle}
    db.run("SELECT 2")
    assert {w.proc.pid for w in sql_sandbox._pool._idle} == pids  # reused: no new process per query
    with pytest.raises(SqlRunError, match=r"^time limit \(1 s\)$"):
        db.run(SINGLE_CALL_BOMBS["like"][0])
    assert not pids & {w.proc.pid for w in sql_sandbox._pool._idle}  # the killed one is gone
    assert db.run("SELECT 3").rows == [(3,)]


def test_time_limit_is_the_callers(monkeypatch):
    db = bundled_db("shop")
    t0 = time.perf_counter()
    with pytest.raises(SqlRunError, match=r"^time limit \(0.5 s\)$"):
        db.run(SINGLE_CALL_BOMBS["like"][0], time_limit=0.5)
    assert time.perf_counter() - t0 < 1.0


def test_build_scripts_run_under_the_same_hard_limits(monkeypatch):
    monkeypatch.setattr(sql_sandbox, "BUILD_TIME_LIMIT_S", 1.0)
    like = SINGLE_CALL_BOMBS["like"][0]
    t0 = time.perf_counter()
    with pytest.raises(SqlRunError, match=r"^time limit \(1 s\)$"):
        Database("bomb", f"CREATE TABLE t AS {like};")
    assert time.perf_counter() - t0 < 1.5
    # the memory bomb takes about 1 s to reach 1 GiB here: a looser time limit, so that memory is what stops it
    monkeypatch.setattr(sql_sandbox, "BUILD_TIME_LIMIT_S", 10.0)
    with pytest.raises(SqlRunError, match=r"^memory limit \(1 GiB\)$"):
        Database("bomb", f"CREATE TABLE t AS {SINGLE_CALL_BOMBS['wide_row'][0]};")
    assert bundled_db("shop").run("SELECT COUNT(*) FROM customers").rows[0][0] > 0


def test_worker_process_limits(tmp_path):
    """In a process with the worker's limits, writing a file fails (RLIMIT_FSIZE 0) and so does taking 2 GiB."""
    import subprocess
    import sys

    code = (f"import runpy; worker = runpy.run_path({str(sql_sandbox.WORKER_SCRIPT)!r}, run_name='worker')\n"
            "worker['_limit_process']()\n"
            "try:\n    bytearray(2 << 30); print('allocated')\nexcept MemoryError:\n    print('MemoryError')\n"
            f"try:\n    open({str(tmp_path / 'f')!r}, 'w').write('x' * 10000); print('wrote')\n"
            "except OSError as e:\n    print(e.errno)\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    import errno

    assert out.stdout.split() == ["MemoryError", str(errno.EFBIG)], out.stderr
    assert (tmp_path / "f").stat().st_size == 0


def test_text_that_is_not_sql_text_fails_with_a_reason():
    db = bundled_db("shop")
    with pytest.raises(SqlRunError, match=r"^the query contains a NUL character \(at character 8\)$"):
        db.run("SELECT 1\x00")
    with pytest.raises(SqlRunError, match=r"^the query is not valid text \(lone surrogate '\\ud800' at character 8\)$"):
        db.run("SELECT '\ud800'")
    with pytest.raises(SqlRunError, match="NUL"):
        Database("nul", "CREATE TABLE t (a);\x00")
    with pytest.raises(SqlRunError, match="Could not decode to UTF-8"):
        db.run("SELECT CAST(x'ff' AS TEXT)")


def test_trailing_comments_are_fine():
    db = bundled_db("school")
    for sql in ("SELECT 1 -- done", "SELECT 1; -- done", "SELECT 1; /* x */", "SELECT 1 /* x */",
                "SELECT 1;\n-- a\n/* b */ ;"):
        assert db.run(sql).rows == [(1,)], sql
    for sql, reason in (("SELECT 1 /* open", "incomplete"), ("SELECT 'open", "incomplete"),
                        ("SELECT 1; -- x\nSELECT 2", "one statement")):
        with pytest.raises(SqlRunError, match=reason):
            db.run(sql)


def test_worker_imports_only_the_standard_library():
    import ast
    import sys

    from mrtpo.tasks.sql_sandbox import WORKER_SCRIPT

    tree = ast.parse(WORKER_SCRIPT.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - {"__future__"} <= set(sys.stdlib_module_names), names


def test_concurrent_threads_each_get_a_worker():
    """A bomb in one thread does not hold up the others (the pool gives each its own worker)."""
    import threading

    db = bundled_db("shop")
    expected = db.run("SELECT COUNT(*) FROM orders").rows
    results, times = [], []

    def normal():
        t0 = time.perf_counter()
        for _ in range(20):
            results.append(db.run("SELECT COUNT(*) FROM orders").rows)
        times.append(time.perf_counter() - t0)

    bomb = threading.Thread(target=lambda: pytest.raises(SqlRunError, db.run, SINGLE_CALL_BOMBS["glob"][0]))
    bomb.start()
    time.sleep(0.1)
    threads = [threading.Thread(target=normal) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads + [bomb]:
        t.join()
    assert results == [expected] * 60
    assert max(times) < 1.0  # not queued behind the 1.25 s bomb


def test_a_forked_child_uses_its_own_worker():
    db = bundled_db("shop")
    expected = db.run("SELECT COUNT(*) FROM customers").rows
    pid = os.fork()
    if pid == 0:  # child: the parent's worker pipes are not used; a new worker answers
        ok = False
        try:
            ok = db.run("SELECT COUNT(*) FROM customers").rows == expected
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert db.run("SELECT COUNT(*) FROM customers").rows == expected  # the parent's worker still works
