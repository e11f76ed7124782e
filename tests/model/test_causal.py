"""A model that is not a decoder-only causal LM (an encoder such as BERT, an encoder-decoder) is refused by name at
load, in every command, before any work: its "next-token" distributions would see the tokens they score."""
import json

import pytest
import torch

from mrtpo.cli import main
from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel, load_model, sample
from mrtpo.model.arch import bidirectional_attention, check_model
from mrtpo.model.load import byte_tokenizer

SMALL = dict(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def _built(config_name: str, model_name: str, **kw):
    import transformers

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return getattr(transformers, model_name)(getattr(transformers, config_name)(**kw)).eval()


def saved(tmp_path, config_name: str, model_name: str, **kw):
    """A folder with a random ``model_name`` and the byte tokenizer, saved as save_pretrained saves them."""
    folder = tmp_path / model_name.lower()
    _built(config_name, model_name, **kw).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def test_bert_loaded_as_a_causal_lm_is_bidirectional():
    """The reason for the check: AutoModelForCausalLM loads a BertForMaskedLM folder as BertLMHeadModel, whose
    attention sees later tokens while config.is_decoder is false (token 0's logits change with token 2)."""
    m = _built("BertConfig", "BertLMHeadModel", **SMALL)
    with torch.no_grad():
        a = m(input_ids=torch.tensor([[5, 6, 7]])).logits[0, 0]
        b = m(input_ids=torch.tensor([[5, 6, 9]])).logits[0, 0]
    assert (a - b).abs().max() > 1e-4
    assert bidirectional_attention(m) == ["bert.encoder.layer.0.attention.self"]
    causal = _built("BertConfig", "BertLMHeadModel", **SMALL, is_decoder=True)
    assert bidirectional_attention(causal) == []


@pytest.mark.parametrize("config_name, model_name, kw, says", [
    ("BertConfig", "BertForMaskedLM", SMALL,
     "(BertLMHeadModel, saved as BertForMaskedLM) is not a causal language model: its self-attention sees the later "
     "tokens (config.is_decoder is false)"),
    ("RobertaConfig", "RobertaForMaskedLM", dict(SMALL, pad_token_id=0),
     "(RobertaForCausalLM, saved as RobertaForMaskedLM) is not a causal language model"),
    ("DistilBertConfig", "DistilBertForMaskedLM", dict(vocab_size=300, dim=32, n_layers=1, n_heads=2, hidden_dim=64),
     "(DistilBertForMaskedLM) is not a causal language model: transformers has no causal-LM class for model type "
     "'distilbert'"),
    ("T5Config", "T5ForConditionalGeneration", dict(vocab_size=300, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                                    num_heads=2, decoder_start_token_id=0),
     "(T5ForConditionalGeneration) is not a decoder-only causal language model: it is an encoder-decoder"),
])
def test_a_non_causal_folder_is_refused_by_name_at_load(tmp_path, config_name, model_name, kw, says):
    folder = saved(tmp_path, config_name, model_name, **kw)
    with pytest.raises(MrtpoError) as e:
        load_model(str(folder), "cpu")
    assert f"model '{folder}' {says}" in str(e.value)
    assert "decoder-only causal language models (Llama, Qwen" in str(e.value)


def test_a_non_causal_model_made_in_code_is_refused_before_any_pass(monkeypatch):
    """A LoadedModel built by hand (no load): the check, the sampler and the replay refuse it before a forward pass."""
    from mrtpo.replay import replay_group

    model = _built("BertConfig", "BertLMHeadModel", **SMALL)
    lm = LoadedModel(model=model, tokenizer=byte_tokenizer(), name="my-bert", device=torch.device("cpu"),
                     dtype=torch.float32)

    def no_pass(*a, **k):
        raise AssertionError("a forward pass ran")

    monkeypatch.setattr(type(model), "forward", no_pass)
    monkeypatch.setattr(type(model.bert), "forward", no_pass)
    want = r"model 'my-bert' \(BertLMHeadModel\) is not a causal language model"
    with pytest.raises(MrtpoError, match=want):
        check_model(lm.model, lm.tokenizer, lm.name)
    with pytest.raises(MrtpoError, match=want):
        sample(lm, "hello", n=2, max_new_tokens=4)
    with pytest.raises(MrtpoError, match=want):
        replay_group(lm, "p", {"a": "x"}, ["hello"])


@pytest.mark.parametrize("command", ["relevance", "explain", "sample", "train"])
def test_every_command_refuses_a_bert_folder_before_any_work(tmp_path, capsys, command):
    """exit 2, one error line naming the folder and why; nothing sampled, nothing written (no run created)."""
    folder = saved(tmp_path, "BertConfig", "BertForMaskedLM", **SMALL)
    capsys.readouterr()
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"id": "a", "prompt": "p", "verifier_info": {"a": "x"}, "response": "hello"}) + "\n")
    out = tmp_path / "out"
    argv = {"relevance": ["--input", cases, "--output", out],
            "explain": ["--task", "instructions", "--html", out, "--max-new-tokens", "4"],
            "sample": ["--task", "instructions", "--max-new-tokens", "4"],
            "train": ["--task", "instructions", "--steps", "1", "--db", out, "--max-new-tokens", "4"]}[command]
    rc = main([command, *map(str, argv), "--model", str(folder), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2
    line = [x for x in err.splitlines() if x.startswith("error: ")]
    assert line == [f"error: model '{folder}' (BertLMHeadModel, saved as BertForMaskedLM) is not a causal language "
                    "model: its self-attention sees the later tokens (config.is_decoder is false), so its next-token "
                    "distributions would see the tokens they score; mrtpo samples and replays decoder-only causal "
                    "language models (Llama, Qwen, Mistral, Gemma, Phi-3, GPT-2, GPT-NeoX and the like), not "
                    "encoders"]
    assert "sampling" not in err
    if command == "train":
        from mrtpo.store import Store

        assert not out.exists() or Store(str(out), create=False).list_runs() == []
    else:
        assert not out.exists()
