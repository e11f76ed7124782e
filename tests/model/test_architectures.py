"""The sampler and the model checks across architectures (mrtpo.model.zoo's random models).

References: transformers' ``generate`` (greedy tokens, and the same draws for a seed at the model's precision), and the
model's own layers for the project's own step (which must refuse every stack it does not compute exactly)."""
import pytest
import torch

from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel, load_model, sample
from mrtpo.model import decoder as D
from mrtpo.model import llama_step as L
from mrtpo.model.arch import check_model
from mrtpo.model.load import byte_tokenizer
from mrtpo.model.zoo import ARCHITECTURES, WINDOW, random_model
from tests.model.test_sampler import generate

LLAMA = ("llama", "llama3")


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_sampling_is_what_generate_samples_for_every_architecture(arch):
    """Greedy and seeded draws at the model's precision are generate's, past the sliding window (Gemma 2's draws
    differed before the sampler applied its final-logit soft-cap)."""
    lm = random_model(arch, initializer_range=0.2)
    want = generate(lm, "hello there", 1, 2 * WINDOW + 8, do_sample=False)[0]
    got = sample(lm, "hello there", n=2, max_new_tokens=2 * WINDOW + 8, temperature=0, precision="model")
    assert [s.token_ids for s in got] == [want] * 2
    want = generate(lm, "hi", 3, 2 * WINDOW + 8, seed=3, do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
    got = sample(lm, "hi", n=3, max_new_tokens=2 * WINDOW + 8, temperature=1.0, top_p=1.0, seed=3, precision="model")
    assert [s.token_ids for s in got] == want
    assert max(map(len, want)) > 2 * WINDOW  # past the window


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "mistral", "qwen3"])
def test_bfloat16_sampling_runs_and_tracks_float32(arch):
    """precision="bfloat16" (cast copies through the model's layers, never the own step): valid tokens, and its greedy
    start is float32's."""
    lm = random_model(arch, initializer_range=0.2)
    got = sample(lm, "hello there", n=2, max_new_tokens=2 * WINDOW, temperature=0, precision="bfloat16")
    ref = sample(lm, "hello there", n=1, max_new_tokens=2 * WINDOW, temperature=0, precision="model")[0].token_ids
    assert got[0].token_ids == got[1].token_ids
    assert got[0].token_ids[:4] == ref[:4]


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_the_own_step_is_taken_only_for_llama_stacks(arch):
    """With bf16 copies (where the own step would run), only Llama / Llama 3 stacks get it: Qwen 2's biases, Qwen 3's
    q / k norms, Mistral's window, Gemma's scaled embeddings / soft-caps / windows, Phi-3's fused projections, GPT-2 and
    GPT-NeoX run through their own layers."""
    lm = random_model(arch)
    stack = D.decoder_stack(lm.model)
    dec = D.Decoder(stack, torch.bfloat16)
    assert (L.llama_step(dec) is not None) == (arch in LLAMA)
    assert L.supports(stack, dict(stack.named_parameters())) == (arch in LLAMA)


def test_a_llama_stack_with_a_window_is_refused_by_the_own_step():
    lm = random_model("llama")
    stack = D.decoder_stack(lm.model)
    lm.model.config.sliding_window = 8  # the own step has no window: the layers must run it
    assert not L.supports(stack, dict(stack.named_parameters()))


def test_the_own_pass_computes_llama3_rope_scaling():
    """Llama 3's rope scaling in the own pass: the same hidden states as the layers in float32."""
    from mrtpo.replay.kvtrie import shared_hidden

    lm = random_model("llama3", initializer_range=0.2)
    stack = D.decoder_stack(lm.model)
    assert stack.rotary_emb.rope_type == "llama3"
    params = {k: v.detach().clone() for k, v in stack.named_parameters()}
    own = L.LlamaStep(stack, params)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(5, 300, (n,), generator=g).tolist() for n in (90, 130)]
    want = [(0, len(s)) for s in seqs]
    with torch.inference_mode():
        got, _, _ = shared_hidden(D.Decoder(stack, torch.float32), 0, lm.device, seqs, want, 4096, 8192, own=own)
        for s, h in zip(seqs, got):
            torch.testing.assert_close(h, stack(input_ids=torch.tensor([s])).last_hidden_state[0], atol=1e-5,
                                       rtol=1e-5)


def _mismatched(tmp_path):
    """A Qwen 2 folder whose embedding has 200 rows, saved with the byte tokenizer's 259 ids."""
    lm = random_model("qwen2", vocab_size=200)
    folder = tmp_path / "qwen2-short-vocab"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return lm, folder


def test_a_tokenizer_past_the_embedding_is_refused_by_name_at_load(tmp_path):
    _, folder = _mismatched(tmp_path)
    with pytest.raises(MrtpoError) as e:
        load_model(str(folder), "cpu")
    msg = str(e.value)
    assert f"model '{folder}' (Qwen2ForCausalLM)" in msg
    assert "the tokenizer has 259 ids but the model's embedding has 200 rows" in msg


def test_a_tokenizer_past_the_embedding_is_refused_before_any_work(tmp_path, monkeypatch):
    """A LoadedModel built by hand (a trainer's): sampling and the replay refuse it before any pass (it was "internal
    error (IndexError: index out of range)")."""
    from mrtpo.replay import naive_replay_group, replay_group

    lm, _ = _mismatched(tmp_path)

    def no_pass(*a, **k):
        raise AssertionError("a forward pass ran")

    monkeypatch.setattr(D.Decoder, "__call__", no_pass)
    monkeypatch.setattr(type(lm.model), "forward", no_pass)
    for run in (lambda: sample(lm, "hello", n=2, max_new_tokens=4),
                lambda: replay_group(lm, "p", {"a": "x"}, ["hello"]),
                lambda: naive_replay_group(lm, "p", {"a": "x"}, ["hello"])):
        with pytest.raises(MrtpoError, match=r"model 'random-qwen2' \(Qwen2ForCausalLM\) does not fit its "
                                             r"tokenizer: the tokenizer has 259 ids but the model's embedding has 200"):
            run()


def _hand_made(config_name, model_name, **kw):
    import transformers

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(**kw)).eval()
    return LoadedModel(model=model, tokenizer=byte_tokenizer(), name=model_name.lower(), device=torch.device("cpu"),
                       dtype=torch.float32)


@pytest.mark.parametrize("config_name, model_name, kw, why", [
    ("T5Config", "T5ForConditionalGeneration", dict(vocab_size=300, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                                    num_heads=2, decoder_start_token_id=0), "not encoder-decoders"),
    ("MambaConfig", "MambaForCausalLM", dict(vocab_size=300, hidden_size=32, num_hidden_layers=1, state_size=4),
     "takes no"),
    ("CohereConfig", "CohereForCausalLM", dict(vocab_size=300, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=2, logit_scale=0.5),
     "rescaled by config.logit_scale"),
])
def test_a_model_class_the_replay_cannot_run_is_refused_by_name(config_name, model_name, kw, why):
    lm = _hand_made(config_name, model_name, **kw)
    with pytest.raises(MrtpoError, match=rf"model '{lm.name}' \({model_name}\) cannot be replayed: .*{why}"):
        check_model(lm.model, lm.tokenizer, lm.name)
    from mrtpo.replay import replay_group

    with pytest.raises(MrtpoError, match=rf"\({model_name}\) cannot be replayed"):
        replay_group(lm, "p", {"a": "x"}, ["hello"])
    with pytest.raises(MrtpoError, match=rf"\({model_name}\) cannot be replayed"):
        sample(lm, "hello", n=1, max_new_tokens=2)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_tested_architecture_passes_the_check(arch):
    lm = random_model(arch)
    check_model(lm.model, lm.tokenizer, lm.name)


@pytest.mark.parametrize("arch", ["gemma2", "gpt_neox", "qwen2"])
def test_head_logits_are_the_models_own(arch):
    """head_logits(model, final hidden states) = the model's own logits (Gemma 2's soft-cap, which bites at these
    weights, GPT-NeoX's untied head)."""
    from mrtpo.model.arch import head_logits

    lm = random_model(arch, initializer_range=0.2)
    ids = torch.tensor([lm.encode("The fox and the dog.")])
    with torch.no_grad():
        want = lm.model(input_ids=ids).logits
        h = D.decoder_stack(lm.model)(input_ids=ids).last_hidden_state
        got = head_logits(lm.model, h)
        raw = lm.model.get_output_embeddings()(h)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (arch == "gemma2") == bool((raw - want).abs().max() > 0.1)


def test_the_cli_refuses_a_tokenizer_past_the_embedding_with_the_models_name(tmp_path, capsys):
    """`mrtpo relevance --model <folder>`: exit 2 and one error line naming the folder and both sizes (it was an
    "internal error (IndexError: index out of range)" per case)."""
    import json

    from mrtpo.cli import main

    _, folder = _mismatched(tmp_path)
    capsys.readouterr()  # save_pretrained's progress bar
    inp = tmp_path / "cases.jsonl"
    inp.write_text(json.dumps({"id": "a", "prompt": "p", "verifier_info": {"a": "x"}, "response": "hello"}) + "\n")
    rc = main(["relevance", "--input", str(inp), "--output", str(tmp_path / "o.jsonl"), "--model", str(folder),
               "--device", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == (f"error: model '{folder}' (Qwen2ForCausalLM) does not fit its tokenizer: the tokenizer has "
                           "259 ids but the model's embedding has 200 rows (ids 200-258 would index past it); use the "
                           "tokenizer the model was trained with")
    assert not (tmp_path / "o.jsonl").exists()
