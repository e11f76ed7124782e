"""A frozen model's cast weight copies are made once and kept (mrtpo.model.decoder.Decoder's ``keep``): the same
results as fresh copies, one cast per module and dtype, none for a model that is not frozen."""
import copy
import dataclasses

import numpy as np
import torch

from mrtpo.model import decoder as D
from mrtpo.model import llama_step as L
from mrtpo.model import sample
from mrtpo.replay import replay_group


def fresh(tiny, frozen):
    return dataclasses.replace(tiny, model=copy.deepcopy(tiny.model), frozen=frozen)


def test_kept_decoders_share_one_cast_and_what_memo_makes(tiny):
    stack = D.decoder_stack(copy.deepcopy(tiny.model))
    a, b = D.Decoder(stack, torch.bfloat16, keep=True), D.Decoder(stack, torch.bfloat16, keep=True)
    assert a.params is b.params and a.params["norm.weight"].dtype == torch.bfloat16
    c = D.Decoder(stack, torch.bfloat16)
    assert c.params is not a.params and torch.equal(c.params["norm.weight"], a.params["norm.weight"])
    made = []
    assert a.memo("x", lambda: made.append(1) or len(made)) == b.memo("x", lambda: made.append(1) or len(made)) == 1
    assert c.memo("x", lambda: made.append(1) or len(made)) == 2  # not kept: its own
    assert D.Decoder(stack, torch.float32, keep=True).params is None  # nothing to cast
    assert D.Decoder(stack, torch.float16, keep=True).params["norm.weight"].dtype == torch.float16  # per dtype


def test_a_frozen_model_samples_and_replays_as_a_fresh_one_with_one_cast(tiny, monkeypatch):
    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: True)  # "auto": bf16 copies, the own step
    built = []
    real = L.LlamaStep
    monkeypatch.setattr(L, "LlamaStep", lambda *a: built.append(1) or real(*a))
    frozen, thawed = fresh(tiny, True), fresh(tiny, False)
    for _ in range(2):
        got = sample(frozen, "SELECT the names", n=3, max_new_tokens=10, seed=4)
        want = sample(thawed, "SELECT the names", n=3, max_new_tokens=10, seed=4)
        assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert len(built) == 3  # once for the frozen model, once per call for the other
    info = {"a": "Rule A: name the table.", "b": "Rule B: end with a semicolon."}
    ids = [s.token_ids for s in got]
    r1 = replay_group(frozen, "SELECT the names", info, ids)
    r2 = replay_group(thawed, "SELECT the names", info, ids)
    for x, y in zip(r1.responses, r2.responses):
        for k in info:
            np.testing.assert_array_equal(x.js[k], y.js[k])
    kept = D._kept[D.decoder_stack(frozen.model)][torch.bfloat16]
    assert {"params", "llama_step", "head_t"} <= set(kept)
    assert D.decoder_stack(thawed.model) not in D._kept  # a model a trainer may update keeps nothing


def test_weights_fixed_shares_one_cast_for_the_block_and_drops_it_after(tiny, monkeypatch):
    """A trainer's sampling and replays between two updates (``weights_fixed``): one cast for the block, the same
    results as per-call copies; after it nothing is kept, and a change of the weights shows in the next copies."""
    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: True)
    built = []
    real = L.LlamaStep
    monkeypatch.setattr(L, "LlamaStep", lambda *a: built.append(1) or real(*a))
    lm, ref = fresh(tiny, False), fresh(tiny, False)
    stack = D.decoder_stack(lm.model)
    info = {"a": "Rule A: name the table.", "b": "Rule B: end with a semicolon."}
    with D.weights_fixed(lm):
        assert lm.frozen
        got = [sample(lm, "SELECT the names", n=3, max_new_tokens=10, seed=s) for s in (1, 2)]
        rep = replay_group(lm, "SELECT the names", info, [s.token_ids for s in got[0]])
        assert len(built) == 1 and stack in D._kept
    assert not lm.frozen and stack not in D._kept
    want = [sample(ref, "SELECT the names", n=3, max_new_tokens=10, seed=s) for s in (1, 2)]
    assert [[s.token_ids for s in g] for g in got] == [[s.token_ids for s in g] for g in want]
    again = replay_group(ref, "SELECT the names", info, [s.token_ids for s in want[0]])
    for x, y in zip(rep.responses, again.responses):
        np.testing.assert_array_equal(x.js["a"], y.js["a"])
    assert len(built) == 1 + 3  # per call outside the block
    with torch.no_grad():
        stack.norm.weight.add_(0.5)  # an update
    with D.weights_fixed(lm):
        fresh_copy = D.Decoder(stack, torch.bfloat16, keep=lm.frozen).params["norm.weight"]
    torch.testing.assert_close(fresh_copy, stack.norm.weight.detach().to(torch.bfloat16))
    frozen = fresh(tiny, True)
    with D.weights_fixed(frozen):  # a frozen model stays frozen, its copies kept
        sample(frozen, "SELECT", n=2, max_new_tokens=4, seed=0)
    assert frozen.frozen and D.decoder_stack(frozen.model) in D._kept
