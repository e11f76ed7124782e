"""P_all's attention from each response token to each reward's verifier information (mrtpo.replay.attention), the
input of the attn-contrast measure: equal to transformers' own attention weights, read in one pass per response."""
import numpy as np
import pytest
import torch

from mrtpo.core.measures import measure_relevance
from mrtpo.model import Decoder, decoder_stack
from mrtpo.replay import ReplayConfig, naive_replay_group, replay_group
from mrtpo.replay.attention import info_attention, info_span
from mrtpo.templates import ALL

INFO = {"format": "Answer with one ```sql block.", "correct": "Reference query: SELECT name FROM users WHERE age > 30"}
PROMPT = "Schema: users(id, name, age). List the names of users older than 30."
RESPONSES = ["```sql\nSELECT name FROM users WHERE age > 30\n```", "SELECT * FROM users;", "x"]


def reference(lm, prompt_ids, response_ids, spans):
    """{reward: (T,)} from the model's own attention weights (eager, output_attentions): the rows of the response's
    positions, summed over each span's columns, mean over heads and the upper half of the layers."""
    old = lm.model.config._attn_implementation
    lm.model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            att = lm.model(input_ids=torch.tensor([prompt_ids + response_ids]), output_attentions=True).attentions
    finally:
        lm.model.config._attn_implementation = old
    A = torch.stack([a[0].mean(0) for a in att[len(att) // 2:]])[:, len(prompt_ids):]  # (upper layers, T, L)
    return {k: A[:, :, a:b].sum(-1).mean(0).numpy() for k, (a, b) in spans.items()}


def test_info_span_hand_worked():
    assert info_span([1, 2, 3, 4, 5, 6], [1, 2, 5, 6]) == (2, 4)  # 3, 4 left out
    assert info_span([1, 2, 3], [1, 2, 3]) == (3, 3)  # an empty v_k: nothing left out
    assert info_span([7, 1, 1, 1], [7, 1, 1]) == (3, 4)  # repeats: the suffix does not reach into the prefix
    assert info_span([9, 8], []) == (0, 2)


def test_info_attention_equals_the_models_attention_weights(tiny):
    """Two responses under one prompt (its KV cache reused, cropped back after each) and one under another prompt:
    every a_kt equal to the eager attention weights of a full pass; the model's attention setting is restored."""
    g = torch.Generator().manual_seed(0)
    V = tiny.model.config.vocab_size
    ids = lambda n: torch.randint(5, V, (n,), generator=g).tolist()  # noqa: E731
    p, q = ids(30), ids(24)
    r = [ids(7), ids(5), ids(6)]
    spans = [{"a": (3, 9), "b": (12, 20)}, {"a": (3, 9), "b": (12, 20)}, {"a": (0, 4), "b": (10, 11)}]
    before = tiny.model.config._attn_implementation
    got = info_attention(Decoder(decoder_stack(tiny.model), torch.float32), [p, p, q], spans, r, tiny.device)
    assert tiny.model.config._attn_implementation == before
    for prompt, resp, sp, out in zip([p, p, q], r, spans, got):
        want = reference(tiny, prompt, resp, sp)
        assert set(out) == set(sp)
        for k in sp:
            assert out[k].shape == (len(resp),) and out[k].dtype == np.float32
            np.testing.assert_allclose(out[k], want[k], atol=1e-6)
            assert ((out[k] > 0) & (out[k] < 1)).all()  # a share of the attention: some, not all of it


def test_replay_reads_attention_for_attn_contrast(tiny):
    """replay_group(measure="attn-contrast") reads P_all's attention to v_k's tokens (those P_\\k lacks); the
    batched and the naive replay agree; ρ is the measure's on them; other measures do not pay for it."""
    exact = ReplayConfig(precision="model")  # float32 like the reference (auto is bf16 on AMX CPUs)
    fast = replay_group(tiny, PROMPT, INFO, RESPONSES, measure="attn-contrast", config=exact)
    slow = naive_replay_group(tiny, PROMPT, INFO, RESPONSES, measure="attn-contrast")
    plain = replay_group(tiny, PROMPT, INFO, RESPONSES, config=exact)
    assert all(r.attn == {} for r in plain.responses)
    assert fast.forward_passes == plain.forward_passes + 1 + len(RESPONSES)  # the prompt once, then each response
    for i, (f, s) in enumerate(zip(fast.responses, slow.responses)):
        p_all = tiny.encode(fast.prompts[i][ALL])
        spans = {k: info_span(p_all, tiny.encode(fast.prompts[i][k])) for k in INFO}
        assert all(b - a >= 5 for a, b in spans.values())  # each v_k is several tokens of P_all
        want = reference(tiny, p_all, f.token_ids, spans)
        for k in INFO:
            np.testing.assert_allclose(f.attn[k], want[k], atol=1e-5)
            np.testing.assert_allclose(s.attn[k], f.attn[k], atol=1e-5)
            np.testing.assert_allclose(f.relevance[k], measure_relevance("attn-contrast", f.measure_input(k)),
                                       atol=1e-6)
        np.testing.assert_allclose(f.js["format"], plain.responses[i].js["format"], atol=1e-5)


def test_attn_contrast_without_attention_is_refused(tiny):
    rep = replay_group(tiny, PROMPT, INFO, RESPONSES[:1])
    with pytest.raises(Exception, match="'attn-contrast' measure reads P_all's attention"):
        rep.with_measure("attn-contrast")


def test_default_model_attention_to_a_named_keyword(smol):
    """On the real model: a_kt equal to its own attention weights, and the response's copy of a word the rule names
    attends to that rule more than to the other reward's."""
    info = {"keyword": "The reply must contain the word 'banana'.", "length": "The reply must have at most 20 words."}
    resp = "I like to eat a banana every morning."
    rep = replay_group(smol, "Write one sentence about breakfast.", info, [resp], measure="attn-contrast",
                       config=ReplayConfig(precision="model"))  # float32 like the reference
    r = rep.responses[0]
    p_all = smol.encode(rep.prompts[0][ALL])
    spans = {k: info_span(p_all, smol.encode(rep.prompts[0][k])) for k in info}
    want = reference(smol, p_all, r.token_ids, spans)
    for k in info:
        np.testing.assert_allclose(r.attn[k], want[k], atol=1e-5)
    t = next(i for i, (s, e) in enumerate(r.offsets) if "banana" in resp[s:e] or resp[s:e].strip() == "ban")
    assert r.attn["keyword"][t] > r.attn["length"][t]
    assert r.relevance["keyword"][t] > 1.0  # above the response's mean ρ
