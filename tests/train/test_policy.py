"""mrtpo/train/policy.py on its own: the clipped surrogate by hand (what tests/train/test_train.py's hand-worked loss
does not cover: asymmetric clipping, the unclipped pessimistic side, gradients, padding, KL per token), token
log-probabilities against a plain forward pass of the tiny random model, the trainable state and Policy.build."""
import copy
import math

import pytest
import torch

from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel
from mrtpo.train import TrainConfig
from mrtpo.train.policy import Policy, clipped_surrogate_loss, load_trainable_state, token_logprobs, trainable_state

LN2 = math.log(2)


# ---------------------------------------------------------------------------------------------- the loss
def five_tokens():
    """One response of five tokens with ε_low = 0.1, ε_high = 0.3 (band [0.9, 1.3]):

    t  ratio  A    r·A   clip(r)·A  −min      clipped?
    0  1.5   +2   3.0   2.6        −2.6      yes (above 1 + ε_high, A > 0)
    1  0.5   −1  −0.5  −0.9        +0.9      yes (below 1 − ε_low, A < 0)
    2  1.5   −1  −1.5  −1.3        +1.5      no  (the unclipped term is the smaller one)
    3  0.5   +2   1.0   1.8        −1.0      no
    4  1.2   +1   1.2   1.2        −1.2      no  (inside the band)
    """
    ratio = torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.2]])
    old = torch.full((1, 5), -2.0)
    logp = old + torch.log(ratio)
    adv = torch.tensor([[2.0, -1.0, -1.0, 2.0, 1.0]])
    return logp, old, adv, torch.ones(1, 5, dtype=torch.bool)


def test_asymmetric_clipping_at_both_ends_token_mean():
    logp, old, adv, mask = five_tokens()
    loss, st = clipped_surrogate_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.3)
    assert loss.item() == pytest.approx((-2.6 + 0.9 + 1.5 - 1.0 - 1.2) / 5, abs=1e-6)  # −0.48
    assert st["clip_frac"] == pytest.approx(2 / 5)
    assert st["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.5 + 0.5 + 1.2) / 5, abs=1e-6)
    assert "kl" not in st


def test_clipped_tokens_get_no_gradient_and_the_others_minus_ratio_times_advantage():
    logp, old, adv, mask = five_tokens()
    logp.requires_grad_(True)
    loss, _ = clipped_surrogate_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.3)
    loss.backward()
    # d(−r·A)/d logp = −r·A (dr/dlogp = r), divided by the 5 tokens; 0 where the clipped term is active
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, 1.5 / 5, -1.0 / 5, -1.2 / 5]]), atol=1e-6)


def test_seq_mean_averages_each_response_first():
    logp, old, adv, _ = five_tokens()
    # the same five tokens as two responses: tokens 0-2, and tokens 3-4 (right-padded with a token that would
    # dominate everything if the mask let it through)
    two = lambda x, pad: torch.stack([x[0, :3], torch.cat([x[0, 3:], torch.tensor([pad])])])  # noqa: E731
    logp2, old2, adv2 = two(logp, 3.0), two(old, -2.0), two(adv, 1e6)
    mask2 = torch.tensor([[True, True, True], [True, True, False]])
    loss, st = clipped_surrogate_loss(logp2, old2, adv2, mask2, 0.1, 0.3, "seq-mean")
    assert loss.item() == pytest.approx(((-2.6 + 0.9 + 1.5) / 3 + (-1.0 - 1.2) / 2) / 2, abs=1e-6)  # −0.5833
    loss_tok, st_tok = clipped_surrogate_loss(logp2, old2, adv2, mask2, 0.1, 0.3, "token-mean")
    assert loss_tok.item() == pytest.approx(-0.48, abs=1e-6)  # the padded token changes nothing
    assert st["clip_frac"] == st_tok["clip_frac"] == pytest.approx(2 / 5)


def test_empty_responses_count_as_zero_and_never_divide_by_zero():
    logp = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
    old = torch.zeros(2, 2)
    adv = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    mask = torch.tensor([[True, True], [False, False]])  # the second response has no token
    loss, _ = clipped_surrogate_loss(logp, old, adv, mask, aggregation="seq-mean")
    assert loss.item() == pytest.approx(-0.5)  # (−1 + 0) / 2 responses, as TRL's "grpo" loss
    loss, st = clipped_surrogate_loss(logp, old, adv, torch.zeros(2, 2, dtype=torch.bool))
    assert loss.item() == 0.0 and st == {"clip_frac": 0.0, "ratio_mean": 0.0}


def test_k3_kl_per_token():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    old = logp.clone()  # ratio 1: the surrogate is −A per token
    adv = torch.tensor([[1.0, -1.0, 0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    ref = logp + torch.tensor([[0.0, LN2, -LN2]])  # k3 = e^d − d − 1: 0, 1 − ln 2, ln 2 − 1/2 (sum 1/2)
    loss0, st0 = clipped_surrogate_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.0)
    assert st0["kl"] == pytest.approx(0.5 / 3, abs=1e-6)  # reported even when it does not enter the loss
    assert loss0.item() == pytest.approx((-1.0 + 1.0 - 0.5) / 3, abs=1e-6)
    loss, st = clipped_surrogate_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.3)
    assert st["kl"] == pytest.approx(1 / 6, abs=1e-6)
    assert loss.item() == pytest.approx(-0.5 / 3 + 0.3 / 6, abs=1e-6)
    # seq-mean: the KL enters per token, before the per-response mean
    two = torch.ones(2, 3, dtype=torch.bool)
    two[1, 2] = False
    loss, st = clipped_surrogate_loss(logp.repeat(2, 1), old.repeat(2, 1), adv.repeat(2, 1), two, 0.2, 0.2,
                                      "seq-mean", ref.repeat(2, 1), 0.3)
    row0 = (-0.5 + 0.3 * 0.5) / 3
    row1 = (0.0 + 0.3 * (1 - LN2)) / 2
    assert loss.item() == pytest.approx((row0 + row1) / 2, abs=1e-6)
    assert st["kl"] == pytest.approx((0.5 + 1 - LN2) / 5, abs=1e-6)


def test_unknown_aggregation_is_named():
    logp, old, adv, mask = five_tokens()
    with pytest.raises(MrtpoError) as e:
        clipped_surrogate_loss(logp, old, adv, mask, aggregation="sum")
    assert str(e.value) == "aggregation must be one of token-mean, seq-mean, not 'sum'"


# ---------------------------------------------------------------------------------------------- log-probabilities
PROMPTS = [[5, 9, 13, 2], [7, 1]]
RESPONSES = [[3, 8], [4, 4, 11, 6]]  # the longer prompt has the shorter response: both paddings happen


def plain_logprobs(model, prompt, response, temperature=1.0):
    """log π(y_t | x, y<t) from one unpadded forward pass of the whole sequence."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float() / temperature
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1: len(prompt) - 1 + len(response)]
    return lp.gather(1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_token_logprobs_equal_a_plain_forward_pass(tiny, temperature):
    with torch.no_grad():
        logp, mask = token_logprobs(tiny.model, PROMPTS, RESPONSES, tiny.tokenizer.pad_token_id, temperature)
        assert logp.shape == mask.shape == (2, 4)
        assert mask.tolist() == [[True, True, False, False], [True, True, True, True]]
        assert logp[0, 2:].tolist() == [0.0, 0.0]  # padding is 0, not a log-probability
        for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
            assert torch.allclose(logp[i, : len(r)], plain_logprobs(tiny.model, p, r, temperature), atol=1e-5)


@pytest.mark.parametrize("arch", ["gemma2", "qwen3", "gpt2"])
def test_token_logprobs_are_the_models_own_for_other_architectures(arch):
    """The update's log-probs are the model's own: Gemma 2's final logits are soft-capped (its head alone is not what
    the model samples from; the cap is small here so that it bites), Qwen 3 and GPT-2 go through the same head."""
    from mrtpo.model.zoo import random_model

    extra = {"final_logit_softcapping": 0.5} if arch == "gemma2" else {}
    lm = random_model(arch, **extra)
    with torch.no_grad():
        logp, _ = token_logprobs(lm.model, PROMPTS, RESPONSES, lm.tokenizer.pad_token_id)
        for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
            assert torch.allclose(logp[i, : len(r)], plain_logprobs(lm.model, p, r), atol=1e-5)


def test_token_logprobs_temperature_zero_is_temperature_one(tiny):
    """Greedy sampling (temperature 0) has no distribution of its own: the update uses the model's (T = 1)."""
    with torch.no_grad():
        t0, _ = token_logprobs(tiny.model, PROMPTS, RESPONSES, tiny.tokenizer.pad_token_id, 0.0)
        t1, _ = token_logprobs(tiny.model, PROMPTS, RESPONSES, tiny.tokenizer.pad_token_id, 1.0)
        warm, _ = token_logprobs(tiny.model, PROMPTS, RESPONSES, tiny.tokenizer.pad_token_id, 2.0)
    assert torch.equal(t0, t1)
    assert not torch.allclose(t1, warm)


# ---------------------------------------------------------------------------------------------- trainable state
@pytest.fixture
def model(tiny):
    return copy.deepcopy(tiny.model)


def test_trainable_state_is_every_trained_parameter_once(model):
    names = [k for k, _ in model.named_parameters()]
    state = trainable_state(model, lora=False)
    assert list(state) == names and len(names) == 20  # 2 layers × 9 + embedding + final norm
    assert "lm_head.weight" not in state  # tied to the embedding: saved once, under its first name
    assert all(v.device.type == "cpu" and not v.requires_grad for v in state.values())
    model.model.norm.weight.requires_grad_(False)  # frozen weights are not part of it
    assert list(trainable_state(model, lora=False)) == [k for k in names if k != "model.norm.weight"]


def test_load_trainable_state_round_trip(model):
    saved = {k: v.clone() for k, v in trainable_state(model, lora=False).items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    load_trainable_state(model, saved, lora=False)
    assert all(torch.equal(p, saved[k]) for k, p in model.named_parameters())
    # a superset (an older checkpoint that also holds frozen weights) is fine
    model.model.norm.weight.requires_grad_(False)
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    load_trainable_state(model, {**saved, "extra.weight": torch.zeros(1)}, lora=False)
    assert torch.equal(model.model.norm.weight, saved["model.norm.weight"] + 1)  # frozen: left as it was


def test_load_trainable_state_errors(model):
    state = trainable_state(model, lora=False)
    short = {k: v for k, v in state.items() if k != "model.embed_tokens.weight"}
    with pytest.raises(MrtpoError) as e:
        load_trainable_state(model, short, lora=False)
    assert str(e.value) == "lacks 1 trained tensor (model.embed_tokens.weight, …)"
    with pytest.raises(MrtpoError, match=r"lacks 20 trained tensors \(model.embed_tokens.weight, …\)"):
        load_trainable_state(model, {}, lora=False)
    wrong = dict(state, **{"model.norm.weight": torch.zeros(3)})
    with pytest.raises(MrtpoError, match=r"^does not fit: "):
        load_trainable_state(model, wrong, lora=False)


# ---------------------------------------------------------------------------------------------- Policy.build
def build(tiny, dtype=torch.float32, **kw):
    cfg = TrainConfig.from_dict(dict(model="tiny-random", device="cpu", seed=7, **kw))
    lm = LoadedModel(model=copy.deepcopy(tiny.model).to(dtype), tokenizer=tiny.tokenizer, name=tiny.name,
                     device=tiny.device, dtype=dtype)
    return cfg, Policy.build(cfg, lm)


def test_build_full_finetuning_float32_without_reference(tiny):
    cfg, pol = build(tiny, torch.bfloat16, lr=3e-4)
    assert pol.lm.dtype == torch.float32 and not pol.lora and pol.pristine
    assert pol.params and all(p.dtype == torch.float32 and p.requires_grad for p in pol.params)
    assert len(pol.params) == 20 and pol.reference is None
    assert pol.ref_logprobs(PROMPTS, RESPONSES, cfg.optim.kl_coef, 1.0) is None
    assert pol.optimizer.param_groups[0]["lr"] == 3e-4
    assert not pol.lm.model.training  # eval mode: no dropout


def test_build_leaves_the_global_rng_alone(tiny):
    """Building a policy draws nothing from torch's global generator and does not seed it (issue 26: the library's
    draws come from generators it owns)."""
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    build(tiny)
    assert torch.equal(torch.rand(3), want)


def test_build_with_kl_keeps_a_frozen_reference(tiny):
    cfg, pol = build(tiny, kl_coef=0.1)
    ref = pol.reference
    assert ref is not None and ref is not pol.lm.model and not ref.training
    assert not any(p.requires_grad for p in ref.parameters())
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), pol.lm.model.parameters()))
    with torch.no_grad():
        pol.params[0].add_(1.0)  # training the policy leaves the reference where it started
    assert not torch.equal(next(ref.parameters()), pol.params[0])
    got = pol.ref_logprobs(PROMPTS, RESPONSES, cfg.optim.kl_coef, 1.0)
    with torch.no_grad():
        want, _ = token_logprobs(tiny.model, PROMPTS, RESPONSES, tiny.tokenizer.pad_token_id)
    assert torch.allclose(got, want, atol=1e-6)


def test_state_and_load_round_trip(tiny):
    _, pol = build(tiny)
    state = pol.state(5)
    assert state["step"] == 5 and state["lora"] is False
    saved = {k: v.clone() for k, v in state["model"].items()}  # on the CPU the tensors share the parameters' storage
    old_rng = torch.get_rng_state()  # an older checkpoint's torch_rng is not applied to the global generator
    with torch.no_grad():
        for p in pol.params:
            p.mul_(0.0)
    torch.rand(10)
    now = torch.get_rng_state()
    pol.load({**state, "model": saved, "torch_rng": old_rng})
    assert all(torch.equal(p, saved[k]) for k, p in pol.lm.model.named_parameters())
    assert torch.equal(torch.get_rng_state(), now) and not torch.equal(now, old_rng) and not pol.pristine
