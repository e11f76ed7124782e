"""Text and token ids: decoding, character offsets of tokens, the context-length check.
"""
from __future__ import annotations

from mrtpo.errors import MrtpoError
from mrtpo.model.load import LoadedModel


def decode(lm: LoadedModel, ids: list[int]) -> str:
    return lm.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def token_offsets(lm: LoadedModel, ids: list[int]) -> list[tuple[int, int]]:
    """Character span of each token in ``decode(ids)``, by incremental decoding.

    A token holding part of a multi-byte character gets an empty span; the token completing it gets the character.
    """
    spans, prev = [], 0
    for i in range(len(ids)):
        cur = decode(lm, ids[: i + 1])
        end = len(cur.rstrip("\ufffd")) if i + 1 < len(ids) else len(cur)
        end = max(end, prev)
        spans.append((prev, end))
        prev = end
    return spans


def tokenize_response(lm: LoadedModel, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of a response given as text, with character offsets into ``text``."""
    enc = lm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def check_length(lm: LoadedModel, n_tokens: int, what: str) -> None:
    if n_tokens > lm.max_length:
        raise MrtpoError(
            f"{what} is {n_tokens} tokens, more than model '{lm.name}' accepts ({lm.max_length}); "
            f"shorten the prompt or the verifier information, or lower max tokens"
        )
