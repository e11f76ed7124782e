"""Other trainers' token logs read into credit-log rows: OpenRLHF's rl_logging_board JSONL and prime-rl's token
export, on fixtures built from their writers' field lists (fixtures/README.md says where each list came from), and
every bad input named by file, row and field."""
import json
import shutil
from pathlib import Path

import pytest

from mrtpo.creditlog import CreditLogError, CreditLogWriter
from mrtpo.integrations.tool_logs import detect_format, read_board, read_prime_rl, read_run_log

FIX = Path(__file__).resolve().parent / "fixtures"
MOON = "<PAD>Write a line that rhymes with 'moon'."


def test_board_on_its_fixture():
    steps = read_board(FIX / "board")
    assert [s.step for s in steps] == [1, 2]
    s1 = steps[0]
    # step 1: rank 0's two 'moon' rows and rank 1's 'moon' row form one group; 'colour' is another
    assert [(r.group, r.index, r.prompt) for r in s1.rows] == [(0, 0, MOON), (0, 1, MOON), (0, 2, MOON),
                                                              (1, 0, "Name a colour.")]
    r = s1.rows[0]
    assert r.completion == "June is soon.<EOD><PAD>" and r.rewards == {"reward": 1.0}
    assert r.tokens == ["June", " is", " soon", ".", "<EOD>"]  # the trailing <PAD> past the log-probs is dropped
    assert r.logprob == [-1.25, -0.5, -2.0, -0.125, -0.0625]
    assert r.kl == [-0.25, 0.0, 0.5, 0.0, 0.0]  # logprob − ref_logprob, hand-worked from the fixture
    assert r.extra["values"] == [0.1, 0.2, 0.3, 0.2, 0.1] and r.extra["token_rewards"][-1] == 1.0
    assert r.extra["ref_response"] == "Moon and June." and r.extra["ref_reward"] == 0.5
    assert r.token_ids is None and r.token_advantages is None and r.relevance is None and r.entropy is None
    assert steps[1].rows[0].completion == "Apple 🍎" and steps[1].rows[0].kl == [0.0, -1.0]
    assert [s.step for s in read_board(FIX / "board", after_step=1)] == [2]
    assert detect_format(FIX / "board") == "board" and detect_format(FIX / "board" / "rank_1.jsonl") == "board"


def test_prime_rl_on_its_fixture():
    root = FIX / "prime_rl" / "token_exports"
    steps = read_prime_rl(root)
    assert [s.step for s in steps] == [1, 2]  # step 3 has no STABLE file yet: still being written
    r = steps[0].rows[0]
    assert r.token_ids == [7, 8, 9] and r.extra["prompt_ids"] == [101, 102, 103]
    assert r.token_advantages == [0.5, 0.5, 0.5] and r.advantage == 0.5 and r.rewards == {"reward": 1.0}
    assert r.logprob == [-0.5, -1.0, -1.5] and r.entropy == [1.5, 1.25, 1.0]
    assert r.extra["trainer_logprobs"] == pytest.approx([-0.49, -0.99, -1.49])
    assert r.extra["mismatch_kl"] == [0.001] * 3 and r.kl is None and r.ref_logprob is None
    assert r.prompt is None and r.completion is None and r.tokens is None  # no text without a decoder
    # step 2: ranks 0 and 1; two sequences share prompt [101, 104] (one group), the third is another prompt
    assert [(x.group, x.index, x.token_ids) for x in steps[1].rows] == [(0, 0, [11]), (0, 1, [12, 13]), (1, 0, [7])]
    assert [s.step for s in read_prime_rl(root, after_step=1)] == [2]
    assert [s.step for s in read_prime_rl(root / "step_3")] == [3]  # a step folder named directly is read
    dec = read_prime_rl(FIX / "prime_rl", decode=lambda ids: "".join(f"<{i}>" for i in ids))  # the output folder
    assert dec[0].rows[0].prompt == "<101><102><103>" and dec[0].rows[0].tokens == ["<7>", "<8>", "<9>"]
    assert detect_format(FIX / "prime_rl") == "prime-rl"
    assert detect_format(root / "step_1" / "rank_0.jsonl") == "prime-rl"


def test_read_run_log_dispatches(tmp_path):
    w = CreditLogWriter(tmp_path / "log", {"rewards": ["r"]})
    assert detect_format(tmp_path / "log") == "credit-log" and read_run_log(tmp_path / "log") == []
    assert [s.step for s in read_run_log(FIX / "board", after_step=1)] == [2]
    assert w.meta["format"] == "mrtpo-credit-log"


def _edit(tmp_path, src: Path, line: int, change) -> Path:
    dst = tmp_path / src.name
    shutil.copy(src, dst)
    lines = dst.read_text().splitlines()
    lines[line - 1] = change(json.loads(lines[line - 1]))
    dst.write_text("\n".join(lines) + "\n")
    return dst


def test_bad_rows_are_named(tmp_path):
    board = FIX / "board" / "rank_0.jsonl"
    prime = FIX / "prime_rl" / "token_exports" / "step_1" / "rank_0.jsonl"

    def drop(k):
        return lambda o: json.dumps({a: b for a, b in o.items() if a != k})

    def put(k, v):
        return lambda o: json.dumps({**o, k: v})

    cases = [
        (read_board, board, 2, drop("reward"), "rank_0.jsonl: row 2: field 'reward': missing"),
        (read_board, board, 1, put("logprobs", [-1, "x"]), "field 'logprobs': must be a number or null, got 'x'"),
        (read_board, board, 1, put("ref_logprobs", [-1.0]), "row 1: field 'ref_logprobs': has 1 value for 5 tokens"),
        (read_board, board, 3, put("response_tokens", ["a"]), "row 3: field 'response_tokens': has 1 token for 2"),
        (read_board, board, 1, put("step", 1.5), "row 1: field 'step': must be an integer step >= 0, got 1.5"),
        (read_prime_rl, prime, 2, drop("loss_mask"), "rank_0.jsonl: row 2: field 'loss_mask': missing"),
        (read_prime_rl, prime, 1, put("schema_version", 9), "row 1: field 'schema_version': is 9; this reader knows"),
        (read_prime_rl, prime, 1, put("entropy", [0.0]), "row 1: field 'entropy': has 1 value for 6 tokens"),
        (read_prime_rl, prime, 1, put("loss_mask", [False] * 6), "row 1: field 'loss_mask': no token is trained"),
    ]
    for k, (reader, src, line, change, says) in enumerate(cases):
        d = tmp_path / str(k)
        d.mkdir()
        with pytest.raises(CreditLogError) as e:
            reader(_edit(d, src, line, change))
        assert says in str(e.value), (says, str(e.value))
    weird = tmp_path / "weird.jsonl"
    weird.write_text('{"question": "q", "answer": "a", "score": 1}\n')
    with pytest.raises(CreditLogError, match=r"weird.jsonl: row 1: in none of the formats mrtpo reads: .*OpenRLHF "
                                             r"board row has prompt, response, response_tokens, logprobs, reward"):
        read_run_log(weird)
    (tmp_path / "nojson.jsonl").write_text("not json\n")
    with pytest.raises(CreditLogError, match="nojson.jsonl: row 1: not valid JSON"):
        read_run_log(tmp_path / "nojson.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CreditLogError, match="empty: in none of the formats"):
        read_run_log(tmp_path / "empty")
    text = tmp_path / "model.jsonl"  # model-written text can hold anything: it is read as is
    text.write_text(json.dumps({"prompt": "\u2028\x00<b>", "response": "\ud800?", "response_tokens": ["x"],
                                "logprobs": [-1.0], "reward": None, "step": 0}) + "\n")
    (r,) = read_run_log(text)[0].rows
    assert r.prompt == "\u2028\x00<b>" and r.rewards == {"reward": None}


def test_trl_parquet_and_verl_rows(tmp_path):
    """TRL's completions parquet and verl dumps (no tokens) read into the same rows: rewards, prompt, advantage."""
    import pandas as pd

    df = pd.DataFrame({"step": [3, 3, 3], "prompt": ["q1", "q1", "q2"], "completion": ["a", "b", "c"],
                       "correct": [1.0, 0.0, float("nan")], "short": [1, 0, 1], "note": ["x", "y", "z"],
                       "advantage": [0.5, -0.5, 0.0]})
    (tmp_path / "completions").mkdir()
    df.to_parquet(tmp_path / "completions" / "completions_00003.parquet")
    (st,) = read_run_log(tmp_path / "completions")
    assert st.step == 3 and [(r.group, r.index, r.completion) for r in st.rows] == [(0, 0, "a"), (0, 1, "b"),
                                                                                   (1, 0, "c")]
    assert st.rows[0].rewards == {"correct": 1.0, "short": 1.0} and st.rows[2].rewards["correct"] is None
    assert st.rows[1].advantage == -0.5 and st.rows[0].token_ids is None
    v = tmp_path / "0.jsonl"
    v.write_text('{"input": "q", "output": "a", "score": {"acc": 1, "fmt": 0}, "step": 1}\n'
                 '{"input": "q", "output": "b", "score": {"acc": 0, "fmt": null}, "step": 1}\n')
    assert detect_format(v) == "verl"
    (st,) = read_run_log(v)
    assert [r.rewards for r in st.rows] == [{"acc": 1.0, "fmt": 0.0}, {"acc": 0.0, "fmt": None}]
    v.write_text('{"input": "q", "output": "a", "score": "high", "step": 1}\n')
    with pytest.raises(CreditLogError, match=r"0.jsonl: row 1: field 'score': must be a number, true / false "
                                               r"\(1 / 0\) or null \(not scored\), got 'high'"):
        read_run_log(v)
