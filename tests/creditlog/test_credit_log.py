"""The credit log: rows from a hand-made credit step written and read back (the sums hold in the file), whole files
only while writing, polling reads only new steps, and every bad input named by file, row and field."""
import json
import threading

import pytest
import torch

from mrtpo.core.credit import CreditConfig, assign_credit
from mrtpo.creditlog import (
    CreditLogConfig,
    CreditLogError,
    CreditLogFollower,
    CreditLogWriter,
    credit_fields,
    read_credit_log,
    step_file,
)
from mrtpo.errors import MrtpoError

NAMES = ["format", "correct"]


def _credit(step_beta=0.5):
    """Two groups of 2 responses, K = 2 rewards, T = 4 (the second response of each group has 3 tokens)."""
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    rho = torch.tensor([[2.0, 1.0, 0.5, 0.5], [0.0, 1.5, 1.5, 1.0]]).expand(4, 2, 4).clone()
    rho[1] = torch.tensor([[3.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    rho[3] = torch.tensor([[1.5, 1.5, 0.0, 1.0], [0.0, 0.0, 3.0, 1.0]])
    cfg = CreditConfig(method="mrtpo", beta=step_beta, warmup=None)
    return R, mask, assign_credit(R, rho, mask, cfg, group_size=2)


def _rows(step, R, mask, credit, prompt="Say hi", texts=("ab, c", "xyz", "hi!!", "no")):
    rows = []
    for i in range(4):
        T = int(mask[i].sum())
        ids = list(range(10 + i, 10 + i + T))
        text = texts[i]
        cuts = [min(len(text), j * len(text) // T) for j in range(T + 1)]
        rows.append({"step": step, "time": 1.5e9, "group": i // 2, "index": i % 2, "prompt": prompt,
                     "completion": text, "token_ids": ids, "offsets": [[cuts[j], cuts[j + 1]] for j in range(T)],
                     "reasons": None, "logprob": [-0.5] * T, "entropy": [1.0] * T, "ref_logprob": None, "kl": None,
                     **credit_fields(credit, i, NAMES, T, R[i].tolist(), replayed=["format"])})
    return rows


def _writer(tmp_path):
    return CreditLogWriter(tmp_path / "log", {"source": "test", "model": "tiny-random", "method": "mrtpo",
                                              "measure": "js", "info": "rule", "group_size": 2, "rewards": NAMES})


def test_rows_round_trip_and_the_sums_hold_in_the_file(tmp_path):
    R, mask, credit = _credit()
    w = _writer(tmp_path)
    path = w.write_step(3, _rows(3, R, mask, credit, prompt="Émoji 🎉 \u2028 <script>"))
    assert path.name == "step-000003.jsonl" and step_file(12) == "step-000012.jsonl"
    log = read_credit_log(tmp_path / "log")
    assert log.meta["format"] == "mrtpo-credit-log" and log.meta["version"] == 1 and log.meta["rewards"] == NAMES
    (st,) = log.steps
    assert st.step == 3 and [len(g) for g in st.groups] == [2, 2]
    for i, r in enumerate(st.rows):
        T = int(mask[i].sum())
        assert r.prompt == "Émoji 🎉 \u2028 <script>" and len(r.token_ids) == T == len(r.tokens)
        assert "".join(r.tokens) == r.completion
        A = torch.tensor(r.token_advantages)
        torch.testing.assert_close(A, credit.tokens[i, :T], atol=1e-6, rtol=1e-6)  # what the trainer computed
        per = torch.tensor([r.reward_token_advantages[k] for k in NAMES])  # (K, T)
        torch.testing.assert_close(per, credit.per_reward[i, :, :T], atol=1e-6, rtol=1e-6)
        # Σ_k A'_ikt − center / scale = A_it; token mean of A'_ik = Â_ik / scale; token mean of A_i = final_i
        torch.testing.assert_close(per.sum(0) - r.center / r.scale, A, atol=1e-5, rtol=0)
        for j, k in enumerate(NAMES):
            assert per[j].mean().item() == pytest.approx(r.reward_advantages[k] / r.scale, abs=1e-5)
        assert A.mean().item() == pytest.approx(r.advantage, abs=1e-5)
        assert r.relevance["correct"] is None and len(r.relevance["format"]) == T
        assert r.rewards == dict(zip(NAMES, R[i].tolist())) and r.beta == 0.5
    # hand-worked: response 0, reward 'format': GDPO's Â = (1 − 0.5) / (σ + 1e-4), σ = std(1, 0) = 1/√2 (Bessel)
    assert st.rows[0].reward_advantages["format"] == pytest.approx(0.5 / (2 ** -0.5 + 1e-4), rel=1e-6)


def test_a_reader_during_a_write_sees_whole_files_only(tmp_path, monkeypatch):
    R, mask, credit = _credit()
    w = _writer(tmp_path)
    w.write_step(1, _rows(1, R, mask, credit))
    seen = []
    import mrtpo.jsonl as J

    real = J.os.replace

    def replace(src, dst):  # the new file is written in full, not yet in place: a reader now sees step 1 only
        seen.append([s.step for s in read_credit_log(tmp_path / "log").steps])
        real(src, dst)

    monkeypatch.setattr(J.os, "replace", replace)
    w.write_step(2, _rows(2, R, mask, credit))
    monkeypatch.undo()
    assert seen == [[1]]
    assert [s.step for s in read_credit_log(tmp_path / "log").steps] == [1, 2]
    # and a reader polling while a thread writes 20 steps never meets a torn row
    errors, done = [], threading.Event()

    def write():
        for s in range(3, 23):
            w.write_step(s, _rows(s, R, mask, credit, texts=("x" * 4000, "y" * 300, "z" * 50, "w")))
        done.set()

    t = threading.Thread(target=write)
    t.start()
    f = CreditLogFollower(tmp_path / "log")
    got = []
    while not done.is_set() or not got or got[-1] < 22:
        try:
            got += [s.step for s in f.poll()]
        except MrtpoError as e:  # pragma: no cover - what the test guards against
            errors.append(str(e))
            break
    t.join()
    assert not errors and got == list(range(1, 23))


def test_polling_reads_only_the_new_steps(tmp_path, monkeypatch):
    R, mask, credit = _credit()
    w = _writer(tmp_path)
    for s in (1, 2):
        w.write_step(s, _rows(s, R, mask, credit))
    f = CreditLogFollower(tmp_path / "log")
    assert [s.step for s in f.poll()] == [1, 2] and f.poll() == []
    w.write_step(3, _rows(3, R, mask, credit))
    import mrtpo.creditlog.files as F

    opened = []
    real = F.open_log_file
    monkeypatch.setattr(F, "open_log_file", lambda p: opened.append(p.name) or real(p))
    assert [s.step for s in f.poll()] == [3] and opened == ["step-000003.jsonl"]
    assert [s.step for s in read_credit_log(tmp_path / "log", after_step=1).steps] == [2, 3]
    (tmp_path / "log" / ".step-000004.jsonl.abc.tmp").write_text("{torn")  # a writer's temp file: ignored
    assert f.poll() == []


def _bad(tmp_path, edit, line=1):
    R, mask, credit = _credit()
    w = _writer(tmp_path)
    p = w.write_step(5, _rows(5, R, mask, credit))
    lines = p.read_text().splitlines()
    lines[line - 1] = edit(json.loads(lines[line - 1]))
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(CreditLogError) as e:
        read_credit_log(tmp_path / "log")
    return str(e.value)


def test_bad_rows_are_named_by_file_row_and_field(tmp_path):
    def drop(k):
        return lambda o: json.dumps({a: b for a, b in o.items() if a != k})

    def put(k, v):
        return lambda o: json.dumps({**o, k: v})

    msg = _bad(tmp_path / "a", drop("rewards"), line=2)
    assert msg.endswith("step-000005.jsonl: row 2: field 'rewards': missing")
    assert "field 'token_advantages': token_advantages has 2 values for 4 tokens" in \
        _bad(tmp_path / "b", put("token_advantages", [1.0, 2.0]))
    assert ("row 3: field 'rewards': reward 'format': must be a number, true / false (1 / 0) or null (not scored), "
            "got 'high'") in _bad(tmp_path / "c", put("rewards", {"format": "high", "correct": 1}), line=3)
    assert "field 'reward_token_advantages': reward_token_advantages.format has 1 value for 4 tokens" in \
        _bad(tmp_path / "d", lambda o: json.dumps({**o, "reward_token_advantages": {"format": [1], "correct": []}}))
    assert "row 1: not valid JSON" in _bad(tmp_path / "e", lambda o: "{not json")
    assert "row 1: field 'step': is 7 in the file of step 5" in _bad(tmp_path / "f", put("step", 7))
    assert "field 'offsets': a span ends at 99" in _bad(tmp_path / "g", put("offsets", [[0, 1], [1, 2], [2, 3],
                                                                                         [3, 99]]))


def test_bad_meta_and_folders(tmp_path):
    with pytest.raises(CreditLogError, match="no such folder"):
        read_credit_log(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CreditLogError, match="no meta.json: not a credit log"):
        read_credit_log(tmp_path / "empty")
    _writer(tmp_path)
    meta = tmp_path / "log" / "meta.json"
    m = json.loads(meta.read_text())
    meta.write_text(json.dumps({**m, "version": 2}))
    with pytest.raises(CreditLogError, match=r"meta.json: field 'version': version 2 was written by a newer mrtpo; "
                                             r"this one reads version 1"):
        read_credit_log(tmp_path / "log")
    meta.write_text(json.dumps({**m, "format": "board"}))
    with pytest.raises(CreditLogError, match="field 'format': must be 'mrtpo-credit-log', got 'board': not a credit"):
        read_credit_log(tmp_path / "log")
    meta.write_text("[1, 2")
    with pytest.raises(CreditLogError, match="meta.json: not valid JSON"):
        read_credit_log(tmp_path / "log")
    with pytest.raises(MrtpoError, match="bad credit log config: credit_log_groups must be >= 1, not 0"):
        CreditLogConfig(credit_log_groups=0)


def test_the_writer_refuses_a_bad_row(tmp_path):
    R, mask, credit = _credit()
    rows = _rows(1, R, mask, credit)
    del rows[1]["prompt"]
    with pytest.raises(CreditLogError, match="step-000001.jsonl: row 2: field 'prompt': missing"):
        _writer(tmp_path).write_step(1, rows)
    assert not (tmp_path / "log" / "step-000001.jsonl").exists()


def test_a_second_writer_of_the_same_run_continues_the_log(tmp_path):
    """The same run resumed continues its log (creation time kept, reward names added); another run is refused
    (tests/creditlog/test_owner.py); a log of another format there is refused too."""
    from mrtpo.creditlog import LogOwner

    R, mask, credit = _credit()
    me = LogOwner("run-1", "test", {"output_dir": "/x"})
    w = CreditLogWriter(tmp_path / "log", {"source": "test", "rewards": NAMES}, me)
    w.write_step(1, _rows(1, R, mask, credit))
    created = w.meta["created"]
    w2 = CreditLogWriter(tmp_path / "log", {"source": "test", "rewards": ["other"]},
                         LogOwner("run-1", "test", {"output_dir": "/x"}, resume=True))  # a resumed run
    assert w2.meta["created"] == created and w2.meta["rewards"] == NAMES + ["other"] and w2.meta["run"] == "run-1"
    w2.write_step(2, _rows(2, R, mask, credit))
    log = read_credit_log(tmp_path / "log")
    assert [s.step for s in log.steps] == [1, 2] and {r.run for s in log.steps for r in s.rows} == {"run-1"}
    meta = tmp_path / "log" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "format": "something-else"}))
    with pytest.raises(CreditLogError, match="meta.json: field 'format': must be 'mrtpo-credit-log'"):
        CreditLogWriter(tmp_path / "log", {"source": "test", "rewards": NAMES}, me)
