"""Every common architecture replays (mrtpo.model.zoo's random models: Llama / Llama 3, Qwen 2 / 3, Mistral, Gemma 2 /
3, Phi-3, GPT-2, GPT-NeoX), at responses several times longer than the sliding windows.

References: the one-sequence-at-a-time replay (naive_replay_group: the model's stack over each whole sequence, no
cache) and the model's own full forward (its logits: Gemma 2's soft-cap, scaled embeddings and tied head included)."""
import json

import numpy as np
import pytest
import torch

from mrtpo.model import decoder_stack
from mrtpo.model import windows as W
from mrtpo.model.zoo import ARCHITECTURES, WINDOW, random_model
from mrtpo.replay import ReplayConfig, naive_replay_group, replay_group
from mrtpo.replay.kvtrie import shared_hidden
from mrtpo.templates import ALL

WINDOWED = ["mistral", "gemma2", "gemma3", "phi3"]
PROMPT = "Describe the animals by the river."
INFO = {"fox": "The answer must mention the fox.", "short": "Keep it under two lines.",
        "dog": "Name the dog twice, once at the start and once at the end."}
RESPONSES = ["The quick brown fox jumps over the lazy dog by the river, and the dog barks at the fox again.",
             "A dog sleeps. The fox runs past the river bank and is gone before the dog wakes up at noon."]


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def lm(request):
    """A random model of each architecture, weights at std 0.2 (peaked, varied distributions: JS far from 0)."""
    return random_model(request.param, initializer_range=0.2)


def own_logprobs(lm, prompt_ids, resp_ids):
    """log p(y_t | ...) of every response token from the model's own forward over the whole sequence (its logits)."""
    ids = torch.tensor([prompt_ids + resp_ids])
    with torch.no_grad():
        z = lm.model(input_ids=ids).logits[0, len(prompt_ids) - 1: len(prompt_ids) - 1 + len(resp_ids)].float()
    return z.log_softmax(-1).gather(1, torch.tensor(resp_ids)[:, None])[:, 0].numpy()


def test_every_architecture_replays_beyond_its_window_as_each_sequence_alone(lm):
    """The prefix-shared replay (passes over cached pasts of different lengths) gives the JS distances and log-probs of
    the per-variant forward, and P_all's log-probs are the model's own (it crashed for Mistral, Gemma 2 and 3)."""
    got = replay_group(lm, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="model"))
    ref = naive_replay_group(lm, PROMPT, INFO, RESPONSES)
    assert got.prefix_tokens > 2 * WINDOW  # a shared prefix longer than the window, reused from the cache
    for a, b in zip(got.responses, ref.responses):
        assert len(a.token_ids) > 5 * WINDOW and a.token_ids == b.token_ids
        for k in INFO:
            np.testing.assert_allclose(a.js[k], b.js[k], atol=2e-6)
            np.testing.assert_allclose(a.logp_without[k], b.logp_without[k], atol=2e-5)
        np.testing.assert_allclose(a.logp_all, b.logp_all, atol=2e-5)
    p_all = lm.encode(got.prompts[0][ALL])
    np.testing.assert_allclose(got.responses[0].logp_all, own_logprobs(lm, p_all, got.responses[0].token_ids),
                               atol=2e-5)
    assert max(float(r.js[k].max()) for r in got.responses for k in INFO) > 0.01  # not a degenerate comparison


@pytest.mark.parametrize("arch", WINDOWED)
def test_the_window_matters_at_these_lengths(arch):
    """The windowed models' outputs past the window differ from the same weights without a window (so the replay test
    above would see a window applied wrongly), and each of them is masked from positions by the replay."""
    lm = random_model(arch, initializer_range=0.2)
    assert W.prefix_mode(decoder_stack(lm.model)) == "own"
    ids = torch.tensor([lm.encode(PROMPT * 3)])
    with torch.no_grad():
        windowed = lm.model(input_ids=ids).logits[0]
        lm.model.config.sliding_window = 10 ** 6
        full = lm.model(input_ids=ids).logits[0]
    assert torch.allclose(windowed[:WINDOW], full[:WINDOW], atol=1e-5)  # the same before the window fills
    assert (windowed[2 * WINDOW:] - full[2 * WINDOW:]).abs().max() > 1e-2


@pytest.mark.parametrize("arch", WINDOWED)
@pytest.mark.parametrize("budgets", [(96, 400), (4096, 8192)])
def test_shared_hidden_equals_each_sequence_alone_with_windows(arch, budgets):
    """Final hidden states of every position of replay-shaped sequences (a shared prompt, items left out, responses of
    different lengths) against the model's stack over each sequence alone; a tight budget puts rows with pasts of
    different lengths into one pass, a loose one pads."""
    lm = random_model(arch, initializer_range=0.2)
    g = torch.Generator().manual_seed(0)
    V = lm.model.config.vocab_size
    prompt = torch.randint(5, V, (40,), generator=g).tolist()
    items = [torch.randint(5, V, (n,), generator=g).tolist() for n in (12, 7, 20)]
    seqs = []
    for r in range(3):
        resp = torch.randint(5, V, (30 + 9 * r,), generator=g).tolist()
        for drop in (None, 0, 1, 2):
            seqs.append(prompt + [t for j, it in enumerate(items) if j != drop for t in it] + resp)
    stack = decoder_stack(lm.model)
    from mrtpo.model import Decoder

    with torch.no_grad():
        out, trie, stats = shared_hidden(Decoder(stack, torch.float32), 0, lm.device, seqs,
                                         [(0, len(s)) for s in seqs], *budgets)
        for s, h in zip(seqs, out):
            ref = stack(input_ids=torch.tensor([s])).last_hidden_state[0]
            torch.testing.assert_close(h, ref, atol=2e-5, rtol=1e-5)
    assert len(stats.levels) >= 2  # shared levels, then the leaves
    assert len({trie.segments[p[-1]].start for p in trie.paths}) > 1  # leaves after pasts of different lengths


@pytest.mark.parametrize("arch", ["gemma2", "mistral"])
def test_bfloat16_replay_with_windows_shares_prefixes_as_exactly_as_bf16_allows(arch):
    """precision="bfloat16" (the path an AMX CPU or a GPU takes): the masks are made in the pass's dtype; the shared
    replay matches the unshared one within bf16 rounding, and the float32 one loosely."""
    lm = random_model(arch, initializer_range=0.2)
    shared = replay_group(lm, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="bfloat16"))
    alone = replay_group(lm, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="bfloat16", share_prefix=False))
    exact = replay_group(lm, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="model"))
    for a, b, c in zip(shared.responses, alone.responses, exact.responses):
        for k in INFO:
            np.testing.assert_allclose(a.js[k], b.js[k], atol=3e-2)
            np.testing.assert_allclose(a.js[k], c.js[k], atol=6e-2)
        np.testing.assert_allclose(a.logp_all, c.logp_all, atol=0.15, rtol=0.05)
    assert np.isfinite(np.concatenate([r.js[k] for r in shared.responses for k in INFO])).all()


def test_gemma2_logits_are_soft_capped_in_the_replay():
    """Gemma 2's final-logit soft-cap bites at these weights (the capped and uncapped log-probs differ), and the
    replay's are the capped ones (the model's own)."""
    lm = random_model("gemma2", initializer_range=0.2)
    got = replay_group(lm, PROMPT, INFO, RESPONSES[:1], config=ReplayConfig(precision="model"))
    p_all = lm.encode(got.prompts[0][ALL])
    rid = got.responses[0].token_ids
    capped = own_logprobs(lm, p_all, rid)
    lm.model.config.final_logit_softcapping = None
    uncapped = own_logprobs(lm, p_all, rid)
    assert np.abs(capped - uncapped).max() > 0.1
    np.testing.assert_allclose(got.responses[0].logp_all, capped, atol=2e-5)


def test_modes_of_the_stacks():
    """Which stacks the replay masks from positions: those with sliding windows (eager or SDPA); none of the others."""
    modes = {a: W.prefix_mode(decoder_stack(random_model(a).model)) for a in ARCHITECTURES}
    assert modes == {a: "own" if a in WINDOWED else "model" for a in ARCHITECTURES}
    lm = random_model("gemma3")
    lm.model.config._attn_implementation = "flex_attention"  # one this module cannot mask: no prefix sharing
    assert W.prefix_mode(decoder_stack(lm.model)) == "unshared"


def test_relevance_cli_on_a_local_gemma2_folder(tmp_path, capsys):
    """`mrtpo relevance --model <folder>` on a tiny Gemma 2 saved with save_pretrained (window 16, responses of ~90
    tokens): every case written, and its JS the one-sequence-at-a-time replay's (it failed with "internal error
    (RuntimeError: stack expects each tensor to be equal size ...)")."""
    from mrtpo.cli import main
    from mrtpo.model import load_model

    lm = random_model("gemma2", initializer_range=0.2)
    folder = tmp_path / "gemma2-tiny"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    rows = [{"id": f"r{i}", "prompt": PROMPT, "verifier_info": INFO, "response": r} for i, r in enumerate(RESPONSES)]
    inp, out = tmp_path / "cases.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(["relevance", "--input", str(inp), "--output", str(out), "--model", str(folder), "--device", "cpu",
               "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "internal error" not in err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["r0", "r1"]
    ref = naive_replay_group(load_model(str(folder), "cpu"), PROMPT, INFO, RESPONSES)
    for line, r in zip(lines, ref.responses):
        assert len(line["tokens"]) == len(r.token_ids) > 5 * WINDOW
        for k in INFO:  # the CLI's precision is "auto": bf16 copies on a CPU with fast bf16, float32 elsewhere
            np.testing.assert_allclose(line["js"][k], r.js[k], atol=1e-2)
    assert max(max(line["js"][k]) for line in lines for k in INFO) > 0.03


def test_the_unshared_fallback_is_exact(monkeypatch):
    """Where the passes cannot mask a model's windows from positions ("unshared"), nothing is shared and every sequence
    runs from position 0 in its own row: the per-variant forward's numbers still."""
    from mrtpo.model import decoder as D

    lm = random_model("gemma3", initializer_range=0.2)
    monkeypatch.setattr(D, "prefix_mode", lambda backbone: "unshared")
    got = replay_group(lm, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="model"))
    ref = naive_replay_group(lm, PROMPT, INFO, RESPONSES)
    assert got.prefix_tokens == 0  # no prefix shared
    for a, b in zip(got.responses, ref.responses):
        for k in INFO:
            np.testing.assert_allclose(a.js[k], b.js[k], atol=2e-6)
        np.testing.assert_allclose(a.logp_all, b.logp_all, atol=2e-5)


def test_qwen2_with_a_window_on_its_upper_layers_replays_exactly():
    """Qwen 2's use_sliding_window (global layers below max_window_layers, windowed above): one mask per kind of layer,
    the per-variant forward's numbers."""
    lm = random_model("qwen2", initializer_range=0.2, use_sliding_window=True, sliding_window=WINDOW,
                      max_window_layers=1)
    assert W.layer_windows(lm.model.config) == [None, WINDOW]
    got = replay_group(lm, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="model"))
    ref = naive_replay_group(lm, PROMPT, INFO, RESPONSES)
    for a, b in zip(got.responses, ref.responses):
        for k in INFO:
            np.testing.assert_allclose(a.js[k], b.js[k], atol=2e-6)
        np.testing.assert_allclose(a.logp_all, b.logp_all, atol=2e-5)



@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_passes_that_end_at_the_models_last_position_run(arch):
    """Replay-shaped sequences whose longest is exactly as long as the model's positions: every pass runs and gives
    each sequence's own hidden states. A pass batches rows that start late and are short with rows that start early and
    are long; a short row's padding counted positions on past its end, past GPT-2's learned positions ("internal error
    (IndexError ...)" in a training run's probe)."""
    g = torch.Generator().manual_seed(0)
    head, rest_all, rest_without = (torch.randint(5, 300, (n,), generator=g).tolist() for n in (70, 70, 60))
    p_all, p_without = head + rest_all, head + rest_without
    resp = [torch.randint(5, 300, (10,), generator=g).tolist() for _ in range(2)]
    # the leaves: two responses after P_all (start 140, 10 tokens) and P_\\k's rest (start 70, 70 tokens) in one pass
    seqs = [p_all + resp[0], p_all + resp[1], p_without + resp[0]]
    n = max(map(len, seqs))
    lm = random_model(arch, initializer_range=0.2, **({"n_positions": n} if arch == "gpt2" else
                                                       {"max_position_embeddings": n}))
    assert lm.max_length == n
    stack = decoder_stack(lm.model)
    from mrtpo.model import Decoder

    with torch.no_grad():
        out, trie, _ = shared_hidden(Decoder(stack, torch.float32), 0, lm.device, seqs, [(0, len(s)) for s in seqs],
                                     4096, 8192)
        for s, h in zip(seqs, out):
            torch.testing.assert_close(h, stack(input_ids=torch.tensor([s])).last_hidden_state[0], atol=2e-5,
                                       rtol=1e-5)
