"""IFEval's own file format as instructions examples: one JSON object a line ``{"key", "prompt",
"instruction_id_list", "kwargs"}`` (google-research's ``input_data.jsonl``, and IFBench-style files using IFEval's
instruction ids), read by the instructions family beside its own format.

The prompt is the example's task prompt x as written: its constraints are stated in its own words, so each
constraint's verifier information is *its sentence of the prompt*, found by the words that state that kind of
constraint (``comma`` for ``punctuation:no_comma``, the keyword itself for ``keywords:existence``, ...; the last
sentence that matches and no other constraint took).  The prompt with those sentences removed is the replay's
``{prompt}`` (:meth:`InstructionsTask.replay_prompt`), so P_all is x with its constraint sentences moved to the end
and P_\\k leaves constraint k's sentence out.  A constraint whose sentence cannot be found (or that shares its
sentence with another constraint) keeps IFEval's standard wording as verifier information; P_\\k then removes only
that wording, while the prompt still states the constraint — :meth:`notes` says so.
"""
from __future__ import annotations

import re
from typing import Any

from mrtpo.tasks.base import Example
from mrtpo.tasks.ifeval_checks import LANGUAGES
from mrtpo.tasks.ifeval_registry import validate

#: the words that state each kind of constraint (matched case-insensitively in a sentence of the prompt)
CUES = {
    "keywords:existence": r"keyword|include", "keywords:frequency": r"\btimes\b|appear|frequen",
    "keywords:forbidden_words": r"\bnot\b|n't|avoid|without|forbid", "keywords:letter_frequency": r"letter",
    "language:response_language": r"language", "length_constraints:number_sentences": r"sentence",
    "length_constraints:number_paragraphs": r"paragraph|\*\*\*", "length_constraints:number_words": r"\bwords?\b",
    "length_constraints:nth_paragraph_first_word": r"paragraph", "detectable_content:number_placeholders":
    r"placeholder|square bracket", "detectable_content:postscript": r"postscript|p\.\s?s\.",
    "detectable_format:number_bullet_lists": r"bullet", "detectable_format:constrained_response":
    r"my answer is|following options", "detectable_format:number_highlighted_sections": r"highlight",
    "detectable_format:multiple_sections": r"section", "detectable_format:json_format": r"json",
    "detectable_format:title": r"title|<<", "combination:two_responses": r"two (different )?responses|\*{6}",
    "combination:repeat_prompt": r"repeat", "startend:end_checker": r"\bend\b|finish",
    "change_case:capital_word_frequency": r"capital", "change_case:english_capital": r"capital|upper ?case",
    "change_case:english_lowercase": r"lower ?case|no capital", "punctuation:no_comma": r"comma",
    "startend:quotation": r"quotation|double quote",
}
_END = re.compile(r"[.!?]+[\"')\]*]*(?=\s|$)|\n")


def is_ifeval_line(obj: dict) -> bool:
    return "instruction_id_list" in obj and "prompt" in obj


def _cue(iid: str, kw: dict) -> re.Pattern:
    """The words that state this constraint: its kind's cue and its own arguments (a keyword, a phrase, ...)."""
    words = [CUES[iid]]
    for name in ("keywords", "forbidden_words"):
        words += [re.escape(w) for w in kw.get(name, [])]
    for name in ("keyword", "end_phrase", "postscript_marker", "section_spliter", "first_word"):
        if isinstance(kw.get(name), str) and kw[name].strip():
            words.append(re.escape(kw[name].strip()))
    if "language" in kw:
        words.append(re.escape(LANGUAGES[kw["language"]]))
    return re.compile("|".join(f"(?:{w})" for w in words), re.IGNORECASE)


def sentences(text: str) -> list[tuple[int, int]]:
    """The sentences of a prompt: runs ending in . ! ? (with closing quotes or brackets) before whitespace, or in a
    line break (spans without surrounding whitespace)."""
    out, a = [], 0
    for b in [m.end() for m in _END.finditer(text)] + [len(text)]:
        part = text[a:b]
        if part.strip():
            out.append((a + len(part) - len(part.lstrip()), a + len(part.rstrip())))
        a = b
    return out


def locate(prompt: str, constraints: list[dict]) -> list[tuple[int, int] | None]:
    """Each constraint's sentence in ``prompt`` (span), or None: the last sentence its cue matches that no earlier
    constraint took."""
    spans, taken = sentences(prompt), set()
    out: list[tuple[int, int] | None] = []
    for c in constraints:
        cue = _cue(c["id"], c["kwargs"])
        found = next((sp for sp in reversed(spans) if sp not in taken and cue.search(prompt[sp[0]:sp[1]])), None)
        if found is not None:
            taken.add(found)
        out.append(found)
    return out


def without(prompt: str, spans: list[tuple[int, int]]) -> str:
    """``prompt`` with the ``spans`` cut out (blank runs left by a cut tidied)."""
    out, pos = [], 0
    for a, b in sorted(spans):
        out.append(prompt[pos:a])
        pos = b
    out.append(prompt[pos:])
    text = re.sub(r"[ \t]{2,}", " ", "".join(out))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def parse_ifeval(obj: dict[str, Any], names_for) -> Example:
    """One IFEval-format line as an Example of the instructions family (``names_for``: reward names from ids)."""
    key, prompt, ids = obj.get("key", obj.get("id")), obj["prompt"], obj["instruction_id_list"]
    if isinstance(key, bool) or not isinstance(key, (str, int)) or str(key).strip() == "":
        raise ValueError(f"key: must be a string or an integer, got {key!r}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt: must be a non-empty string")
    if not isinstance(ids, list) or not ids:
        raise ValueError("instruction_id_list: must be a non-empty list of instruction ids")
    kwargs = obj.get("kwargs", [{}] * len(ids))
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        raise ValueError(f"kwargs: must be a list of {len(ids)} objects, one per instruction id")
    parsed = []
    for i, (iid, kw) in enumerate(zip(ids, kwargs)):
        kw = {} if kw is None else kw
        if iid == "combination:repeat_prompt" and isinstance(kw, dict) and kw.get("prompt_to_repeat") is None:
            raise ValueError(f"kwargs[{i}].prompt_to_repeat: missing (required by '{iid}')")
        try:
            ins, checked = validate(iid, kw, "@")
        except ValueError as e:  # the registry's field names ("@.id", "@.kwargs.x") as this format's
            msg = str(e).replace("@.id:", f"instruction_id_list[{i}]:").replace("@.kwargs.", f"kwargs[{i}].")
            raise ValueError(msg.replace("@.kwargs:", f"kwargs[{i}]:")) from None
        parsed.append({"id": ins.id, "kwargs": checked, "wording": ins.wording(checked)})
    spans = locate(prompt, parsed)
    notes = {}
    for c, sp in zip(parsed, spans):
        if sp is not None:
            c["wording"] = prompt[sp[0]:sp[1]]
    names = names_for([c["id"] for c in parsed])
    for name, sp in zip(names, spans):
        if sp is None:
            notes[name] = (f"{name}: its sentence was not found in the prompt on its own, so P_\\k removes only "
                           "IFEval's wording of it; the prompt still states it")
    task = without(prompt, [sp for sp in spans if sp is not None])
    data = {"task": task, "constraints": parsed, "rewards": names, "format": "ifeval",
            "located": [list(sp) if sp else None for sp in spans], "notes": notes}
    return Example(id=str(key), prompt=prompt, data=data)
