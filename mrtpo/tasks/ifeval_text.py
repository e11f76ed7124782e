"""IFEval's text helpers: its word count, its regex sentence splitter (instead of NLTK's punkt, whose data cannot be
downloaded here), capital-word tokens, and language detection (langdetect seeded, or a stopword vote)."""
from __future__ import annotations

import re


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


def capital_tokens(text: str) -> list[str]:
    """Word tokens (hyphen/apostrophe joined) standing in for ``nltk.word_tokenize``."""
    return re.findall(r"\w+(?:[-'.]\w+)*", text)


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
