"""Text and token ids: decoding, character offsets of tokens, the context-length check.
"""
from __future__ import annotations

from mrtpo.core.spans import owner_spans
from mrtpo.errors import MrtpoError
from mrtpo.model.load import LoadedModel


def decode(lm: LoadedModel, ids: list[int]) -> str:
    return lm.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


_FFFD = "\ufffd"  # what a decoder writes for bytes that do not (yet) form a character


_CONTEXT = 4  # tokens decoded before a window (a decoder may drop a leading space at the start of a sequence)


_BACK = 32  # how far back a window's context may start, looking for a character boundary


_WINDOW = 64  # a window ends at the first token after which the text does not end in U+FFFD, or after this many


def token_offsets(lm: LoadedModel, ids: list[int]) -> list[tuple[int, int]]:
    """Character span of each token in ``decode(ids)``, by the rule of :mod:`mrtpo.core.spans`: token i ends where
    the text of ``ids[:i + 1]`` ends, never before token i − 1 ends, unless that text ends in U+FFFD (the text ends
    inside a character whose bytes are not all read yet): then token i's span is empty; the last token ends at the
    end of the text.

    So a token holding bytes of a multi-byte character that a later token completes gets an empty span, even when
    it also holds whole characters before them (SmolLM2's ``' ð\x9f'`` of ``' 👋'``): the token completing the
    character gets them all, and the views draw those tokens as one cell (:func:`mrtpo.core.spans.cells`).

    Linear in ``len(ids)``: the text is decoded in short windows, each after a few tokens of context that start at
    a character boundary and whose text ends the text so far (:func:`_context`): the text of ``ids[:i + 1]`` is the
    text so far, less the context's, plus the window's. The text so far is checked against one decode at the end;
    should a tokenizer's text depend on more than the windows see, every prefix is decoded instead
    (:func:`_token_offsets_by_prefix`, the definition above, quadratic). A byte-fallback decoder (Llama's) writes
    U+FFFD for a whole run of byte tokens while a character in it is incomplete: that costs time quadratic in the
    length of the run only.
    """
    n = len(ids)
    if n == 0:
        return []
    spans: list[tuple[int, int]] = []
    text = ""  # the text of ids[:base]
    prev = base = 0  # base: the window's first token
    ctx: tuple[int, str] | None = None  # the window's context: (start, decode(ids[start:base]))
    for i in range(n - 1):
        if ctx is None:
            ctx = _context(lm, ids, base, text)
            if ctx[0] == 0:
                text = ctx[1]  # the whole prefix was decoded: the text so far is exactly that
        start, left = ctx
        cur = decode(lm, ids[start:i + 1])
        # ends inside a character: nothing is complete that was not before (an empty span)
        end = prev if cur.endswith(_FFFD) else max(len(text) - len(left) + len(cur), prev)
        spans.append((prev, end))
        prev = end
        if not cur.endswith(_FFFD) or i + 1 - base >= _WINDOW:
            text = text + cur[len(left):] if cur.startswith(left) else text[:len(text) - len(left)] + cur
            base, ctx = i + 1, None
    full = decode(lm, ids)
    spans.append((prev, max(len(full), prev)))
    if not full.startswith(text) and text != decode(lm, ids[:base]):
        return _token_offsets_by_prefix(lm, ids)
    return spans


def _context(lm: LoadedModel, ids: list[int], base: int, text: str) -> tuple[int, str]:
    """(start, decode(ids[start:base])) for a window from ``base``, with ``text`` = the text of ``ids[:base]``:
    about :data:`_CONTEXT` tokens whose text ends ``text`` and does not start with U+FFFD (the context does not
    start inside a character), stepping back up to :data:`_BACK` tokens to find one; else the first whose text
    ends ``text``; else a context twice as long, and so on (the whole prefix at worst)."""
    fallback = None
    for start in range(max(0, base - _CONTEXT), max(-1, base - _CONTEXT - _BACK), -1):
        left = decode(lm, ids[start:base])
        if text.endswith(left):
            if not left.startswith(_FFFD) or start == 0:
                return start, left
            fallback = fallback or (start, left)
    if fallback is not None:
        return fallback
    k = 2 * (_CONTEXT + _BACK)
    while True:
        start = max(0, base - k)
        left = decode(lm, ids[start:base])
        if start == 0 or text.endswith(left):
            return start, left
        k *= 2


def _token_offsets_by_prefix(lm: LoadedModel, ids: list[int]) -> list[tuple[int, int]]:
    """:func:`token_offsets` by its definition: every prefix decoded (quadratic in ``len(ids)``)."""
    spans, prev = [], 0
    for i in range(len(ids)):
        cur = decode(lm, ids[: i + 1])
        end = prev if cur.endswith(_FFFD) and i + 1 < len(ids) else max(len(cur), prev)
        spans.append((prev, end))
        prev = end
    return spans


def tokenize_response(lm: LoadedModel, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of a response given as text, with character offsets into ``text`` by the rule of
    :mod:`mrtpo.core.spans` (what :func:`token_offsets` gives for the ids): the tokenizer's offset mapping, which
    gives every byte token of a character that character's span, through :func:`mrtpo.core.spans.owner_spans`
    (one token owns each character; the spans cover ``text``)."""
    enc = lm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), owner_spans(enc["offset_mapping"], len(text))


class TooLong(MrtpoError):
    """A sequence longer than the model accepts: ``n_tokens`` against ``limit``; ``what`` names it, ``response`` is
    the response's index in its group when a replay or a sampler knows it (else None)."""

    def __init__(self, message: str, what: str, n_tokens: int, limit: int, response: int | None = None):
        super().__init__(message)
        self.what, self.n_tokens, self.limit, self.response = what, n_tokens, limit, response

    @property
    def prompt(self) -> str:
        """The prompt part of ``what`` (``P_all`` of ``P_all + response 2``): what a caller that names the response
        its own way (a file's line) puts before it."""
        return self.what.rsplit(" + ", 1)[0]


def check_length(lm: LoadedModel, n_tokens: int, what: str, response: int | None = None,
                 hint: str = "shorten the prompt, the verifier information or the response") -> None:
    """:class:`TooLong` when ``n_tokens`` (of ``what``) is more than the model accepts."""
    if n_tokens > lm.max_length:
        raise TooLong(f"{what} is {n_tokens} tokens, more than model '{lm.name}' accepts ({lm.max_length}); {hint}",
                      what, n_tokens, lm.max_length, response)
