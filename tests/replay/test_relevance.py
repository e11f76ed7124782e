"""JS distance against scipy, normalization, and batched + prefix-shared replay against the naive one."""
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from mrtpo.core.advantages import active_rewards
from mrtpo.core.js import js_distance, normalize_relevance
from mrtpo.errors import MrtpoError
from mrtpo.replay import ReplayConfig, naive_replay_group, replay_group
from mrtpo.templates import REWORDINGS, Template, reworded_key


def test_js_matches_scipy_natural_log():
    g = torch.Generator().manual_seed(0)
    for V in (2, 7, 300):
        a, b = torch.randn(5, V, generator=g) * 3, torch.randn(5, V, generator=g) * 3
        lp, lq = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
        ours = js_distance(lp, lq).numpy()
        ref = [jensenshannon(p, q) for p, q in zip(lp.exp().double().numpy(), lq.exp().double().numpy())]
        np.testing.assert_allclose(ours, ref, atol=1e-5)
        # squared: the JS divergence itself (scipy returns the distance, i.e. the square root)
        np.testing.assert_allclose(ours ** 2, np.square(ref), atol=1e-5)


def test_js_bounds_and_zeros():
    p = torch.tensor([[1.0, 0.0, 0.0]])
    q = torch.tensor([[0.0, 1.0, 0.0]])
    d = js_distance(torch.log(p), torch.log(q))
    assert d.item() == pytest.approx(math.sqrt(math.log(2)), abs=1e-6)  # disjoint supports: the maximum
    assert js_distance(torch.log(p), torch.log(p)).item() == 0.0
    assert jensenshannon([1, 0, 0], [0, 1, 0]) == pytest.approx(d.item(), abs=1e-6)


def test_js_exact_zero_and_accurate_when_close():
    """Identical distributions give exactly 0; nearly identical ones keep their relative accuracy (each term of
    the sum is >= 0, so nothing cancels), against a float64 reference; zero probabilities are handled."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(6, 5000, generator=g) * 4
    lp = torch.log_softmax(z, -1)
    assert torch.all(js_distance(lp, lp) == 0.0)
    for eps in (1e-4, 1e-2, 1.0):
        lq = torch.log_softmax(z + eps * torch.randn(6, 5000, generator=g), -1)
        ref = np.array([jensenshannon(p, q) for p, q in zip(lp.double().exp().numpy(), lq.double().exp().numpy())])
        np.testing.assert_allclose(js_distance(lp, lq).numpy(), ref, rtol=2e-3, atol=1e-7)
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.2, 0.8]])
    q = torch.tensor([[0.5, 0.25, 0.25], [0.0, 0.2, 0.8]])
    d = js_distance(torch.log(p), torch.log(q)).numpy()
    np.testing.assert_allclose(d, [jensenshannon(p[0].numpy(), q[0].numpy()), 0.0], atol=1e-6)


def test_normalize_relevance():
    d = torch.tensor([[0.0, 1.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    rho = normalize_relevance(d, mask)
    np.testing.assert_allclose(rho[0].numpy(), [0.0, 0.75, 2.25, 1.0])  # T·d/Σd with T = 3; 1 on padding
    np.testing.assert_allclose(rho[1].numpy(), [1.0, 1.0, 1.0, 1.0])  # Σd = 0 → uniform; 1 on padding
    assert rho[0, :3].mean().item() == pytest.approx(1.0)


def test_active_rewards_skip_constant_columns():
    R = np.array([[1, 0, 1], [1, 1, 0], [1, 0, np.nan]])
    assert active_rewards(["a", "b", "c"], R) == (["b", "c"], ["a"])
    assert active_rewards(["a", "b"], None) == (["a", "b"], [])


INFO = {"format": "Answer with one ```sql block.", "correct": "Reference query: SELECT name FROM users WHERE age > 30"}
PROMPT = "Schema: users(id, name, age). List the names of users older than 30."
RESPONSES = ["```sql\nSELECT name FROM users WHERE age > 30\n```", "SELECT * FROM users;", "names: ü, é — done", "x"]


@pytest.mark.parametrize("budget", [64, 4096])
def test_batched_prefix_shared_equals_naive(tiny, budget):
    infos = [dict(INFO, correct=INFO["correct"] + f" (response {i})") for i in range(len(RESPONSES))]
    fast = replay_group(tiny, PROMPT, infos, RESPONSES, config=ReplayConfig(token_budget=budget, precision="model"))
    slow = naive_replay_group(tiny, PROMPT, infos, RESPONSES)
    assert fast.prefix_tokens > 20 and fast.forward_tokens < slow.forward_tokens
    for f, s in zip(fast.responses, slow.responses):
        assert f.token_ids == s.token_ids
        for k in INFO:
            np.testing.assert_allclose(f.js[k], s.js[k], atol=1e-4)
            np.testing.assert_allclose(f.relevance[k], s.relevance[k], rtol=2e-2)
            assert f.relevance[k].mean() == pytest.approx(1.0, abs=1e-5)


def test_reworded_variants_batched_equal_naive_and_leave_the_rest_alone(tiny):
    """P_k′ (v_k reworded, R = len(REWORDINGS)): d′ (R, T) equal in the batched and the naive replay, every other
    output as without rewording, and asked for by the measure that reads it."""
    cfg = ReplayConfig(token_budget=64, precision="model")
    fast = replay_group(tiny, PROMPT, INFO, RESPONSES, config=cfg, reword=True)
    slow = naive_replay_group(tiny, PROMPT, INFO, RESPONSES, reword=True)
    plain = replay_group(tiny, PROMPT, INFO, RESPONSES, config=cfg)
    auto = replay_group(tiny, PROMPT, INFO, RESPONSES[:1], config=cfg, measure="js-reworded")
    assert set(auto.responses[0].js_reworded) == set(INFO) and plain.responses[0].js_reworded == {}
    for j, (before, after) in enumerate(REWORDINGS):
        for k in INFO:
            reworded = fast.prompts[0][reworded_key(k, j)]
            assert f"{before}{INFO[k]}{after}" in reworded and all(INFO[o] in reworded for o in INFO)
    for f, s, p in zip(fast.responses, slow.responses, plain.responses):
        for k in INFO:
            assert f.js_reworded[k].shape == (len(REWORDINGS), len(f.token_ids))
            np.testing.assert_allclose(f.js_reworded[k], s.js_reworded[k], atol=1e-4)
            assert (f.js_reworded[k] > 0).any()  # another wording does move the distributions a little
            np.testing.assert_allclose(f.js[k], p.js[k], atol=1e-5)  # other batches: float rounding only
            np.testing.assert_allclose(f.logp_without[k], p.logp_without[k], atol=1e-4)
    # an empty v_k stays empty when reworded: P_k′ = P_all, d′ = 0
    empty = replay_group(tiny, PROMPT, {"a": "", "b": "check b"}, RESPONSES[:1], reword=True,
                         template=Template(item="{text}", separator=""))
    np.testing.assert_allclose(empty.responses[0].js_reworded["a"], 0.0, atol=1e-6)


@pytest.mark.parametrize("precision", ["model", "bfloat16"])
def test_small_logits_budget_chunks_vocab(tiny, monkeypatch, precision):
    """Projections of a few tokens (logits_budget), and the element-wise chain a token at a time inside them
    (JS_LOGITS), give what one projection of everything gives: the same numbers, bit for bit."""
    from mrtpo.replay import vocab

    V = tiny.model.config.vocab_size
    whole = replay_group(tiny, PROMPT, INFO, RESPONSES[:2], config=ReplayConfig(precision=precision))
    monkeypatch.setattr(vocab, "JS_LOGITS", V * (1 + len(INFO)))  # one token per step of the chain
    budget = 4 * V * (1 + len(INFO))  # 4 tokens per projection
    parts = replay_group(tiny, PROMPT, INFO, RESPONSES[:2], config=ReplayConfig(logits_budget=budget,
                                                                              precision=precision))
    assert min(len(r.token_ids) for r in parts.responses) > 3 * 4  # several projections per response
    for x, y in zip(parts.responses, whole.responses):
        for k in INFO:
            np.testing.assert_array_equal(x.js[k], y.js[k])
            np.testing.assert_array_equal(x.logp_without[k], y.logp_without[k])
        np.testing.assert_array_equal(x.logp_all, y.logp_all)
        assert x.js["format"].max() > 0


def test_tokens_have_offsets_into_response(tiny):
    res = replay_group(tiny, PROMPT, INFO, RESPONSES)
    for text, r in zip(RESPONSES, res.responses):
        toks = r.tokens()
        assert len(toks) == len(r.js["format"]) == len(r.token_ids)
        assert toks[0]["start"] == 0 and toks[-1]["end"] == len(text)
        assert all(t["text"] == text[t["start"]:t["end"]] for t in toks)


def test_constant_reward_skipped(tiny):
    R = np.array([[1, 0], [1, 1], [1, 0], [1, 1]])
    res = replay_group(tiny, PROMPT, INFO, RESPONSES, rewards=R)
    assert res.rewards == ["correct"] and res.skipped == ["format"]
    assert set(res.responses[0].js) == {"correct"}


def test_identical_prompts_give_zero_distance(tiny):
    res = replay_group(tiny, PROMPT, {"a": "", "b": "check b"}, RESPONSES[:2],
                       template=Template(item="{text}", separator=""))
    np.testing.assert_allclose(res.responses[0].js["a"], 0.0, atol=1e-6)
    np.testing.assert_allclose(res.responses[0].relevance["a"], 1.0)


def test_prompts_are_leave_one_out(tiny):
    res = replay_group(tiny, PROMPT, INFO, RESPONSES[:1])
    p = res.prompts[0]
    assert INFO["format"] in p["__all__"] and INFO["correct"] in p["__all__"]
    assert INFO["format"] not in p["format"] and INFO["correct"] in p["format"]
    assert p["__all__"].index(PROMPT) < p["__all__"].index(INFO["format"])  # shared part first


def test_default_model_relevance_peaks_on_named_keyword(smol):
    """The real model: a verifier text naming 'banana' makes the 'banana' token more relevant than the rest."""
    info = {"keyword": "The response must contain the word 'banana'.", "length": "The response must be under 40 words."}
    text = "I love eating a banana every morning because it gives me energy for the day."
    res = replay_group(smol, "Write one sentence about your breakfast.", info, [text],
                       config=ReplayConfig(precision="model"))
    r = res.responses[0]
    toks = [t["text"].strip().lower() for t in r.tokens()]
    i = toks.index("banana")
    rel = r.relevance["keyword"]
    assert rel[i] > 1.5 and rel[i] > np.median(np.delete(rel, i)) * 2
    batched = res.responses[0].js["keyword"]
    naive_res = naive_replay_group(smol, "Write one sentence about your breakfast.", info, [text])
    naive = naive_res.responses[0].js["keyword"]
    np.testing.assert_allclose(batched, naive, atol=1e-4)


def test_bf16_replay_tracks_exact_replay(smol):
    """The bf16 path (what precision="auto" takes on CPUs with AMX/AVX512-BF16; forced here, so it runs on any CPU)
    stays close to the float32 replay, and differs from it (it really ran in bf16)."""
    info = {"keyword": "The response must contain the word 'banana'.", "length": "The response must be under 40 words."}
    texts = ["I love eating a banana every morning because it gives me energy.", "Toast with jam and tea, always."]
    exact = replay_group(smol, "Write one sentence about your breakfast.", info, texts,
                         config=ReplayConfig(precision="model"))
    fast = replay_group(smol, "Write one sentence about your breakfast.", info, texts,
                        config=ReplayConfig(precision="bfloat16"))
    assert any(not np.array_equal(a.js[k], b.js[k]) for a, b in zip(exact.responses, fast.responses) for k in info)
    for a, b in zip(exact.responses, fast.responses):
        for k in info:
            assert np.corrcoef(a.js[k], b.js[k])[0, 1] > 0.9
            assert np.abs(a.js[k] - b.js[k]).mean() < 0.02
    with pytest.raises(MrtpoError, match="precision"):
        replay_group(smol, "x", info, texts[:1], config=ReplayConfig(precision="fp8"))


@pytest.mark.parametrize("measure", ["js", "attn-contrast"])
def test_groups_replayed_together_give_what_each_alone_gives(tiny, measure):
    """replay_groups: two groups (different prompts, rewards, a constant reward skipped in one) through one trie —
    each group's JS, log-probs and relevance as its own replay gives them, in fewer passes than the two apart."""
    from mrtpo.replay import GroupInput, replay_groups

    other = {"short": "Keep it under ten words.", "polite": "Say please.", "json": "Answer in JSON."}
    rewards = np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # "short" constant: skipped
    groups = [GroupInput(PROMPT, INFO, RESPONSES), GroupInput("Greet the user.", other, RESPONSES[:3], rewards)]
    cfg = ReplayConfig(precision="model")
    joint = replay_groups(tiny, groups, config=cfg, measure=measure)
    apart = [replay_group(tiny, g.prompt, g.verifier_info, g.responses, rewards=g.rewards, config=cfg,
                          measure=measure) for g in groups]
    assert [r.rewards for r in joint] == [["format", "correct"], ["polite", "json"]] and joint[1].skipped == ["short"]
    for j, a in zip(joint, apart):
        assert j.prefix_tokens == a.prefix_tokens > 10
        for x, y in zip(j.responses, a.responses):
            assert x.token_ids == y.token_ids and x.text == y.text
            np.testing.assert_allclose(x.logp_all, y.logp_all, atol=1e-4)
            for k in j.rewards:
                np.testing.assert_allclose(x.js[k], y.js[k], atol=1e-5)
                np.testing.assert_allclose(x.relevance[k], y.relevance[k], atol=1e-3)
                if measure == "attn-contrast":
                    np.testing.assert_allclose(x.attn[k], y.attn[k], atol=1e-5)
    assert joint[0].forward_passes == joint[1].forward_passes < apart[0].forward_passes + apart[1].forward_passes
    assert max(float(r.js["json"].max()) for r in joint[1].responses) > 0
    assert replay_groups(tiny, []) == []  # a batch with nothing to replay (the TRL integration's)
