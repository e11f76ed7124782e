"""The wait in the CLI (issue 34, item 5): above the threshold a command says what the work will cost before it
starts (forward tokens, seconds at this machine's rate), then prints progress lines with the time left; --quiet
silences both and changes no output; Ctrl-C during a long replay stops it within a few seconds (exit 130)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mrtpo.cli import common
from mrtpo.model import load_model, tokenize_response
from mrtpo.replay import GroupInput
from mrtpo.replay.estimate import replay_tokens
from tests.cli.test_cli import _jsonl, _run, _stages

ROOT = Path(__file__).resolve().parents[2]
ESTIMATE = re.compile(r"^(.*): about [0-9.]+ (s|min)\S*( [0-9]+ s)? \((at most )?([0-9,]+) forward tokens at [0-9,]+ "
                      r"tokens/s (on this machine|— a first guess .*)\)$")
ETA = re.compile(r"^(.*): (\d+) % · ([0-9.]+ s|\d+ min( \d+ s)?) left$")


@pytest.fixture()
def ask_always(monkeypatch):
    """Every estimate above the threshold, every progress call a line."""
    monkeypatch.setenv("MRTPO_ASK_ABOVE_S", "0")
    monkeypatch.setattr(common.Progress, "EVERY_S", 0.0)
    monkeypatch.setattr(common.Progress, "MIN_GAP_S", 0.0)


def _estimates(stages):
    return [(m.group(1), int(m.group(5).replace(",", "")), bool(m.group(4))) for m in map(ESTIMATE.match, stages) if m]


def _etas(stages, what):
    return [int(m.group(2)) for m in map(ETA.match, stages) if m and m.group(1) == what]


def _group(tmp_path):
    inp = tmp_path / "g.json"
    inp.write_text(json.dumps({"prompt": "Say hi.", "verifier_info": {"a": "Be brief.", "b": "Be kind."},
                               "responses": ["hi there, friend of mine", "hello you all, from the river"],
                               "rewards": [[1, 0], [0, 1]]}))
    return inp


def test_explain_says_the_replays_exact_forward_tokens_then_progress_with_the_time_left(tmp_path, capsys, ask_always):
    inp = _group(tmp_path)
    args = ["explain", "--input", inp, "--model", "tiny-random", "--device", "cpu"]
    rc, out, err = _run(capsys, *args, "--html", tmp_path / "a.html", "--json", tmp_path / "a.json")
    assert rc == 0 and out == ""
    stages = _stages(err)
    lm = load_model("tiny-random", "cpu")
    texts = ["hi there, friend of mine", "hello you all, from the river"]
    want = replay_tokens(lm, [GroupInput("Say hi.", {"a": "Be brief.", "b": "Be kind."},
                                         [tokenize_response(lm, t)[0] for t in texts], np.array([[1, 0], [0, 1]]))])[0]
    assert _estimates(stages) == [("replaying", want, False)]  # the exact count, said before the replay
    i = next(j for j, s in enumerate(stages) if s.startswith("replaying:"))
    assert stages[i + 1] == "replaying 2 responses under P_all and each P_\\k"  # said before the work starts
    pct = _etas(stages, "replaying")
    assert pct and pct == sorted(pct) and all(0 <= p < 100 for p in pct)
    rc, out, err = _run(capsys, *args, "--html", tmp_path / "q.html", "--json", tmp_path / "q.json", "--quiet")
    assert rc == 0 and _stages(err) == []
    assert json.loads((tmp_path / "q.json").read_text()) == json.loads((tmp_path / "a.json").read_text())


def test_below_the_threshold_nothing_is_said(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MRTPO_ASK_ABOVE_S", raising=False)
    rc, _, err = _run(capsys, "explain", "--input", _group(tmp_path), "--html", tmp_path / "a.html", "--model",
                      "tiny-random", "--device", "cpu")
    assert rc == 0 and _estimates(_stages(err)) == []


def test_explain_task_says_the_sampling_and_replay_bound_and_samples_with_progress(tmp_path, capsys, ask_always):
    rc, _, err = _run(capsys, "explain", "--task", "instructions", "--example", "tea-note", "--group", "4",
                      "--max-new-tokens", "16", "--seed", "3", "--model", "tiny-random", "--device", "cpu",
                      "--html", tmp_path / "e.html")
    assert rc == 0
    stages = _stages(err)
    (what, bound, is_bound), (what2, exact, is_bound2) = _estimates(stages)
    assert what == "sampling 4 × 16 tokens and replaying" and is_bound and not is_bound2 and what2 == "replaying"
    assert bound > exact  # the bound before sampling covers the sampling and the longest possible replay
    assert _etas(stages, "sampling") and _etas(stages, "replaying")


def test_relevance_rollouts_faithfulness_and_train_say_it_too(tmp_path, capsys, ask_always):
    case = {"id": "a", "prompt": "Write about fruit.", "verifier_info": {"kw": "mention banana"},
            "response": "A banana, then a pear."}
    inp = _jsonl(tmp_path / "c.jsonl", [case, {**case, "id": "b", "response": "An apple."},
                                        {**case, "id": "c", "prompt": "Other."}])
    rc, out, err = _run(capsys, "relevance", "--input", inp, "--output", "-", "--model", "tiny-random")
    stages = _stages(err)
    assert rc == 0 and [w for w, _, _ in _estimates(stages)] == ["replaying 3 cases in 2 groups"]
    assert stages.index("replaying 3 cases in 2 groups" + stages[1][len("replaying 3 cases in 2 groups"):]) == 1
    assert _etas(stages, "replaying group 1/2") and _etas(stages, "replaying group 2/2")
    rc, out_q, err = _run(capsys, "relevance", "--input", inp, "--output", "-", "--model", "tiny-random", "--quiet")
    assert rc == 0 and out_q == out and _stages(err) == []

    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps({"score": "must be right"}))
    f = tmp_path / "r.jsonl"
    f.write_text('{"input": "q", "output": "a b c", "score": 1, "step": 1}\n{"input": "q", "output": "b", "score": 0, '
                 '"step": 1}\n')
    rc, _, err = _run(capsys, "rollouts", "--input", f, "--verifier-template", vt, "--output", "-",
                      "--model", "tiny-random", "--device", "cpu")
    assert rc == 0 and [w for w, _, _ in _estimates(_stages(err))] == ["replaying 1 group"]
    assert _etas(_stages(err), "replaying group 1/1")

    rc, _, err = _run(capsys, "faithfulness", "--task", "instructions", "--limit", "2", "--group", "2",
                      "--max-new-tokens", "8", "--model", "tiny-random", "--device", "cpu",
                      "--output", tmp_path / "f.json")
    stages = _stages(err)
    assert rc == 0 and [w for w, _, b in _estimates(stages) if b] == [
        "2 examples: sampling 2 × 8 tokens and 1 replay each"]
    assert re.fullmatch(r"1/2 .*· 50 % · [0-9.]+ s left", stages[1]) and stages[2].startswith("2/2 ")
    rc, _, err = _run(capsys, "faithfulness", "--task", "instructions", "--limit", "1", "--group", "2",
                      "--max-new-tokens", "8", "--model", "tiny-random", "--device", "cpu", "--quiet",
                      "--output", tmp_path / "f.json")
    assert rc == 0 and err == ""

    rc, _, err = _run(capsys, "train", "--task", "instructions", "--method", "mrtpo", "--model", "tiny-random",
                      "--device", "cpu", "--group-size", "2", "--prompts-per-step", "1", "--max-new-tokens", "4",
                      "--probe-size", "1", "--db", tmp_path / "r.db", "--run", "a", "--steps", "2")
    stages = _stages(err)
    assert rc == 0
    for step in (1, 2):
        i = stages.index(f"step {step}/2: sampling")
        what, tokens, bound = _estimates([stages[i - 1]])[0]
        assert what == f"step {step}/2" and bound and tokens > 0  # before the step's work


def _sigint_default():
    """In the child before Python starts: SIGINT back to its default, so Python installs KeyboardInterrupt (a shell
    starts background jobs with SIGINT ignored, and Python keeps an inherited "ignore")."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_long_replay_stops_within_seconds(tmp_path):
    """SIGINT while a replay of 8 × ~3,000 tokens × 8 rewards runs: exit 130, 'interrupted', within a few seconds."""
    text = " ".join(f"the river bends by stone {i} and the fox waits" for i in range(70))[:3000]
    cases = [{"id": i, "prompt": "Describe the river.", "response": text[i:],
              "verifier_info": {f"r{k}": f"Rule {k}: mention the fox {k} times." for k in range(8)}} for i in range(8)]
    inp = _jsonl(tmp_path / "c.jsonl", cases)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MRTPO_ASK_ABOVE_S": "0"}
    p = subprocess.Popen([sys.executable, "-m", "mrtpo", "relevance", "--input", str(inp), "--output",
                          str(tmp_path / "o.jsonl"), "--model", "tiny-random", "--device", "cpu"],
                         stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         preexec_fn=_sigint_default)  # a suite run in the background inherits SIGINT ignored
    lines = []
    for line in p.stderr:
        lines.append(line)
        if "replaying group 1/1" in line:
            break
    time.sleep(1.0)  # inside the replay's passes
    assert p.poll() is None, "".join(lines)
    t0 = time.perf_counter()
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()
    rc = p.wait(timeout=30)
    took = time.perf_counter() - t0
    assert rc == 130 and "interrupted" in rest and "Traceback" not in rest, rest
    assert took < 5.0, took
    assert any("forward tokens" in line for line in lines)  # the estimate said it would be long
    assert not (tmp_path / "o.jsonl").exists()
