"""One rule for a reward value in every reader of rewards (mrtpo.validate.reward): a number, or true / false as 1 / 0
(a checker's pass or fail); null / NaN not scored; text refused, even "1".  Before, booleans were 1 / 0 in the CLI's
inputs but refused by the board and credit-log readers (and TRL's boolean columns were dropped in the run viewer),
while rollout files took the text "1" that the CLI refused."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from mrtpo import validate as V
from mrtpo.cli import main
from mrtpo.cli.credit import _check_case
from mrtpo.cli.explain import _explain_input
from mrtpo.creditlog import CreditLogError
from mrtpo.creditlog.format import check_row
from mrtpo.integrations.rollout_explain import RolloutVerifierInfo
from mrtpo.integrations.rollouts import RolloutFileError, read_rollouts
from mrtpo.integrations.tool_logs import board_row, read_rollout_log
from tests.creditlog.test_credit_log import _credit, _rows

REFUSED = "must be a number, true / false (1 / 0) or null (not scored), got '1'"


@pytest.mark.parametrize("value, number", [
    (True, 1.0), (False, 0.0), (1, 1.0), (0.25, 0.25), (-2, -2.0), (np.bool_(True), 1.0), (np.float32(0.5), 0.5),
    (np.int64(3), 3.0), (None, math.nan), (math.nan, math.nan)])
def test_the_rule_takes_numbers_and_booleans(value, number):
    got = V.reward(value, "r")
    assert (math.isnan(got) and math.isnan(number)) or got == number


@pytest.mark.parametrize("value, problem", [
    ("1", REFUSED), ("true", REFUSED.replace("'1'", "'true'")), ([1], "got a list"), ({"a": 1}, "got an object"),
    (math.inf, "must be a finite number, got inf"), (1e39, "is too large")])
def test_the_rule_refuses_text_and_the_rest(value, problem):
    with pytest.raises(V.BadValue, match="^field 'r': .*" + re.escape(problem)):
        V.reward(value, "r")


def test_advantages_input(tmp_path, capsys):
    outs = []
    for rows in ([[1, 0], [0, 1]], [[True, False], [False, True]]):
        (tmp_path / "in.json").write_text(json.dumps(rows))
        assert main(["advantages", "--method", "gdpo", "--group-size", "2", "--input", str(tmp_path / "in.json")]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1]
    (tmp_path / "in.json").write_text(json.dumps([["1", 0], [0, 1]]))
    assert main(["advantages", "--method", "gdpo", "--group-size", "2", "--input", str(tmp_path / "in.json")]) == 2
    assert f"field 'rewards[0][0]': {REFUSED}" in capsys.readouterr().err


def test_explain_and_relevance_inputs(tmp_path):
    path = tmp_path / "group.json"
    group = {"prompt": "p", "verifier_info": {"a": "x", "b": "y"}, "responses": ["r1", "r2"],
             "rewards": [[True, 0.5], [False, None]]}
    path.write_text(json.dumps(group))
    R = _explain_input(str(path)).rewards
    assert R[:, 0].tolist() == [1.0, 0.0] and R[0, 1] == 0.5 and math.isnan(R[1, 1])
    path.write_text(json.dumps({**group, "rewards": [[True, "1"], [False, None]]}))
    with pytest.raises(Exception, match=re.escape(f"field 'rewards[0][1]': {REFUSED}")):
        _explain_input(str(path))
    case = {"id": 1, "prompt": "p", "verifier_info": {"a": "x"}, "response": "r"}
    assert _check_case({**case, "rewards": {"a": True}}, 1) is None
    assert _check_case({**case, "rewards": {"a": "1"}}, 3) == f"line 3: field 'rewards.a': {REFUSED}"


def test_rollout_files(tmp_path):
    verl = tmp_path / "0.jsonl"
    verl.write_text("".join(json.dumps({"input": "Capital?", "output": o, "score": s, "step": 1}) + "\n"
                            for o, s in (("Paris", True), ("Lyon", False), ("Nice", "1"))))
    vt = RolloutVerifierInfo({"score": "The capital of France."})
    rows = read_rollouts(verl, "verl")
    assert [vt.rewards_of(r) for r in rows[:2]] == [[1.0], [0.0]]
    with pytest.raises(RolloutFileError, match=re.escape(f"0.jsonl: row 3: column 'score': {REFUSED}")):
        vt.rewards_of(rows[2])
    trl = tmp_path / "completions_00001.parquet"
    pd.DataFrame([{"step": 1, "prompt": "Capital?", "completion": c, "correct": c == "Paris"}
                  for c in ("Paris", "Lyon")]).to_parquet(trl)
    assert [RolloutVerifierInfo({"correct": "x"}).rewards_of(r) for r in read_rollouts(trl, "trl")] == [[1.0], [0.0]]


def test_the_run_viewers_readers(tmp_path):
    board = {"prompt": "Rhyme?", "response": "Moon June", "response_tokens": ["Moon", " June"],
             "logprobs": [-0.1, -2.0], "step": 1}
    assert board_row({**board, "reward": True}, "b.jsonl", 1).rewards == {"reward": 1.0}
    with pytest.raises(CreditLogError, match=re.escape(f"b.jsonl: row 2: field 'reward': {REFUSED}")):
        board_row({**board, "reward": "1"}, "b.jsonl", 2)
    verl = tmp_path / "1.jsonl"
    verl.write_text(json.dumps({"input": "Capital?", "output": "Paris", "score": {"correct": True, "short": 0.5},
                                "step": 1}) + "\n")
    assert read_rollout_log(verl, "verl")[0].rows[0].rewards == {"correct": 1.0, "short": 0.5}
    verl.write_text(json.dumps({"input": "Capital?", "output": "Paris", "score": "1", "step": 1}) + "\n")
    with pytest.raises(CreditLogError, match=re.escape(f"row 1: field 'score': {REFUSED}")):
        read_rollout_log(verl, "verl")
    trl = tmp_path / "completions_00001.parquet"  # a boolean reward column is a reward (it was dropped)
    pd.DataFrame([{"step": 1, "prompt": "Capital?", "completion": c, "correct": c == "Paris", "len": 0.5}
                  for c in ("Paris", "Lyon")]).to_parquet(trl)
    assert [r.rewards for r in read_rollout_log(trl, "trl")[0].rows] == [{"correct": 1.0, "len": 0.5},
                                                                        {"correct": 0.0, "len": 0.5}]


def test_the_credit_log(tmp_path):
    R, mask, credit = _credit()
    row = json.loads(json.dumps(_rows(1, R, mask, credit)[0]))
    got = check_row({**row, "rewards": {"format": True, "correct": None}}, "step-000001.jsonl", 1)
    assert got.rewards == {"format": 1.0, "correct": None}
    with pytest.raises(CreditLogError, match=re.escape(f"row 1: field 'rewards': reward 'format': {REFUSED}")):
        check_row({**row, "rewards": {"format": "1", "correct": 0}}, "step-000001.jsonl", 1)
