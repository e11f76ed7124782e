"""Token offsets (mrtpo.model.token_offsets) in linear time, equal to the definition (every prefix decoded) on
tricky tokenizations: characters of several bytes split over tokens, lone and invalid bytes, special tokens inside
a response, a decoder that drops the leading space of a sequence (Llama's), the tiny model's byte tokenizer and the
default model's; and a response too long for the model fails before any offset is computed (issue: the app's
rollouts upload took 340 s to say that two 50,000-character completions are too long)."""
import random
import time

import pytest

from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel, token_offsets
from mrtpo.model import tokens as T

TEXTS = ["plain ascii text, with spaces  and\ttabs\n", "naïve café — “quotes” ½ ≠ ∞", "日本語のテキストです。",
         "emoji 👩‍👩‍👧 🇫🇷 🙂 mixed", "combining e\u0301 a\u0308 Z\u0337", "\ufffd real replacement chars \ufffd\ufffd",
         " leading space", "trailing spaces   ", ""]


def by_prefix(lm, ids):
    """The definition (every prefix decoded): token i ends where the text of ids[:i + 1] ends, or has an empty span
    when that text ends inside a character (U+FFFD); the last token ends at the end of the text."""
    spans, prev = [], 0
    for i in range(len(ids)):
        cur = T.decode(lm, ids[: i + 1])
        end = prev if cur.endswith("\ufffd") and i + 1 < len(ids) else max(len(cur), prev)
        spans.append((prev, end))
        prev = end
    return spans


def random_ids(lm, n, rng):
    """Token ids at random from the whole vocabulary (special tokens and lone bytes included)."""
    V = len(lm.tokenizer)
    return [rng.randrange(V) for _ in range(n)]


def cases(lm, seed=0):
    rng = random.Random(seed)
    out = [lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    out.append(lm.tokenizer("".join(TEXTS) * 3, add_special_tokens=False)["input_ids"])
    out += [random_ids(lm, n, rng) for n in (1, 2, 7, 60, 300)]
    emoji = lm.tokenizer("🙂", add_special_tokens=False)["input_ids"]
    out.append(emoji[:1] * 5 + emoji + emoji[-1:] * 3)  # incomplete characters, then stray continuation bytes
    specials = [lm.tokenizer.eos_token_id, lm.tokenizer.pad_token_id]
    out.append(specials + out[3] + specials + out[2] + specials)
    out.append([specials[0]] * 5)
    return out


def check_equal(lm):
    for ids in cases(lm):
        assert token_offsets(lm, ids) == by_prefix(lm, ids), ids


def llama_style():
    """A Llama-style tokenizer built in code: SentencePiece pieces with ▁ for spaces, byte fallback (<0xE6> ...),
    and a decoder that drops the leading space of a sequence: the text of a window depends on what is before it."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ["▁", "▁the", "▁café", "▁naïve", "te", "xt", "▁text", "s", "▁a", "a", "e", "é", "t", "x", "▁ç"]:
        vocab.setdefault(piece, len(vocab))
    for c in "abcdefghijklmnopqrstuvwxyz,.—“”½≠∞":
        vocab.setdefault(c, len(vocab))
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    core.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    core.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    core.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                      decoders.Strip(" ", 1, 0)])
    core.add_special_tokens(["<s>", "</s>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="</s>",
                                  unk_token="<unk>")
    return LoadedModel(model=None, tokenizer=tok, name="llama-style", device=None, dtype=None)


def test_offsets_equal_the_definition_on_the_tiny_byte_tokenizer(tiny):
    check_equal(tiny)


def test_offsets_equal_the_definition_with_a_leading_space_decoder():
    lm = llama_style()
    ids = lm.tokenizer("text", add_special_tokens=False)["input_ids"]
    assert (T.decode(lm, ids), T.decode(lm, ids + ids)) == ("text", "text text")  # dropped at the start only
    assert lm.tokenizer("日本", add_special_tokens=False)["input_ids"][1:3] == [vocab_byte(lm, 0xE6),
                                                                               vocab_byte(lm, 0x97)]
    check_equal(lm)


def vocab_byte(lm, b):
    return lm.tokenizer.convert_tokens_to_ids(f"<0x{b:02X}>")


def test_offsets_equal_the_definition_on_the_default_model(smol):
    check_equal(smol)


def test_offsets_fall_back_to_the_definition_when_windows_disagree(tiny, monkeypatch):
    """A decoder whose text depends on more than the window's context: the result is still the definition's."""
    real = T.decode

    def odd(lm, ids):  # the text is upper-cased when the sequence is long: no window sees that
        text = real(lm, ids)
        return text.upper() if len(ids) > 10 else text

    monkeypatch.setattr(T, "decode", odd)
    ids = tiny.tokenizer("hello world, a longer text", add_special_tokens=False)["input_ids"]
    assert token_offsets(tiny, ids) == [tuple(s) for s in _definition(tiny, ids, odd)]


def _definition(lm, ids, dec):
    spans, prev = [], 0
    for i in range(len(ids)):
        cur = dec(lm, ids[: i + 1])
        end = prev if cur.endswith("\ufffd") and i + 1 < len(ids) else max(len(cur), prev)
        spans.append((prev, end))
        prev = end
    return spans


def test_offsets_take_linear_time(tiny, monkeypatch):
    """Tokens decoded in all: at most a few per token (the definition decodes n²/2 for n tokens)."""
    decoded = [0]
    real = T.decode

    def counted(lm, ids):
        decoded[0] += len(ids)
        return real(lm, ids)

    monkeypatch.setattr(T, "decode", counted)
    ids = tiny.tokenizer("naïve café 日本語 🙂 " * 800, add_special_tokens=False)["input_ids"]
    n = len(ids)
    assert n > 20_000
    t0 = time.perf_counter()
    offs = token_offsets(tiny, ids)
    assert offs[-1][1] == len(real(tiny, ids))
    assert decoded[0] <= 80 * n and time.perf_counter() - t0 < 30  # the definition: 2e8 tokens decoded


def test_a_response_too_long_fails_before_its_offsets(tiny, monkeypatch):
    """50,000 characters as token ids (the app's rollouts page replays token ids): the length error comes without a
    single offset computed."""
    from mrtpo.replay import replay_group

    def no_offsets(lm, ids):
        raise AssertionError("offsets computed before the length check")

    monkeypatch.setattr("mrtpo.replay.plan.token_offsets", no_offsets)  # where the replay computes offsets
    ids = tiny.tokenizer("x" * 50_000, add_special_tokens=False)["input_ids"]
    t0 = time.perf_counter()
    with pytest.raises(MrtpoError, match="more than model 'tiny-random' accepts"):
        replay_group(tiny, "Say hi.", {"a": "Be short."}, [ids, ids[:10]])
    assert time.perf_counter() - t0 < 10
