"""Following a growing run log: each poll gives the complete new steps and never reads an old one again."""
import json
import shutil
from pathlib import Path

from mrtpo.creditlog import CreditLogWriter
from mrtpo.integrations.run_follow import RunFollower
from tests.creditlog.test_credit_log import _credit, _rows

FIX = Path(__file__).resolve().parent / "fixtures"


def test_follow_a_credit_log(tmp_path):
    R, mask, credit = _credit()
    w = CreditLogWriter(tmp_path / "log", {"rewards": ["format", "correct"]})
    f = RunFollower(tmp_path / "log")
    assert f.poll() == []
    for s in (1, 2):
        w.write_step(s, _rows(s, R, mask, credit))
    assert [s.step for s in f.poll()] == [1, 2] and f.fmt == "credit-log"
    (tmp_path / "log" / "step-000001.jsonl").write_text("garbage\n")  # an old step is never read again
    w.write_step(3, _rows(3, R, mask, credit))
    assert [s.step for s in f.poll()] == [3] and f.poll() == []


def test_follow_a_prime_rl_export(tmp_path):
    shutil.copytree(FIX / "prime_rl", tmp_path / "out")
    f = RunFollower(tmp_path / "out")
    assert [s.step for s in f.poll()] == [1, 2] and f.fmt == "prime-rl"
    assert f.poll() == []  # step 3 is still being written
    (tmp_path / "out" / "token_exports" / "step_1" / "rank_0.jsonl").write_text("garbage\n")
    (tmp_path / "out" / "token_exports" / "step_3" / "STABLE").touch()
    assert [s.step for s in f.poll()] == [3]


def test_follow_a_growing_board_file(tmp_path):
    rows = [json.loads(x) for p in sorted((FIX / "board").glob("*.jsonl")) for x in p.read_text().splitlines()]
    s1 = [r for r in rows if r["step"] == 1]
    s2 = [r for r in rows if r["step"] == 2]
    log = tmp_path / "board.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in s1))
    f = RunFollower(log, fmt="board")
    assert f.poll() == []  # step 1 is the newest: another rank may still append to it
    head = json.dumps(s2[0])
    with open(log, "a") as fh:
        fh.write(head[:20])  # a line being written: not read yet
    assert f.poll() == []
    old = log.read_bytes()
    n = old.index(b"\n")
    log.write_bytes(b"x" * n + old[n:])  # the first line is not read again: garbling it changes nothing
    with open(log, "a") as fh:
        fh.write(head[20:] + "\n")
    (st,) = f.poll()  # a row of step 2 is whole: step 1 is complete
    assert st.step == 1 and len(st.rows) == 4 and sorted(r.row for r in st.rows) == [1, 2, 3, 4]
    assert f.poll() == []
    (st2,) = f.poll(final=True)  # the run is over: its last step too
    assert st2.step == 2 and st2.rows[0].row == 5 and st2.rows[0].completion == "Apple 🍎"
    # a bad row is skipped with a problem naming the file and the row; the follower moves on past it
    with open(log, "a") as fh:
        fh.write('{"prompt": "p"}\n' + "".join(json.dumps({**s2[0], "step": s}) + "\n" for s in (3, 4)))
    (st3,) = f.poll()
    assert st3.step == 3 and [r.row for r in st3.rows] == [7]
    assert [str(e) for e in f.problems] == [f"{log}: row 6: field 'response': missing"]


def test_follow_trl_completions_and_verl_dumps(tmp_path):
    import pandas as pd

    out = tmp_path / "completions"
    out.mkdir()

    def log(step):
        pd.DataFrame({"step": [step, step], "prompt": ["q", "q"], "completion": ["a", "b"], "acc": [1.0, 0.0],
                      "advantage": [0.7, -0.7]}).to_parquet(out / f"completions_{step:05d}.parquet")

    log(1)
    f = RunFollower(out)
    assert [s.step for s in f.poll()] == [1] and f.fmt == "trl"
    (out / "completions_00002.parquet").write_bytes(b"PAR1 half")  # being written
    assert f.poll() == []
    log(2)
    (out / "completions_00001.parquet").write_bytes(b"garbage")  # read already: never again
    assert [s.step for s in f.poll()] == [2] and f.poll() == []
    v = tmp_path / "verl"
    v.mkdir()
    (v / "1.jsonl").write_text('{"input": "q", "output": "a", "score": 1, "step": 1}\n')
    g = RunFollower(v)
    assert [s.step for s in g.poll()] == [1] and g.fmt == "verl"
    (v / "2.jsonl").write_text('{"input": "q", "output": "a", "score": 0, "step": 2}\n')
    (v / "10.jsonl").write_text('{"input": "q", "output": "a", "score": 0, "step": 10}\n')
    assert [s.step for s in g.poll()] == [2, 10]
