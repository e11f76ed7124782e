"""The credit log of a TRL run: one generation on the tiny model writes a step whose token advantages are the ones
TRL's loss received, whose per-reward rows sum to them, and whose log-probs are the policy's.  Two processes:
``tests/integrations/test_trl.py::test_accelerate_two_processes`` reads the log its run writes."""

import copy

import pytest
import torch

pytest.importorskip("trl", reason="optional extra 'trl' not installed (pip install trl==1.16.0)")

from mrtpo.creditlog import read_credit_log  # noqa: E402
from tests.integrations.test_trl import _inputs  # noqa: E402
from tests.integrations.test_trl import _trainer as trl_trainer  # noqa: E402

NAMES = ["_reward_len", "_reward_vowels"]


def _trainer(tmp_path, tiny, method, beta, **cfg):
    tr = trl_trainer(tmp_path, tiny, method, beta, credit_log=str(tmp_path / "log"), **cfg)
    tr.model.train()  # as in trainer.train(): only training generations are logged
    return tr


def test_trl_step_writes_what_the_trainer_computed(tmp_path, tiny):
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    from mrtpo.creditlog.trl_writer import flush

    tr = _trainer(tmp_path, tiny, method="mrtpo", beta=0.5, credit_log_groups=1)
    torch.manual_seed(0)
    out = tr._generate_and_score_completions(_inputs())
    assert not (tmp_path / "log").exists()  # the rows wait for the loss forward's log-probs and entropy
    tr.current_gradient_accumulation_steps = 1  # what train() sets before a loss
    for part in split_tensor_dict(shuffle_sequence_dict(dict(out)), 2):  # as TRL does: shuffled micro-batches
        tr._compute_loss(tr.model, part)
    flush(tr.mrtpo_credit_log)
    log = read_credit_log(tmp_path / "log")
    assert log.meta["source"] == "trl" and log.meta["rewards"] == NAMES and log.meta["method"] == "mrtpo"
    assert log.meta["model"]  # the policy's name or path, else its class
    (st,) = log.steps
    assert st.step == 1 and len(st.rows) == 4 and {r.group for r in st.rows} == {0}  # 1 group of 4 logged
    adv, mask = out["advantages"], tr.mrtpo_last["mask"]
    moved = 0
    for i, r in enumerate(st.rows):
        T = int(mask[i].sum())
        assert r.index == i and len(r.token_ids) == T == len(r.offsets) == len(r.logprob) == len(r.entropy)
        assert r.token_ids == out["completion_ids"][i, :T].tolist()
        A = torch.tensor(r.token_advantages)
        torch.testing.assert_close(A, adv[i, :T].float(), atol=2e-6, rtol=1e-6)  # what TRL's loss got
        per = torch.tensor([r.reward_token_advantages[k] for k in NAMES])
        torch.testing.assert_close(per.sum(0) - r.center / r.scale, A, atol=1e-5, rtol=0)
        assert A.mean().item() == pytest.approx(r.advantage, abs=1e-5)
        assert r.advantage == pytest.approx(float(tr.mrtpo_last["trl_advantages"][i]), abs=1e-5)  # GDPO's
        assert r.beta == 0.5 and r.ref_logprob is None and r.kl is None  # TRL's beta is 0: no reference
        assert r.reasons is None and set(r.rewards) == set(NAMES)
        moved += any(v is not None for v in r.relevance.values())
        assert all(e is not None and e >= 0 for e in r.entropy)
    assert moved  # the rewards vary in the group: it was replayed
    # the log-probs and entropies are the policy's at temperature 1: one forward here gives the same numbers
    for i in (0, 3):
        r = st.rows[i]
        ids = torch.cat([out["prompt_ids"][i][out["prompt_mask"][i].bool()], torch.tensor(r.token_ids)])
        with torch.no_grad():
            logits = tr.model(ids.unsqueeze(0)).logits[0].float()
        P = int(out["prompt_mask"][i].sum())
        logp = torch.log_softmax(logits[P - 1:-1], -1)
        lp = logp.gather(1, torch.tensor(r.token_ids).unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(torch.tensor(r.logprob), lp, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(r.entropy), -(logp.exp() * logp).sum(-1), atol=1e-4, rtol=1e-4)
    tr.state.global_step = 1
    tr._generate_and_score_completions(_inputs())  # a generation no loss reached: written without log-probs
    flush(tr.mrtpo_credit_log)
    last = read_credit_log(tmp_path / "log").steps[-1]
    assert all(r.logprob is None and r.entropy is None for r in last.rows) and len(last.rows) == 4


def test_trl_gdpo_log_without_the_extra_forward(tmp_path, tiny):
    tr = _trainer(tmp_path, tiny, method="gdpo", beta=0.5, credit_log_groups=2, credit_log_logprobs=False)
    torch.manual_seed(0)
    out = tr._generate_and_score_completions(_inputs())
    (st,) = read_credit_log(tmp_path / "log").steps
    assert [(r.group, r.index) for r in st.rows] == [(g, i) for g in (0, 1) for i in range(4)]
    for i, r in enumerate(st.rows):  # response-level: every token gets the GDPO advantage, nothing replayed
        assert r.beta == 0.0 and all(v is None for v in r.relevance.values())
        assert r.token_advantages == pytest.approx([float(out["advantages"][i])] * len(r.token_ids), abs=1e-5)
        assert r.logprob is None and r.entropy is None  # TRL computed none (aligned steps, no vLLM)
    tr._generate_and_score_completions(_inputs())  # the same update again: its first generation stays
    assert [s.step for s in read_credit_log(tmp_path / "log").steps] == [1]


# ---------------------------------------------------------------------------------------------- one run per log
def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "trl_train.py"
    spec = importlib.util.spec_from_file_location("trl_train_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trl_example_a_second_run_on_the_folder_is_refused(tmp_path, capsys):
    """Issue 33, item 1: `examples/trl_train.py --max-steps 3 --credit-log L`, then `--max-steps 2 --method gdpo
    --seed 5 --credit-log L` overwrote steps 1-2, left step 3 and kept the first run's `created` under the second's
    method.  Now the second run stops before its first step, naming the first; the log is as the first left it."""
    ex, log, out = _example(), tmp_path / "L", str(tmp_path / "out")
    small = ["--model", "tiny-random", "--max-completion-length", "4", "--output-dir", out, "--credit-log", str(log),
             "--credit-log-groups", "1"]
    assert ex.main([*small, "--max-steps", "3"]) == 0
    first = read_credit_log(log)
    assert [s.step for s in first.steps] == [1, 2, 3] and first.meta["method"] == "mrtpo"
    before = _files(log)
    capsys.readouterr()
    assert ex.main([*small, "--max-steps", "2", "--method", "gdpo", "--seed", "5"]) == 2
    io = capsys.readouterr()
    run = first.meta["run"]
    assert run.startswith("trl-") and {r.run for s in first.steps for r in s.rows} == {run}
    assert first.meta["owner"]["output_dir"] == str((tmp_path / "out").resolve())
    assert f"error: credit log {log} belongs to TRL run {run} (output_dir {(tmp_path / 'out').resolve()}), " \
           f"created " in io.err and "give this run another folder" in io.err
    assert "MRTPO_STEP" not in io.out  # no step ran
    assert _files(log) == before


def _run(out, tiny, log, max_steps, save_steps=0, **cfg):
    """A TRL run of ``max_steps`` on the tiny model (one group of 4 per step, 4 tokens) logging to ``log``."""
    from datasets import Dataset
    from trl import GRPOConfig

    from mrtpo.integrations.trl import MRTPOConfig, MRTPOGRPOTrainer
    from tests.integrations.test_trl import _reward_len, _reward_vowels

    def info(prompt, completion, example):
        return {"_reward_len": f"length modulo 3, target {example['target']}", "_reward_vowels": "a vowel"}

    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say something {i}."}], "target": i}
                            for i in range(8)])
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
                      multi_objective_aggregation="normalize_then_sum", use_cpu=True, bf16=False, report_to="none",
                      save_strategy="steps" if save_steps else "no", save_steps=save_steps or 1, max_steps=max_steps,
                      disable_tqdm=True, seed=0, logging_steps=1)
    return MRTPOGRPOTrainer(model=copy.deepcopy(tiny.model), reward_funcs=[_reward_len, _reward_vowels], args=args,
                            train_dataset=ds, processing_class=copy.deepcopy(tiny.tokenizer), verifier_info_fn=info,
                            mrtpo_config=MRTPOConfig(method="mrtpo", beta=0.5, warmup=None, credit_log=str(log),
                                                     credit_log_groups=1, **cfg))


def test_trl_resume_continues_its_own_log(tmp_path, tiny, caplog):
    """A run resumed from its checkpoint (``train(resume_from_checkpoint=...)``) continues its log: the steps after
    the checkpoint are dropped and logged again, new ones appended; a fresh run, or one resumed from another run's
    checkpoint, is refused before any step; a run resumed with a new folder starts a log of the same run there."""
    import json

    from mrtpo.errors import MrtpoError

    out, log = tmp_path / "out", tmp_path / "L"
    _run(out, tiny, log, max_steps=3, save_steps=2).train()
    first = read_credit_log(log)
    run = first.meta["run"]
    assert [s.step for s in first.steps] == [1, 2, 3]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["CreditLogRun"]["args"]["run"] == run  # the checkpoint knows its log's run
    step2 = (log / "step-000002.jsonl").read_bytes()
    with caplog.at_level("WARNING", logger="mrtpo.creditlog.trl_writer"):
        tr = _run(out, tiny, log, max_steps=4)
        tr.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert "steps 3..3 came after the checkpoint (step 2) this run resumes from; dropping them" in caplog.text
    log2 = read_credit_log(log)
    assert [s.step for s in log2.steps] == [1, 2, 3, 4] and tr.state.global_step == 4
    assert log2.meta["run"] == run and log2.meta["created"] == first.meta["created"]
    assert {r.run for s in log2.steps for r in s.rows} == {run}
    assert (log / "step-000002.jsonl").read_bytes() == step2  # before the checkpoint: as written
    before = _files(log)
    fresh = _run(out, tiny, log, max_steps=2)  # the same output_dir, not resumed: another run
    with pytest.raises(MrtpoError, match=f"credit log {log} belongs to TRL run {run} "):
        fresh.train()
    assert fresh.state.global_step == 0 and fresh.mrtpo_last == {}  # not a step, not a generation
    other = tmp_path / "other"
    _run(other, tiny, tmp_path / "L2", max_steps=1, save_steps=1).train()
    with pytest.raises(MrtpoError, match=f"credit log {log} belongs to TRL run {run} "):
        _run(other, tiny, log, max_steps=2).train(resume_from_checkpoint=str(other / "checkpoint-1"))
    assert _files(log) == before
    # resumed into a new folder: the same run's log there, from the step after the checkpoint
    _run(out, tiny, tmp_path / "L3", max_steps=3).train(resume_from_checkpoint=str(out / "checkpoint-2"))
    log3 = read_credit_log(tmp_path / "L3")
    assert [s.step for s in log3.steps] == [3] and log3.meta["run"] == run


def test_trl_an_unwritable_log_stops_before_any_step(tmp_path, tiny):
    """Issue 33, item 12 for TRL: a credit_log that is a file is refused when the trainer is made; one that cannot
    be created (/proc/nope) when train() starts, before any generation."""
    from mrtpo.errors import MrtpoError

    (tmp_path / "file").write_text("x")
    with pytest.raises(MrtpoError, match=f"credit_log {tmp_path / 'file'}: it is a file, not a folder"):
        _run(tmp_path / "out", tiny, tmp_path / "file", max_steps=1)
    tr = _run(tmp_path / "out", tiny, "/proc/nope", max_steps=1)
    with pytest.raises(MrtpoError, match="credit log /proc/nope: cannot create the folder: No such file"):
        tr.train()
    assert tr.state.global_step == 0 and tr.mrtpo_last == {}
