"""The measures that need no replay (``ktae``, ``entropy``): the sampler's entropy and the forward under the sampling
prompt against a plain forward + softmax entropy; no replay pass where only they are asked for (the engine, a scored
group, the trainer, TRL); every measure from one result equal to the single calls."""
import numpy as np
import pytest
import torch

from mrtpo.core.ktae import ktae_scores
from mrtpo.groups import sample_group, template_for
from mrtpo.model import sample
from mrtpo.replay import (
    GroupInput,
    ReplayConfig,
    replay_group,
    replay_groups,
    replay_scored,
    sampling_entropy,
)
from mrtpo.replay import engine as E
from mrtpo.replay import noreplay as N
from mrtpo.tasks import get_family
from tests.model.test_sampler import spiky  # noqa: F401 (a fixture: peaked next-token distributions)

PROMPT = "Name three fruits."
INFO = {"kw": "Include the keyword 'apple'.", "nc": "Do not use commas."}


def direct_entropy(lm, prompt: str, ids: list[int], temperature: float) -> np.ndarray:
    """H_t of softmax(logits / τ) at every response position: the whole sequence through the model, full logits."""
    x = lm.encode(lm.chat_prompt(prompt))
    with torch.no_grad():
        logits = lm.model(torch.tensor([x + ids])).logits[0, len(x) - 1: len(x) - 1 + len(ids)].float()
    lp = torch.log_softmax(logits / temperature, -1)
    return (-(lp.exp() * lp).sum(-1)).numpy()


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_the_sampler_records_the_entropy_of_each_step(spiky, temperature, top_p):  # noqa: F811
    """Sample.entropy is H(π_τ(·|x, y<t)) at the sampling temperature, before top-p (TRL's entropy)."""
    out = sample(spiky, PROMPT, n=3, max_new_tokens=10, temperature=temperature, top_p=top_p, seed=1,
                 precision="model")
    assert all(s.entropy is not None and len(s.entropy) == len(s.token_ids) for s in out)
    assert any(len(s.token_ids) > 3 for s in out)
    for s in out:
        want = direct_entropy(spiky, PROMPT, s.token_ids, temperature)
        np.testing.assert_allclose(s.entropy, want, atol=2e-4)
    # greedy: the policy's own distribution (τ = 1)
    g = sample(spiky, PROMPT, n=1, max_new_tokens=6, temperature=0.0, precision="model")[0]
    np.testing.assert_allclose(g.entropy, direct_entropy(spiky, PROMPT, g.token_ids, 1.0), atol=2e-4)


def test_the_forward_under_the_sampling_prompt(spiky):  # noqa: F811
    """sampling_entropy (responses the sampler did not record: x once, its cache shared by the responses) equals the
    direct computation; an empty response has none; the head in chunks bounded by ENTROPY_LOGITS gives the same."""
    rows = [[5, 9, 13, 2], [7], [], [3, 3, 3, 8, 1, 4]]
    got = sampling_entropy(spiky, PROMPT, rows, temperature=0.8, precision="model")
    for ids, h in zip(rows, got):
        assert len(h) == len(ids)
        if ids:
            np.testing.assert_allclose(h, direct_entropy(spiky, PROMPT, ids, 0.8), atol=2e-5)
    small = N.ENTROPY_LOGITS
    try:
        N.ENTROPY_LOGITS = 1  # the head over one token at a time
        for a, b in zip(sampling_entropy(spiky, PROMPT, rows, temperature=0.8, precision="model"), got):
            np.testing.assert_allclose(a, b, atol=2e-5)
    finally:
        N.ENTROPY_LOGITS = small
    # the decoder stack on bfloat16 copies (what "auto" picks on a CPU with fast bf16 products, as the replay does):
    # the same entropies up to bf16's rounding of the hidden states
    for a, b in zip(sampling_entropy(spiky, PROMPT, rows, temperature=0.8, precision="bfloat16"), got):
        np.testing.assert_allclose(a, b, atol=0.05 * max(1.0, float(np.max(b, initial=0))))


@pytest.fixture
def no_replay(monkeypatch):
    """The replay's passes fail if they run: the shared-prefix forward and the attention pass."""
    def boom(*a, **k):
        raise AssertionError("a replay pass ran")

    monkeypatch.setattr(E, "shared_hidden", boom)
    monkeypatch.setattr(E, "_info_attention", boom)


def count_forwards(monkeypatch) -> list:
    """Every entropy forward (the shared-prefix pass of mrtpo.replay.noreplay), counted by its sequences."""
    calls = []
    real = N.shared_hidden

    def spy(dec, pad, dev, seqs, *a, **k):
        calls.append(len(seqs))
        return real(dec, pad, dev, seqs, *a, **k)

    monkeypatch.setattr(N, "shared_hidden", spy)
    return calls


def test_no_replay_for_ktae_and_entropy(tiny, no_replay, monkeypatch):
    """The engine hands ktae / entropy to the replay-free path: no replay pass; ktae no model pass at all; entropy one
    forward under the prompt for given texts, none for samples that carry their entropy."""
    calls = count_forwards(monkeypatch)
    texts = ["apple, pear, fig", "banana and kiwi", "apple pie", "grapes"]
    R = np.array([[1, 0], [0, 1], [1, 1], [0, 1]], dtype=float)
    res = replay_group(tiny, PROMPT, INFO, texts, rewards=R, measure="ktae")
    assert not res.replayed and res.forward_passes == 0 and not calls and res.responses[0].js == {}
    ids = [r.token_ids for r in res.responses]
    for i, rr in enumerate(res.responses):  # per reward: its own tables over the group
        for j, k in enumerate(INFO):
            s = ktae_scores(ids, R[:, j], i)
            np.testing.assert_allclose(rr.relevance[k], len(s) * s / s.sum(), atol=1e-5)
    ent = replay_group(tiny, PROMPT, INFO, texts, measure="entropy", config=ReplayConfig(precision="model"))
    assert calls == [4] and ent.forward_passes == 1 and ent.entropy_seconds > 0
    for rr in ent.responses:
        h = direct_entropy(tiny, PROMPT, rr.token_ids, 1.0)
        np.testing.assert_allclose(rr.entropy, h, atol=2e-5)
        np.testing.assert_allclose(rr.relevance["kw"], len(h) * h / h.sum(), atol=1e-4)
        np.testing.assert_allclose(rr.relevance["nc"], rr.relevance["kw"])  # the same for every reward
    with pytest.raises(Exception, match="the 'ktae' measure needs the group's rewards"):
        replay_group(tiny, PROMPT, INFO, texts, measure="ktae")
    # a scored group of samples: the sampler's entropies, no forward at all
    fam = get_family("tools")
    g = sample_group(tiny, fam, fam.examples()[0], n=3, max_new_tokens=8, seed=0)
    calls.clear()
    for m in ("entropy", "ktae"):
        rep = replay_scored(tiny, g, template_for(fam), measure=m, skip_constant=False)
        assert not rep.replayed and not calls
        assert set(rep.responses[0].relevance) == set(g.reward_names)
    np.testing.assert_allclose(rep.responses[1].entropy, g.samples[1].entropy)


def test_one_result_serves_every_measure(tiny, monkeypatch):
    """replay_groups with several measures: one replay (with the attention pass), the group's rewards, the entropy
    forward; each measure re-derived from it equals the single call with that measure."""
    from mrtpo.model import decoder

    monkeypatch.setattr(decoder, "fast_bf16_cpu", lambda: False)  # float32 everywhere: the batches round alike
    texts = ["apple, pear, fig", "banana and kiwi", "apple pie"]
    R = np.array([[1, 0], [0, 1], [1, 1]], dtype=float)
    gi = GroupInput(PROMPT, INFO, texts, R, PROMPT)
    measures = ["js", "ktae", "entropy", "attn-contrast", "js-support"]
    both = replay_groups(tiny, [gi], None, measure=measures, skip_constant=False)[0]
    assert both.replayed and both.attention_seconds > 0 and both.entropy_seconds > 0
    for m in measures:
        one = replay_groups(tiny, [gi], None, measure=[m], skip_constant=False)[0]
        assert one.replayed == (m not in ("ktae", "entropy"))
        for a, b in zip(one.with_measure(m).responses, both.with_measure(m).responses):
            for k in INFO:
                np.testing.assert_allclose(a.relevance[k], b.relevance[k], atol=1e-4, err_msg=m)


def test_measured_groups_skip_the_replay_for_replay_free_measures(tiny, no_replay):
    fam = get_family("sql")
    g = sample_group(tiny, fam, fam.examples()[0], n=3, max_new_tokens=8, seed=2)
    rep = replay_groups(tiny, [g], template_for(fam), ReplayConfig(), ["ktae", "entropy", "evidence"],
                        skip_constant=False)[0]
    assert not rep.replayed
    for m in ("ktae", "entropy", "evidence"):
        assert set(rep.with_measure(m, g.evidence).responses[0].relevance) == set(g.reward_names)
