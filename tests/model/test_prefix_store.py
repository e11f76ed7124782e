"""A model whose weights do not change keeps the prefixes it ran alone (mrtpo.model.kvcache.PrefixStore): the
sampler's prompt pass and the replay's passes of one shared segment. A reuse gives the same tensors, so the same
tokens and the same JS to the bit; a model a trainer updates keeps nothing past its weights_fixed block."""
import numpy as np
import torch

from mrtpo.model import decoder as D
from mrtpo.model import sample
from mrtpo.model.kvcache import PrefixStore
from mrtpo.replay import replay_group
from tests.model.test_kept_casts import fresh

PROMPT = "SELECT the names"
INFO = {"a": "Rule A: name the table.", "b": "Rule B: end with a semicolon."}



def test_store_keeps_the_most_recently_used_within_its_bytes():
    t = torch.zeros(256, dtype=torch.float32)  # 1 KiB
    s = PrefixStore(max_bytes=3 * 1024)
    s.put(("a",), (t,))
    s.put(("b",), ([t], t.clone()))  # nested: 2 KiB
    assert len(s) == 2 and s.bytes == 3 * 1024
    assert s.get(("a",))[0] is t  # a is now the most recently used
    s.put(("c",), (t.clone(),))  # 4 KiB > 3: the least recently used (b) leaves
    assert s.get(("b",)) is None and s.get(("a",)) is not None and s.get(("c",)) is not None
    assert s.bytes == 2 * 1024 and (s.hits, s.misses) == (3, 1)
    s.put(("big",), (torch.zeros(1024),))  # 4 KiB alone is over the budget: not kept, nothing evicted
    assert s.get(("big",)) is None and len(s) == 2
    s.put(("a",), (t.clone(), t.clone()))  # replaced: its old size is given back
    assert s.bytes == 3 * 1024


def count_prompt_passes(monkeypatch, width):
    """Calls of the Decoder on one row of ``width`` tokens (the sampler's prompt pass)."""
    calls = []
    real = D.Decoder.__call__

    def spy(self, **kw):
        if tuple(kw["input_ids"].shape) == (1, width):
            calls.append(1)
        return real(self, **kw)

    monkeypatch.setattr(D.Decoder, "__call__", spy)
    return calls


def test_a_frozen_model_runs_a_prompt_once_and_samples_the_same_tokens(tiny, monkeypatch):
    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: True)  # "auto": bf16 copies, the own step
    frozen, thawed = fresh(tiny, True), fresh(tiny, False)
    width = len(frozen.encode(frozen.chat_prompt(PROMPT)))
    calls = count_prompt_passes(monkeypatch, width)
    got = [sample(frozen, PROMPT, n=3, max_new_tokens=10, seed=s) for s in (4, 4, 5)]
    assert len(calls) == 1  # the second and third group (another seed) reuse the first one's prompt pass
    want = [sample(thawed, PROMPT, n=3, max_new_tokens=10, seed=s) for s in (4, 4, 5)]
    assert len(calls) == 4  # a model that may change runs it every time
    assert [[s.token_ids for s in g] for g in got] == [[s.token_ids for s in g] for g in want]
    store = D._kept[D.decoder_stack(frozen.model)][torch.bfloat16]["prefixes"]
    assert (store.hits, len(store)) == (2, 1)
    sample(frozen, PROMPT + " and ages", n=3, max_new_tokens=4, seed=4)  # another prompt: run, kept beside
    assert len(store) == 2 and store.hits == 2


def test_a_frozen_model_replays_shared_segments_once_with_the_same_numbers(tiny, monkeypatch):
    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: True)
    frozen, thawed = fresh(tiny, True), fresh(tiny, False)
    ids = [s.token_ids for s in sample(thawed, PROMPT, n=3, max_new_tokens=12, seed=2)]
    first = replay_group(frozen, PROMPT, INFO, ids)
    again = replay_group(frozen, PROMPT, INFO, ids)
    other = replay_group(frozen, PROMPT, INFO, ids[1:])  # another group of the same prompt: its prompt is reused
    ref = [replay_group(thawed, PROMPT, INFO, x) for x in (ids, ids[1:])]
    for got, want in ((first, ref[0]), (again, ref[0]), (other, ref[1])):
        for x, y in zip(got.responses, want.responses):
            for k in INFO:
                np.testing.assert_array_equal(x.js[k], y.js[k])
    store = D._kept[D.decoder_stack(frozen.model)][torch.bfloat16]["prefixes"]
    reused = first.forward_tokens - again.forward_tokens
    assert first.forward_tokens == ref[0].forward_tokens and reused > 0  # the first replay ran everything
    assert reused >= first.prefix_tokens  # at least the prompt every sequence starts with
    assert other.forward_tokens == ref[1].forward_tokens - reused and store.hits >= 2


def test_weights_fixed_drops_the_prefixes_with_the_block(tiny, monkeypatch):
    """A trainer's policy between two updates reuses within the block; after an update the prompt runs again and
    the tokens follow the new weights."""
    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: True)
    lm, ref = fresh(tiny, False), fresh(tiny, False)
    width = len(lm.encode(lm.chat_prompt(PROMPT)))
    calls = count_prompt_passes(monkeypatch, width)
    with D.weights_fixed(lm):
        [sample(lm, PROMPT, n=2, max_new_tokens=6, seed=s) for s in (1, 2)]
    assert len(calls) == 1
    stack = D.decoder_stack(lm.model)
    with torch.no_grad():
        for m in (stack, D.decoder_stack(ref.model)):
            m.norm.weight.add_(0.5)  # the same update to both
    with D.weights_fixed(lm):
        got = sample(lm, PROMPT, n=2, max_new_tokens=6, seed=1)
    assert len(calls) == 2  # run again after the update
    assert [s.token_ids for s in got] == [s.token_ids for s in sample(ref, PROMPT, n=2, max_new_tokens=6, seed=1)]


def test_a_reused_prompt_is_left_out_of_the_measured_sampling_rate(tiny, monkeypatch):
    """The sampling rate (tokens per second, for the app's estimates) counts the forward tokens that ran: a
    reused prompt's are not among them."""
    from mrtpo.model import rates

    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: True)
    recorded = []
    monkeypatch.setattr(rates.RATES, "record", lambda key, tokens, seconds, clean=True: recorded.append(
        (key.phase, tokens)))
    lm = fresh(tiny, True)
    width = len(lm.encode(lm.chat_prompt(PROMPT)))
    got = [sample(lm, PROMPT, n=2, max_new_tokens=6, seed=s) for s in (1, 2)]
    steps = [max(len(x.token_ids) for x in g) for g in got]
    assert recorded == [("sample", width + 2 * (steps[0] - 1)), ("sample", 2 * (steps[1] - 1))]


def test_groups_that_replay_other_rewards_reuse_the_prompts_shared_beginning(tiny, monkeypatch):
    """The replay's passes cut the prompt where its verifier items begin (Plan.shared), whichever rewards a group
    replays: a group that replays only b after one that replayed a and b takes that beginning from the store."""
    from mrtpo.replay.plan import plan_group

    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: True)
    frozen, thawed = fresh(tiny, True), fresh(tiny, False)
    ids = [s.token_ids for s in sample(thawed, PROMPT, n=3, max_new_tokens=12, seed=2)]
    both = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])  # (G, K): a and b vary
    only_b = np.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])  # a is constant: only b is replayed
    replay_group(frozen, PROMPT, INFO, ids, rewards=both)
    got = replay_group(frozen, PROMPT, INFO, ids, rewards=only_b)
    want = replay_group(thawed, PROMPT, INFO, ids, rewards=only_b)
    assert got.rewards == want.rewards == ["b"]
    for x, y in zip(got.responses, want.responses):
        np.testing.assert_array_equal(x.js["b"], y.js["b"])
    from mrtpo.templates import ALL, Template

    shared = plan_group(thawed, PROMPT, INFO, ids, None, only_b).shared
    text = thawed.chat_prompt(Template().variants(PROMPT, INFO)[ALL])
    # every P_\\k shares P_all up to v_a, and "Rule " more: P_\\a has v_b ("Rule B: …") where P_all has v_a
    assert thawed.tokenizer.decode(thawed.encode(text)[:shared]) == text[:text.index(INFO["a"]) + len("Rule ")]
    assert got.forward_tokens == want.forward_tokens - shared
