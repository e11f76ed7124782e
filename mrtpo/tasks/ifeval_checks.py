"""IFEval's verifiable instructions: argument specs, wordings and strict checkers.

Each instruction has IFEval's instruction id (``keywords:existence`` ...), the arguments of IFEval's
``build_description`` (same names), its wording (IFEval's description text filled with the arguments)
and a checker ``(response, kwargs) -> Score`` with IFEval's *strict* semantics (google-research
``instruction_following_eval/instructions.py``, as shipped by the ``if-verifiable`` package); a failing
check says why in ``Score.reason``.

Evidence (``Score.evidence``: the characters of the response each checker read, for a zero as for a one; [] when
it found nothing to point at; None = the whole response):

* keywords: ``existence`` / ``frequency`` every occurrence of the keyword(s) (case-insensitive);
  ``forbidden_words`` every whole-word occurrence of a forbidden word; ``letter_frequency`` every occurrence of the
  letter (either case).
* ``language:response_language``, ``length_constraints:number_words``, ``detectable_format:json_format``: None.
* ``length_constraints:number_sentences``: the sentence ends (each run of . ? ! before whitespace or the end);
  ``number_paragraphs``: each *** divider; ``nth_paragraph_first_word``: each blank-line break (\\n\\n) and the
  paragraph's first word as read.
* detectable content / format: each [placeholder]; the postscript from its marker to the end of its line; each
  bullet's marker (* or -); each occurrence of a constrained option; each *highlighted* / **highlighted** section;
  each section marker ("SECTION 2"); each <<title>>.
* ``combination:two_responses``: each ****** separator; ``repeat_prompt``: the response's first len(request)
  characters (after leading whitespace), which were compared with the request.
* ``startend:end_checker``: the last len(phrase) characters compared with the phrase (before trailing whitespace
  and quotes); ``quotation``: the first and the last character after stripping whitespace.
* change case: ``capital_word_frequency`` each all-capital word; ``english_capital`` / ``english_lowercase`` the
  words holding a letter of the wrong case when that fails the check, else None (the whole response, language
  included).
* ``punctuation:no_comma``: each comma.

Deliberate differences from the reference (tests exclude exactly these from the comparison):

* ``length_constraints:number_sentences``: IFEval counts sentences with NLTK's punkt model, whose data
  cannot be downloaded here. We count with IFEval's own regex splitter (``split_into_sentences`` in
  ``instructions_util``); the two agree on ordinary prose and differ on abbreviations punkt knows.
* ``change_case:capital_word_frequency``: IFEval tokenizes with ``nltk.word_tokenize`` (punkt again).
  We use the regex tokens of :func:`_capital_tokens` (``\\w+`` joined by ``-``, ``'`` or ``.``, so
  hyphenated words count once, as IFEval's comment says; ``I'M`` is one token where NLTK gives two).
* Keywords, forbidden words, section splitters and custom postscript markers are matched as *literal* text
  (``re.escape``); IFEval passes them to ``re`` unescaped, so a keyword with regex metacharacters
  (``c++``, ``a.b``) behaves differently there (or raises). For plain words the results are identical.
* Language detection uses ``langdetect`` with a fixed seed (IFEval's calls are unseeded, so they can
  flip on short, ambiguous texts). Without ``langdetect`` installed, a small stopword vote over
  en/es/fr/de/it/pt/nl stands in (other languages then count as undetectable, which IFEval scores as
  followed).

Arguments are validated strictly (types, ranges, known names); IFEval's random defaults for missing
arguments are not used: every argument must be given, except ``combination:repeat_prompt``'s
``prompt_to_repeat`` which the task family fills with the example's base request.
"""
from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from mrtpo.tasks.base import Score, Span, clean_spans

RELATIONS = ("less than", "at least")

#: IFEval's language codes (``instructions_util.LANGUAGE_CODES``).
LANGUAGES = {
    "en": "English", "es": "Spanish", "pt": "Portuguese", "ar": "Arabic", "hi": "Hindi",
    "fr": "French", "ru": "Russian", "de": "German", "ja": "Japanese", "it": "Italian",
    "bn": "Bengali", "uk": "Ukrainian", "th": "Thai", "ur": "Urdu", "ta": "Tamil",
    "te": "Telugu", "bg": "Bulgarian", "ko": "Korean", "pl": "Polish", "he": "Hebrew",
    "fa": "Persian", "vi": "Vietnamese", "ne": "Nepali", "sw": "Swahili", "kn": "Kannada",
    "mr": "Marathi", "gu": "Gujarati", "pa": "Punjabi", "ml": "Malayalam", "fi": "Finnish",
}

CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


# ---------------------------------------------------------------------------------------------
# text helpers
# ---------------------------------------------------------------------------------------------
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


def _capital_tokens(text: str) -> list[str]:
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


def _compare(actual: int, relation: str, n: int) -> bool:
    return actual < n if relation == "less than" else actual >= n


def _ok(passed: bool, reason: str, r: str | None = None, spans: Iterable[Span] | None = None) -> Score:
    """1 or 0 with the reason; evidence = ``spans`` cleaned over ``r`` (None when not given: the whole response)."""
    evidence = None if spans is None or r is None else clean_spans(spans, len(r))
    return Score(1.0, "", evidence) if passed else Score(0.0, reason, evidence)


def _found(pattern: str, r: str, flags: int = 0) -> list[Span]:
    """The spans of every match of ``pattern`` in ``r``."""
    return [m.span() for m in re.finditer(pattern, r, flags)]


# ---------------------------------------------------------------------------------------------
# checkers: (response, kwargs) -> Score
# ---------------------------------------------------------------------------------------------
def check_keywords_existence(r: str, kw: dict) -> Score:
    found = {k: _found(re.escape(k), r, re.IGNORECASE) for k in sorted(kw["keywords"])}
    missing = [k for k, spans in found.items() if not spans]
    return _ok(not missing, f"missing keyword(s): {', '.join(repr(m) for m in missing)}", r,
               [s for spans in found.values() for s in spans])


def check_keywords_frequency(r: str, kw: dict) -> Score:
    spans = _found(re.escape(kw["keyword"].strip()), r, re.IGNORECASE)
    n = len(spans)
    return _ok(_compare(n, kw["relation"], kw["frequency"]),
               f"'{kw['keyword']}' appears {n} times, needs {kw['relation']} {kw['frequency']}", r, spans)


def check_forbidden_words(r: str, kw: dict) -> Score:
    found = {w: _found(r"\b" + re.escape(w) + r"\b", r, re.IGNORECASE) for w in sorted(set(kw["forbidden_words"]))}
    used = [w for w, spans in found.items() if spans]
    return _ok(not used, f"uses forbidden word(s): {', '.join(repr(w) for w in used)}", r,
               [s for spans in found.values() for s in spans])


def check_letter_frequency(r: str, kw: dict) -> Score:
    letter = kw["letter"].lower()
    n = collections.Counter(r.lower())[letter]
    return _ok(_compare(n, kw["let_relation"], kw["let_frequency"]),
               f"letter '{letter}' appears {n} times, needs {kw['let_relation']} {kw['let_frequency']}",
               r, _found(re.escape(letter), r, re.IGNORECASE))


def check_response_language(r: str, kw: dict) -> Score:
    lang = detect_language(r)
    if lang is None:  # IFEval counts an undetectable language as followed
        return Score(1.0, "")
    want = kw["language"]
    return _ok(lang == want, f"detected language '{lang}', expected '{want}' ({LANGUAGES[want]})")


def check_number_sentences(r: str, kw: dict) -> Score:
    n = len(split_sentences(r))
    # evidence: the sentence ends, each run of . ? ! followed by whitespace or the end of the response
    return _ok(_compare(n, kw["relation"], kw["num_sentences"]),
               f"{n} sentences, needs {kw['relation']} {kw['num_sentences']}", r, _found(r"[.?!]+(?=\s|$)", r))


def check_number_words(r: str, kw: dict) -> Score:
    n = count_words(r)
    return _ok(_compare(n, kw["relation"], kw["num_words"]),
               f"{n} words, needs {kw['relation']} {kw['num_words']}")


def check_number_paragraphs(r: str, kw: dict) -> Score:
    dividers = [(m.start() + m.group().index("***"), m.start() + m.group().index("***") + 3)
                for m in re.finditer(r"\s?\*\*\*\s?", r)]
    parts = re.split(r"\s?\*\*\*\s?", r)
    n = len(parts)
    for i, p in enumerate(parts):
        if not p.strip():
            if i in (0, len(parts) - 1):
                n -= 1
            else:
                return Score(0.0, f"empty paragraph {i + 1} between '***' dividers", clean_spans(dividers, len(r)))
    return _ok(n == kw["num_paragraphs"], f"{n} paragraphs separated by '***', needs exactly {kw['num_paragraphs']}",
               r, dividers)


def check_nth_paragraph_first_word(r: str, kw: dict) -> Score:
    breaks = _found(r"\n\n", r)
    parts = re.split(r"\n\n", r)
    n = sum(1 for p in parts if p.strip())
    nth, want = kw["nth_paragraph"], kw["first_word"].lower()

    def no(reason: str, extra: list[Span] = ()) -> Score:
        return Score(0.0, reason, clean_spans([*breaks, *extra], len(r)))

    if nth > n:
        return no(f"only {n} paragraphs, paragraph {nth} is missing")
    start = sum(len(p) + 2 for p in parts[: nth - 1])  # where paragraph nth begins in r
    raw = parts[nth - 1]
    para = raw.strip()
    if not para:
        return no(f"paragraph {nth} is empty")
    w0 = start + (len(raw) - len(raw.lstrip()))
    word = para.split()[0]
    word_span = [(w0, w0 + len(word))]  # the first word as the checker read it (quotes and punctuation included)
    word = word.strip().lstrip("'").lstrip('"')
    first = ""
    for ch in word:
        if ch in {".", ",", "?", "!", "'", '"'}:
            break
        first += ch.lower()
    if n != kw["num_paragraphs"]:
        return no(f"{n} paragraphs separated by blank lines, needs exactly {kw['num_paragraphs']}", word_span)
    return _ok(first == want, f"paragraph {nth} starts with '{first}', not '{want}'", r, breaks + word_span)


def check_placeholders(r: str, kw: dict) -> Score:
    # IFEval counts re.findall(r"\[.*?\]", r); matching only the last '[' before each ']' counts the same
    # matches without rescanning a line from every '[' (that took quadratic time on a long run of '[')
    spans = _found(r"\[[^\[\]\n]*\]", r)
    n = len(spans)
    return _ok(n >= kw["num_placeholders"], f"{n} [placeholders], needs at least {kw['num_placeholders']}", r, spans)


def check_postscript(r: str, kw: dict) -> Score:
    marker = kw["postscript_marker"].strip()
    # IFEval's patterns are these with r"\s*" before and r".*$" (MULTILINE) after, which match wherever these
    # do; without them the search is linear (the leading \s* made it quadratic on long runs of whitespace)
    if marker == "P.P.S":
        pattern = r"p\.\s?p\.\s?s"
    elif marker == "P.S.":
        pattern = r"p\.\s?s\."
    else:
        pattern = re.escape(marker.lower())
    low = r.lower()
    found = re.search(pattern, low)
    # evidence: the postscript from its marker to the end of that line (IFEval's pattern ends with .*$); None when
    # lower() changed the text's length (e.g. 'İ'), so that positions in it are not positions in r
    spans = [] if found is None else [(found.start(), max(found.end(), _line_end(r, found.start())))]
    return _ok(bool(found), f"no postscript starting with '{marker}'", r if len(low) == len(r) else None, spans)


def _line_end(r: str, i: int) -> int:
    """The end of the line holding character ``i`` (trailing whitespace left out)."""
    e = r.find("\n", i)
    e = len(r) if e < 0 else e
    return i + len(r[i:e].rstrip())


def check_bullet_lists(r: str, kw: dict) -> Score:
    # IFEval's r"^\s*\*[^\*].*$" and r"^\s*-.*$" with [^\S\n] for \s: a match starting on a blank line above a
    # bullet ends where the one starting on the bullet's line does, so the counts are equal, in linear time.
    # IFEval's [^\*] also matches a newline: a '*' that ends its line takes the next line into its match (.*$), so a
    # star bullet starting on that next line is not counted (found by Hypothesis against the regex).
    stars, swallowed_to = [], -1
    for m in re.finditer(r"^[^\S\n]*\*[^\*]", r, flags=re.MULTILINE):
        if m.start() < swallowed_to:
            continue
        stars.append((m.end() - 2, m.end() - 1))
        if r[m.end() - 1] == "\n":
            nl = r.find("\n", m.end())
            swallowed_to = len(r) if nl < 0 else nl
    dashes = [(m.end() - 1, m.end()) for m in re.finditer(r"^[^\S\n]*-", r, flags=re.MULTILINE)]
    n = len(stars) + len(dashes)  # evidence: each bullet's marker
    return _ok(n == kw["num_bullets"], f"{n} bullet points, needs exactly {kw['num_bullets']}", r, stars + dashes)


def check_constrained_response(r: str, kw: dict) -> Score:
    spans = [s for o in CONSTRAINED_OPTIONS for s in _found(re.escape(o), r)]
    return _ok(bool(spans), "none of the options " + ", ".join(repr(o) for o in CONSTRAINED_OPTIONS), r, spans)


def check_highlighted_sections(r: str, kw: dict) -> Score:
    one = [m.span() for m in re.finditer(r"\*[^\n\*]*\*", r) if m.group().strip("*").strip()]
    two = [m.span() for m in re.finditer(r"\*\*[^\n\*]*\*\*", r)
           if m.group().removeprefix("**").removesuffix("**").strip()]
    n = len(one) + len(two)
    return _ok(n >= kw["num_highlights"], f"{n} *highlighted* sections, needs at least {kw['num_highlights']}",
               r, one + two)


def check_multiple_sections(r: str, kw: dict) -> Score:
    splitter = kw["section_spliter"].strip()
    pattern = r"\s?" + re.escape(splitter) + r"\s?\d+\s?"
    n = len(re.split(pattern, r)) - 1
    # evidence: each "SECTION 1" marker, without the whitespace around it
    spans = [(m.start() + len(g) - len(g.lstrip()), m.start() + len(g.rstrip()))
             for m in re.finditer(pattern, r) for g in [m.group()]]
    return _ok(n >= kw["num_sections"], f"{n} sections marked '{splitter} X', needs {kw['num_sections']}", r, spans)


def check_json_format(r: str, kw: dict) -> Score:
    value = (r.strip().removeprefix("```json").removeprefix("```Json").removeprefix("```JSON")
             .removeprefix("```").removesuffix("```").strip())
    try:
        json.loads(value)
    except (ValueError, RecursionError) as e:
        return Score(0.0, f"not valid JSON: {e}")
    return Score(1.0, "")


def _titles(r: str) -> list[Span]:
    """IFEval's ``re.findall(r"<<[^\\n]+>>", r)`` in linear time, as spans: per line, from the first '<<' to the
    last '>>' when at least one character lies between them."""
    titles, pos = [], 0
    for line in r.split("\n"):
        start = line.find("<<")
        end = line.rfind(">>")
        if start >= 0 and end >= start + 3:
            titles.append((pos + start, pos + end + 2))
        pos += len(line) + 1
    return titles


def check_title(r: str, kw: dict) -> Score:
    titles = _titles(r)
    ok = any(r[s:e].lstrip("<").rstrip(">").strip() for s, e in titles)
    return _ok(ok, "no title wrapped in <<double angular brackets>>", r, titles)


def check_two_responses(r: str, kw: dict) -> Score:
    seps = _found(re.escape("******"), r)  # where str.split splits: left to right, not overlapping

    def done(value: float, reason: str = "") -> Score:
        return Score(value, reason, clean_spans(seps, len(r)))

    parts = r.split("******")
    valid = []
    for i, p in enumerate(parts):
        if not p.strip():
            if i not in (0, len(parts) - 1):
                return done(0.0, "an empty response between '******' separators")
        else:
            valid.append(p)
    if len(valid) != 2:
        return done(0.0, f"{len(valid)} responses separated by '******', needs 2")
    same = valid[0].strip() == valid[1].strip()
    return done(0.0, "the two responses are identical") if same else done(1.0)


def check_repeat_prompt(r: str, kw: dict) -> Score:
    want = kw["prompt_to_repeat"].strip().lower()
    ok = r.strip().lower().startswith(want)
    s = len(r) - len(r.lstrip())
    # evidence: the start of the response that was compared with the request (as many characters as it has)
    return _ok(ok, "does not start by repeating the request word for word", r, [(s, s + len(want))] if want else [])


def check_end_phrase(r: str, kw: dict) -> Score:
    phrase = kw["end_phrase"].strip().lower()
    ok = r.strip().strip('"').lower().endswith(phrase)
    e = len(r[: len(r.rstrip())].rstrip('"'))  # where the compared text ends: trailing whitespace, then quotes, off
    # evidence: the end of the response that was compared with the phrase (as many characters as it has)
    return _ok(ok, f"does not end with '{kw['end_phrase'].strip()}'", r, [(e - len(phrase), e)] if phrase else [])


def check_capital_word_frequency(r: str, kw: dict) -> Score:
    spans = [m.span() for m in re.finditer(r"\w+(?:[-'.]\w+)*", r) if m.group().isupper()]
    n = len(spans)
    return _ok(_compare(n, kw["capital_relation"], kw["capital_frequency"]),
               f"{n} all-capital words, needs {kw['capital_relation']} {kw['capital_frequency']}", r, spans)


def check_english_capital(r: str, kw: dict) -> Score:
    if not r.isupper():  # evidence: the words with a lowercase letter (none: the whole response was read)
        spans = [m.span() for m in re.finditer(r"\w+", r) if any(c.islower() for c in m.group())]
        return Score(0.0, "not all letters are capital", clean_spans(spans, len(r)) if spans else None)
    lang = detect_language(r)
    return _ok(lang in (None, "en"), f"detected language '{lang}', not English")


def check_english_lowercase(r: str, kw: dict) -> Score:
    if not r.islower():  # evidence: the words with a capital letter (none: the whole response was read)
        spans = [m.span() for m in re.finditer(r"\w+", r) if any(c.isupper() for c in m.group())]
        reason = "contains capital letters" if any(c.isupper() for c in r) else "has no lowercase letters"
        return Score(0.0, reason, clean_spans(spans, len(r)) if spans else None)
    lang = detect_language(r)
    return _ok(lang in (None, "en"), f"detected language '{lang}', not English")


def check_no_comma(r: str, kw: dict) -> Score:
    spans = _found(",", r)
    return _ok(not spans, f"{len(spans)} comma(s) used", r, spans)


def check_quotation(r: str, kw: dict) -> Score:
    v = r.strip()
    s = len(r) - len(r.lstrip())
    # evidence: the first and the last character after stripping whitespace (the ones compared with '"')
    spans = [(s, s + 1), (s + len(v) - 1, s + len(v))] if v else []
    return _ok(len(v) > 1 and v[0] == '"' and v[-1] == '"', "not wrapped in double quotation marks", r, spans)


# ---------------------------------------------------------------------------------------------
# wordings (IFEval's description patterns)
# ---------------------------------------------------------------------------------------------
def _bullets_wording(kw: dict) -> str:
    return (f"Your answer must contain exactly {kw['num_bullets']} bullet points. "
            "Use the markdown bullet points such as:\n"
            "* This is point 1. \n* This is point 2")


def _sections_wording(kw: dict) -> str:
    s = kw["section_spliter"].strip()
    return (f"Your response must have {kw['num_sections']} sections. "
            f"Mark the beginning of each section with {s} X, such as:\n"
            f"{s} 1\n[content of section 1]\n{s} 2\n[content of section 2]")


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instruction:
    """One instruction type: id, argument kinds, wording and checker."""

    id: str
    args: dict[str, str]
    wording: Callable[[dict], str]
    check: Callable[[str, dict], Score]


def _i(iid: str, args: dict[str, str], wording: Callable[[dict], str],
       check: Callable[[str, dict], Score]) -> Instruction:
    return Instruction(iid, args, wording, check)


INSTRUCTIONS: dict[str, Instruction] = {ins.id: ins for ins in [
    _i("keywords:existence", {"keywords": "words"},
       lambda k: f"Include keywords {sorted(k['keywords'])} in the response.", check_keywords_existence),
    _i("keywords:frequency", {"keyword": "text", "frequency": "count", "relation": "relation"},
       lambda k: (f"In your response, the word {k['keyword'].strip()} should appear "
                  f"{k['relation']} {k['frequency']} times."),
       check_keywords_frequency),
    _i("keywords:forbidden_words", {"forbidden_words": "words"},
       lambda k: f"Do not include keywords {sorted(set(k['forbidden_words']))} in the response.",
       check_forbidden_words),
    _i("keywords:letter_frequency", {"letter": "letter", "let_frequency": "count", "let_relation": "relation"},
       lambda k: (f"In your response, the letter {k['letter'].lower()} should appear "
                  f"{k['let_relation']} {k['let_frequency']} times."),
       check_letter_frequency),
    _i("language:response_language", {"language": "language"},
       lambda k: (f"Your ENTIRE response should be in {LANGUAGES[k['language']]} language, "
                  "no other language is allowed."),
       check_response_language),
    _i("length_constraints:number_sentences", {"num_sentences": "count", "relation": "relation"},
       lambda k: f"Your response should contain {k['relation']} {k['num_sentences']} sentences.",
       check_number_sentences),
    _i("length_constraints:number_paragraphs", {"num_paragraphs": "positive"},
       lambda k: (f"There should be {k['num_paragraphs']} paragraphs. "
                  "Paragraphs are separated with the markdown divider: ***"),
       check_number_paragraphs),
    _i("length_constraints:number_words", {"num_words": "count", "relation": "relation"},
       lambda k: f"Answer with {k['relation']} {k['num_words']} words.", check_number_words),
    _i("length_constraints:nth_paragraph_first_word",
       {"num_paragraphs": "positive", "nth_paragraph": "positive", "first_word": "text"},
       lambda k: (f"There should be {k['num_paragraphs']} paragraphs. Paragraphs and only paragraphs are separated "
                  "with each other by two new lines as if it was '\\n\\n' in python. "
                  f"Paragraph {k['nth_paragraph']} must start with word {k['first_word'].lower()}."),
       check_nth_paragraph_first_word),
    _i("detectable_content:number_placeholders", {"num_placeholders": "count"},
       lambda k: (f"The response must contain at least {k['num_placeholders']} placeholders "
                  "represented by square brackets, such as [address]."),
       check_placeholders),
    _i("detectable_content:postscript", {"postscript_marker": "text"},
       lambda k: ("At the end of your response, please explicitly add a postscript starting with "
                  f"{k['postscript_marker'].strip()}"),
       check_postscript),
    _i("detectable_format:number_bullet_lists", {"num_bullets": "count"}, _bullets_wording, check_bullet_lists),
    _i("detectable_format:constrained_response", {},
       lambda k: f"Answer with one of the following options: {CONSTRAINED_OPTIONS}", check_constrained_response),
    _i("detectable_format:number_highlighted_sections", {"num_highlights": "count"},
       lambda k: (f"Highlight at least {k['num_highlights']} sections in your answer with markdown, "
                  "i.e. *highlighted section*."),
       check_highlighted_sections),
    _i("detectable_format:multiple_sections", {"section_spliter": "text", "num_sections": "positive"},
       _sections_wording, check_multiple_sections),
    _i("detectable_format:json_format", {},
       lambda k: "Entire output should be wrapped in JSON format. You can use markdown ticks such as ```.",
       check_json_format),
    _i("detectable_format:title", {},
       lambda k: "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>.",
       check_title),
    _i("combination:two_responses", {},
       lambda k: ("Give two different responses. "
                  "Responses and only responses should be separated by 6 asterisk symbols: ******."),
       check_two_responses),
    _i("combination:repeat_prompt", {"prompt_to_repeat": "text"},
       lambda k: ("First repeat the request word for word without change, then give your answer "
                  "(1. do not say any words or characters before repeating the request; "
                  "2. the request you need to repeat does not include this sentence)"),
       check_repeat_prompt),
    _i("startend:end_checker", {"end_phrase": "text"},
       lambda k: (f"Finish your response with this exact phrase {k['end_phrase'].strip()}. "
                  "No other words should follow this phrase."),
       check_end_phrase),
    _i("change_case:capital_word_frequency", {"capital_frequency": "count", "capital_relation": "relation"},
       lambda k: ("In your response, words with all capital letters should appear "
                  f"{k['capital_relation']} {k['capital_frequency']} times."),
       check_capital_word_frequency),
    _i("change_case:english_capital", {},
       lambda k: "Your entire response should be in English, and in all capital letters.", check_english_capital),
    _i("change_case:english_lowercase", {},
       lambda k: ("Your entire response should be in English, and in all lowercase letters. "
                  "No capital letters are allowed."),
       check_english_lowercase),
    _i("punctuation:no_comma", {},
       lambda k: "In your entire response, refrain from the use of any commas.", check_no_comma),
    _i("startend:quotation", {},
       lambda k: "Wrap your entire response with double quotation marks.", check_quotation),
]}


# ---------------------------------------------------------------------------------------------
# argument validation
# ---------------------------------------------------------------------------------------------
def _check_arg(kind: str, value: Any, where: str) -> Any:
    if kind in ("count", "positive"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: must be an integer, got {value!r}")
        if value < (1 if kind == "positive" else 0):
            raise ValueError(f"{where}: must be {'>= 1' if kind == 'positive' else '>= 0'}, got {value}")
        return value
    if kind == "relation":
        if value not in RELATIONS:
            raise ValueError(f"{where}: must be 'less than' or 'at least', got {value!r}")
        return value
    if kind == "text":
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: must be a non-empty string, got {value!r}")
        return value
    if kind == "words":
        if not isinstance(value, list) or not value or not all(isinstance(w, str) and w.strip() for w in value):
            raise ValueError(f"{where}: must be a non-empty list of non-empty strings, got {value!r}")
        return list(value)
    if kind == "letter":
        if not isinstance(value, str) or len(value) != 1 or not ("a" <= value.lower() <= "z"):
            raise ValueError(f"{where}: must be one letter a-z, got {value!r}")
        return value
    if kind == "language":
        if value not in LANGUAGES:
            raise ValueError(f"{where}: unknown language code {value!r} (use one of: {', '.join(LANGUAGES)})")
        return value
    raise AssertionError(kind)  # pragma: no cover


def validate(instruction_id: Any, kwargs: Any, where: str = "constraint") -> tuple[Instruction, dict]:
    """The instruction and its checked kwargs; ``ValueError("<where>.id: ...")`` etc. when bad.

    ``None``-valued kwargs are dropped first (IFEval's data files list every argument, mostly null).
    """
    if not isinstance(instruction_id, str) or instruction_id not in INSTRUCTIONS:
        raise ValueError(f"{where}.id: unknown instruction id {instruction_id!r}")
    ins = INSTRUCTIONS[instruction_id]
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"{where}.kwargs: must be an object, got {type(kwargs).__name__}")
    given = {k: v for k, v in kwargs.items() if v is not None}
    for name in given:
        if name not in ins.args:
            expected = ", ".join(ins.args) or "none"
            raise ValueError(f"{where}.kwargs.{name}: unknown argument for '{ins.id}' (expected: {expected})")
    out = {}
    for name, kind in ins.args.items():
        if name not in given:
            raise ValueError(f"{where}.kwargs.{name}: missing (required by '{ins.id}')")
        out[name] = _check_arg(kind, given[name], f"{where}.kwargs.{name}")
    if "nth_paragraph" in out and out["nth_paragraph"] > out["num_paragraphs"]:
        raise ValueError(f"{where}.kwargs.nth_paragraph: {out['nth_paragraph']} is more than "
                         f"num_paragraphs ({out['num_paragraphs']})")
    return ins, out
