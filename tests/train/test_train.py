"""The training loop on the tiny model: loss by hand, updates, store, resume, β = 0 ≡ GDPO, lock, LoRA."""
import copy
import math

import pytest
import torch

from mrtpo.errors import MrtpoError
from mrtpo.store import Store
from mrtpo.tasks.base import Example, Score, TaskFamily
from mrtpo.train import TrainConfig, Trainer
from mrtpo.train.policy import clipped_surrogate_loss


class ToyFamily(TaskFamily):
    """Two continuous rewards, so random-model responses always differ within a group."""

    name = "toy"
    template = {"prompt": "{prompt}\nRules:\n{verifier_info}", "item": "- {text}", "separator": "\n"}

    def examples(self):
        return [Example("a", "Say hi."), Example("b", "Count to three."), Example("c", "Name a color.")]

    def reward_names(self, example):
        return ["ascii", "lower"]

    def score(self, example, response):
        n = max(1, len(response))
        return {"ascii": Score(sum(c.isascii() for c in response) / n),
                "lower": Score(sum(c.islower() for c in response) / n)}

    def rule_info(self, example):
        return {"ascii": "Write ASCII characters only.", "lower": "Use lowercase letters."}


def cfg(**kw):
    base = dict(model="tiny-random", device="cpu", task="toy", method="mrtpo", group_size=4, prompts_per_step=2,
                max_new_tokens=8, lr=1e-2, warmup=0, probe_size=2, seed=3)
    base.update(kw)
    return TrainConfig.from_dict(base)


def params(tr):
    return {k: v.detach().clone() for k, v in tr.lm.model.named_parameters()}


# ---------------------------------------------------------------------------------------------- the loss
def test_loss_hand_worked():
    # two responses, T = 2; second response has one valid token
    logp = torch.log(torch.tensor([[0.5, 0.3], [0.2, 0.9]]))
    old = torch.log(torch.tensor([[0.25, 0.3], [0.4, 0.9]]))  # ratios 2.0, 1.0 | 0.5, (pad)
    adv = torch.tensor([[1.0, -1.0], [-2.0, 5.0]])
    mask = torch.tensor([[True, True], [True, False]])
    loss, st = clipped_surrogate_loss(logp, old, adv, mask, 0.2, 0.2, "token-mean")
    # token losses: -min(2·1, 1.2·1) = -1.2;  -min(1·-1, 1·-1) = 1;  -min(0.5·-2, 0.8·-2) = 1.6
    assert loss.item() == pytest.approx((-1.2 + 1.0 + 1.6) / 3, abs=1e-6)
    assert st["clip_frac"] == pytest.approx(2 / 3)  # tokens 1 and 3 are clipped
    assert st["ratio_mean"] == pytest.approx((2 + 1 + 0.5) / 3, abs=1e-6)
    loss, _ = clipped_surrogate_loss(logp, old, adv, mask, 0.2, 0.2, "seq-mean")
    assert loss.item() == pytest.approx(((-1.2 + 1.0) / 2 + 1.6) / 2, abs=1e-6)
    # k3 KL: ref = logp + log 2 → exp(log 2) − log 2 − 1 = 1 − ln 2 per token
    loss_kl, st = clipped_surrogate_loss(logp, old, adv, mask, 0.2, 0.2, "token-mean", logp + math.log(2), 0.1)
    assert st["kl"] == pytest.approx(1 - math.log(2), abs=1e-6)
    assert loss_kl.item() == pytest.approx((-1.2 + 1.0 + 1.6) / 3 + 0.1 * (1 - math.log(2)), abs=1e-6)


def test_loss_gradient_is_minus_advantage_at_ratio_one():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[0.5, -1.5]])
    loss, _ = clipped_surrogate_loss(logp, logp.detach(), adv, torch.ones(1, 2, dtype=torch.bool))
    loss.backward()
    assert torch.allclose(logp.grad, -adv / 2)


# ---------------------------------------------------------------------------------------------- training
def test_steps_change_weights_and_write_store(tmp_path):
    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(checkpoint_every=1), st, "r1", family=ToyFamily())
    before = params(tr)
    ms = tr.train(2)
    assert tr.steps_done == 2
    changed = [k for k, v in params(tr).items() if not torch.equal(v, before[k])]
    assert len(changed) > 10
    assert ms[0]["adv/nonzero_frac"] > 0 and ms[0]["loss"] == ms[0]["loss"]
    run = st.get_run("r1")
    assert run.steps_done == 2 and run.last_checkpoint == 2
    # relative to the store's folder, beside the store's file, keyed by id
    assert run.checkpoint_path == f"runs.db.checkpoints/{run.id}/step-000002.pt"
    assert st._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    m = st.metrics(run.id)
    for key in ("reward/ascii", "reward/lower", "adv/std", "loss", "clip_frac", "time/step", "time/replay"):
        assert set(m[key]) == {1, 2}, key
    assert m["reward/mean"][1] == pytest.approx(ms[0]["reward/mean"])
    rows = st.samples(run.id, 2)
    assert len(rows) == 8
    r0 = rows[0]
    assert len(r0["token_advantage"]) == len(r0["token_ids"]) == len(r0["tokens"])
    assert set(r0["rewards"]) == {"ascii", "lower"} and set(r0["relevance"]) <= {"ascii", "lower"}
    probe = st.probe(run.id)
    assert len(probe) == 2
    steps, heat = st.probe_relevance(run.id, 0, "ascii")
    assert steps == [0, 1, 2] and len(heat[0]) == len(probe[0]["token_ids"])
    assert sum(heat[0]) == pytest.approx(len(heat[0]), rel=1e-3)  # relevance has mean 1
    assert heat[0] != heat[2]  # the policy moved, so the probe's relevance shifted
    ck = tmp_path / "runs.db.checkpoints" / str(run.id)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and "runs.db.checkpoints" in p.parts) == \
        ["step-000002.pt"] and (ck / "step-000002.pt").exists()  # the last checkpoint only, no temp file


def test_resume_continues_and_matches_straight_run(tmp_path):
    st = Store(tmp_path / "runs.db")
    Trainer(cfg(checkpoint_every=1), st, "r", family=ToyFamily()).train(2)
    logs = []
    tr = Trainer(None, st, "r", family=ToyFamily(), log=logs.append)
    assert tr.steps_done == 2 and any("checkpoint of step 2" in line for line in logs)
    tr.train(1)
    assert st.get_run("r").steps_done == 3 and set(st.metrics(st.get_run("r").id)["loss"]) == {1, 2, 3}
    straight = Trainer(cfg(), family=ToyFamily())
    straight.train(3)
    for k, v in params(straight).items():
        assert torch.equal(v, params(tr)[k]), k  # bit for bit


def test_resume_from_older_checkpoint_recomputes(tmp_path):
    st = Store(tmp_path / "runs.db")
    a = Trainer(cfg(checkpoint_every=2), st, "r", family=ToyFamily())
    a.train(3)
    loss3 = st.metrics(st.get_run("r").id)["loss"][3]
    logs = []
    b = Trainer(None, st, "r", family=ToyFamily(), log=logs.append)
    assert b.steps_done == 2 and st.get_run("r").steps_done == 3  # resuming only reads until train() holds the lock
    b.train(1)
    assert any("after the last checkpoint" in line for line in logs)
    assert st.get_run("r").steps_done == 3
    assert st.metrics(st.get_run("r").id)["loss"][3] == loss3  # step 3 recomputed identically


def test_mrtpo_beta_zero_is_exactly_gdpo():
    def one(method, beta):
        tr = Trainer(cfg(method=method, beta=beta, probe_size=0), family=ToyFamily())
        m = tr.step()
        return params(tr), m

    g, mg = one("gdpo", 0.5)
    z, mz = one("mrtpo", 0.0)
    h, mh = one("mrtpo", 0.5)
    assert mz["time/replay"] > 0 and mg["time/replay"] < 1e-3
    # the replay's tokens through the model: every response under P_all and each P_\k at least once (8 responses)
    assert mz["replay/forward_tokens"] >= 2 * 8 * mz["response_tokens"] and mg["replay/forward_tokens"] == 0
    # its attention's pairs: each response token at least sees itself and its response's earlier tokens, twice
    T = mz["response_tokens"]
    assert mz["replay/attention_pairs"] >= 2 * 8 * T * (T + 1) / 2 and mg["replay/attention_pairs"] == 0
    assert mz["prompt_tokens"] == mg["prompt_tokens"] > 3  # the same prompts (the schedule is the seed's)
    assert all(torch.equal(g[k], z[k]) for k in g)
    assert any(not torch.equal(g[k], h[k]) for k in g)  # β > 0 does take a different update
    assert mz["loss"] == mg["loss"] and mh["reward/mean"] == mg["reward/mean"]


def test_lock_blocks_a_second_trainer(tmp_path):
    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(probe_size=0), st, "r", family=ToyFamily())
    owner = st.acquire_lock(tr.run_id)  # someone else (this live process) holds it
    with pytest.raises(MrtpoError, match="being trained"):
        tr.step()
    assert st.lock_holder(tr.run_id)["pid"] > 0
    st.release_lock(tr.run_id, owner)
    tr.step()
    assert st.lock_holder(tr.run_id) is None and st.get_run("r").steps_done == 1


def test_lora_trains_adapter_only_with_kl(tmp_path):
    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(lora=True, kl_coef=0.1, lr=5e-2, probe_size=0, checkpoint_every=2), st, "l", family=ToyFamily())
    frozen = {k: v.detach().clone() for k, v in tr.lm.model.named_parameters() if not v.requires_grad}
    lora = {k: v.detach().clone() for k, v in tr.lm.model.named_parameters() if v.requires_grad}
    assert lora and all("lora_" in k for k in lora)
    ms = tr.train(2)
    assert ms[1]["kl"] > 0
    now = dict(tr.lm.model.named_parameters())
    assert all(torch.equal(now[k], v) for k, v in frozen.items())
    assert any(not torch.equal(now[k], v) for k, v in lora.items())
    resumed = Trainer(None, st, "l", family=ToyFamily())
    again = dict(resumed.lm.model.named_parameters())
    assert all(torch.equal(again[k], now[k]) for k in lora)


def test_instructions_rollout_has_nan_for_rewards_that_do_not_apply():
    tr = Trainer(TrainConfig.from_dict(dict(model="tiny-random", device="cpu", task="instructions", group_size=2,
                             prompts_per_step=3, max_new_tokens=4, probe_size=0)))
    ro = tr.rollout(1)
    assert ro.R.shape == (6, len(ro.names))
    assert torch.isnan(ro.R).any()  # different examples have different constraint ids
    for b, g in enumerate(ro.groups):
        cols = [ro.names.index(k) for k in g.reward_names]
        assert not torch.isnan(ro.R[b * 2:(b + 1) * 2, cols]).any()
    m = tr.step()  # estimators skip NaN
    assert math.isfinite(m["adv/mean"])
    # the update conditions on the prompt the responses were sampled under (not the replay's base request)
    for b, g in enumerate(ro.groups):
        assert ro.prompt_ids[b * 2] == tr.lm.encode(tr.lm.chat_prompt(g.example.prompt))


def test_bad_config_is_a_clear_error():
    with pytest.raises(MrtpoError, match="unknown method"):
        TrainConfig.from_dict(dict(method="ppo-magic"))
    with pytest.raises(MrtpoError, match="aggregation"):
        TrainConfig.from_dict(dict(aggregation="sum"))
    with pytest.raises(MrtpoError, match="unknown training config field"):
        TrainConfig.from_dict({"lr": 1e-3, "bogus": 1})
    with pytest.raises(MrtpoError, match="sql_compare must be one of strict, spider, bird"):
        TrainConfig.from_dict({"task": "sql", "sql_compare": "exact"})


def test_the_comparison_mode_reaches_the_trained_examples():
    tr = Trainer(TrainConfig.from_dict(dict(model="tiny-random", device="cpu", task="sql", sql_compare="bird",
                                            group_size=2, prompts_per_step=1, max_new_tokens=4, probe_size=0)))
    assert {e.data["compare"] for e in tr.examples} == {"bird"}
    with pytest.raises(MrtpoError, match="--tools-compare applies to the tools task, not 'sql'"):
        Trainer(TrainConfig.from_dict(dict(model="tiny-random", device="cpu", task="sql", tools_compare="bfcl",
                                           probe_size=0)))


def test_full_finetuning_keeps_float32_master_weights(tiny):
    """A model loaded in bfloat16 (what device=auto gives on CUDA) trains float32 master weights: a step at lr 1e-5
    changes nearly every weight, where updating bf16 weights in place changes almost none."""
    from mrtpo.model import LoadedModel

    bf = LoadedModel(model=copy.deepcopy(tiny.model).to(torch.bfloat16), tokenizer=tiny.tokenizer, name="tiny-random",
                     device=tiny.device, dtype=torch.bfloat16)
    tr = Trainer(cfg(method="gdpo", lr=1e-5, probe_size=0), lm=bf, family=ToyFamily())
    assert tr.lm.dtype == torch.float32 and all(p.dtype == torch.float32 for p in tr.policy.params)
    before = params(tr)
    tr.train(1)
    after = params(tr)
    changed = sum(int((after[k] != v).sum()) for k, v in before.items())
    total = sum(v.numel() for v in before.values())
    assert changed / total > 0.5
    lora = Trainer(cfg(method="gdpo", lora=True, probe_size=0), lm=LoadedModel(
        model=copy.deepcopy(tiny.model).to(torch.bfloat16), tokenizer=tiny.tokenizer, name="tiny-random",
        device=tiny.device, dtype=torch.bfloat16), family=ToyFamily())
    assert lora.lm.dtype == torch.bfloat16  # LoRA: the frozen base stays as loaded (peft keeps the adapter in float32)


def test_bf16_update_on_a_cpu_is_the_float32_update_within_bf16_rounding(tiny):
    """bf16_update: the update's decoder runs under bf16 autocast on a CPU (weights stay float32): log-probs within
    bf16 rounding of float32's, not identical (autocast took effect), and a step moves the weights the same way."""
    from mrtpo.train.policy import token_logprobs

    model = copy.deepcopy(tiny.model).float()
    prompts, resp = [[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14, 15, 16, 17]]
    pad = tiny.tokenizer.pad_token_id
    with torch.no_grad():
        exact, mask = token_logprobs(model, prompts, resp, pad)
        bf, mask2 = token_logprobs(model, prompts, resp, pad, cpu_bf16=True)
    assert torch.equal(mask, mask2) and exact.dtype == bf.dtype == torch.float32
    gap = (exact - bf)[mask].abs()
    assert 0 < float(gap.max()) < 0.05 * float(exact[mask].abs().max()) + 0.02
    moved = {}
    for flag in (False, True):
        tr = Trainer(cfg(method="gdpo", lr=1e-3, probe_size=0, bf16_update=flag), family=ToyFamily())
        before = params(tr)
        tr.train(1)
        moved[flag] = torch.cat([(params(tr)[k] - v).flatten() for k, v in before.items()])
        assert all(p.dtype == torch.float32 for p in tr.policy.params)
    cos = float(torch.nn.functional.cosine_similarity(moved[False], moved[True], dim=0))
    assert cos > 0.9 and not torch.equal(moved[False], moved[True])
    assert TrainConfig.from_dict({"bf16_update": True}).optim.bf16_update is True


# ---------------------------------------------------------------------------------------------- randomness
def test_training_leaves_the_global_generator_alone():
    """A trainer (built with LoRA, stepped) neither changes torch's global generator nor depends on it: the same
    steps whatever the global state was (issue: the trainer reseeded it, changing the groups the app sampled)."""
    torch.manual_seed(5)
    before = torch.get_rng_state()
    a = Trainer(cfg(lora=True, probe_size=0), family=ToyFamily())
    ma = a.train(2)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(77)
    b = Trainer(cfg(lora=True, probe_size=0), family=ToyFamily())
    mb = b.train(2)
    for x, y in zip(ma, mb):
        assert {k: v for k, v in x.items() if not k.startswith("time/")} == \
               {k: v for k, v in y.items() if not k.startswith("time/")}
    assert all(torch.equal(v, params(b)[k]) for k, v in params(a).items())


def test_a_trainer_stepping_beside_samplers_changes_no_group(tiny):
    """Issue: a Train session stepping a run while another session sampled gave that session another group. A
    trainer steps in one thread while two threads sample seeds 2 and 3 over and over: every group is the one the
    seed gives alone."""
    import threading

    from mrtpo.model import sample

    kw = dict(n=4, max_new_tokens=32)
    alone = {s: [x.token_ids for x in sample(tiny, "Say hi.", seed=s, **kw)] for s in (2, 3)}
    tr = Trainer(cfg(probe_size=0, lora=True), family=ToyFamily())
    stop, errors, got = threading.Event(), [], {2: [], 3: []}

    def train():
        try:
            while not stop.is_set():
                tr.train(1)
        except Exception as e:  # reported below
            errors.append(e)

    def draw(s):
        try:
            for _ in range(4):
                got[s].append([x.token_ids for x in sample(tiny, "Say hi.", seed=s, **kw)])
        except Exception as e:  # reported below
            errors.append(e)

    trainer = threading.Thread(target=train)
    trainer.start()
    samplers = [threading.Thread(target=draw, args=(s,)) for s in alone]
    for t in samplers:
        t.start()
    for t in samplers:
        t.join()
    stop.set()
    trainer.join()
    assert not errors, errors
    assert tr.steps_done >= 1 and all(g == alone[s] for s in alone for g in got[s])


def test_building_a_policy_while_another_thread_loads_a_model_does_not_deadlock():
    """The app preloads the model in a thread while a Train session builds a trainer: the two take the model loader's
    lock and seeded_global's in one order (a build once held seeded_global while it loaded: a deadlock)."""
    import threading

    from mrtpo.model import load_model
    from mrtpo.train.policy import Policy

    done = []

    def loads():
        for _ in range(3):
            load_model("tiny-random", "cpu")
        done.append("load")

    def builds():
        for _ in range(3):
            Policy.build(cfg(lora=True))
        done.append("build")

    threads = [threading.Thread(target=f, daemon=True) for f in (loads, builds)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(done) == ["build", "load"]


def test_each_step_casts_once_and_trains_as_with_copies_per_call(monkeypatch):
    """With bf16 copies ("auto" on a CPU with fast bf16), a step's sampling and replays share one cast
    (``weights_fixed``) — and the run is the same, bit for bit, as with a cast per call: no copy outlives an update."""
    import contextlib

    from mrtpo.model import decoder as D
    from mrtpo.model import llama_step as L
    from mrtpo.train import loop

    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: True)
    built = []
    real = L.LlamaStep
    monkeypatch.setattr(L, "LlamaStep", lambda *a: built.append(1) or real(*a))

    def run():
        tr = Trainer(cfg(probe_size=0), family=ToyFamily())
        tr.train(2)
        assert not tr.lm.frozen and D.decoder_stack(tr.lm.model) not in D._kept
        return params(tr)

    shared = run()
    assert len(built) == 2  # one per step: 2 groups sampled + their (joint) replay on it
    built.clear()
    monkeypatch.setattr(loop, "weights_fixed", lambda lm: contextlib.nullcontext())
    per_call = run()
    assert len(built) == 2 * 3  # per call: each group's sampling, the joint replay
    assert all(torch.equal(shared[k], per_call[k]) for k in shared)


def test_a_frozen_model_is_not_trained(tiny):
    import dataclasses

    from mrtpo.train.policy import Policy

    with pytest.raises(MrtpoError, match="frozen"):
        Policy.build(cfg(), dataclasses.replace(tiny, frozen=True))
