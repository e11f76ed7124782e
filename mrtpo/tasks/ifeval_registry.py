"""IFEval's instruction registry: each instruction id with its arguments (IFEval's ``build_description`` names),
its wording (IFEval's description text filled with the arguments) and its checker (:mod:`mrtpo.tasks.ifeval_checks`);
:func:`validate` checks an instruction's arguments strictly."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mrtpo.tasks.base import Score
from mrtpo.tasks.ifeval_checks import (
    CONSTRAINED_OPTIONS,
    LANGUAGES,
    RELATIONS,
    check_bullet_lists,
    check_capital_word_frequency,
    check_constrained_response,
    check_end_phrase,
    check_english_capital,
    check_english_lowercase,
    check_forbidden_words,
    check_highlighted_sections,
    check_json_format,
    check_keywords_existence,
    check_keywords_frequency,
    check_letter_frequency,
    check_multiple_sections,
    check_no_comma,
    check_nth_paragraph_first_word,
    check_number_paragraphs,
    check_number_sentences,
    check_number_words,
    check_placeholders,
    check_postscript,
    check_quotation,
    check_repeat_prompt,
    check_response_language,
    check_title,
    check_two_responses,
)


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
