"""The checklist family's item kinds: each a named check of one part of a reply, with its arguments, its wording
(the line of the prompt that asks for it) and a strict 0/1 checker that states its evidence.

Evidence (``Score.evidence``, the characters the checker read, for a zero as for a one; ``[]`` when it found
nothing to point at):

* ``mention`` / ``avoid`` / ``capitalized``: every whole-word occurrence of the word, in any case (``[]``: none).
* ``starts_with``: the reply's first len(phrase) characters after leading whitespace, which were compared.
* ``ends_with``: the reply's last len(phrase) characters before trailing whitespace, which were compared.
* ``bullets``: each bullet's marker (``-``, ``*``, ``•`` or ``1.`` / ``1)`` at the start of a line).
* ``bullet_mentions``: the word's occurrences in bullet n when there are some, else bullet n's whole line (read
  and not found); ``[]`` when the reply has fewer than n bullets.
* ``first_line``: the word's occurrences in the first non-empty line, else that whole line.
* ``question`` / ``exclaim``: each ``?`` / ``!``; ``number``: each run of digits.

Words are matched as whole words (not inside a longer word), case-insensitively, as literal text. Every checker
takes any string (control characters, NUL bytes, megabytes) and returns a Score; none raises on a reply.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from mrtpo.tasks.base import MAX_EVIDENCE_SPANS, Score, Span, clean_spans

MAX_ITEMS = 8  # items per example: one reward each
RELATIONS = ("at least", "exactly", "at most")
MAX_WORD_CHARS = 200  # a word or phrase argument, at most
MAX_COUNT = 50  # bullets asked for, at most; also the highest bullet number an item may name

#: a bullet: a line whose first non-space characters are "-", "*", "•", or a number followed by "." or ")", then
#: a space; group 1 is the marker
BULLET = re.compile(r"^[ \t]*([-*•]|\d{1,3}[.)])[ \t]+", re.MULTILINE)


@dataclass(frozen=True)
class ItemKind:
    """One kind of item: its argument names and types (``str`` or ``int``; ``relation`` one of :data:`RELATIONS`),
    its wording (a format string over the arguments) and its checker ``(reply, args) -> Score``."""

    name: str
    args: dict[str, str]
    wording: str
    check: Callable[[str, dict], Score]

    def words(self, args: dict) -> str:
        return self.wording.format(**args)


def _score(passed: bool, reason: str, reply: str, spans) -> Score:
    evidence = clean_spans(spans, len(reply))
    return Score(1.0, "", evidence) if passed else Score(0.0, reason, evidence)


def word_spans(text: str, word: str, start: int = 0, end: int | None = None) -> list[Span]:
    """The whole-word, case-insensitive occurrences of ``word`` in ``text[start:end]``, as spans of ``text`` (at
    most :data:`MAX_EVIDENCE_SPANS` + 1: past that the evidence is the whole reply anyway)."""
    pat = re.compile(r"(?<!\w)" + re.escape(word) + r"(?!\w)", re.IGNORECASE)
    out = []
    for m in pat.finditer(text, start, len(text) if end is None else end):
        out.append(m.span())
        if len(out) > MAX_EVIDENCE_SPANS:
            break
    return out


def bullet_lines(reply: str) -> list[tuple[Span, Span]]:
    """Each bullet of ``reply`` in order: (its marker's span, its line's span without the line break)."""
    out = []
    for m in BULLET.finditer(reply):
        end = reply.find("\n", m.end())
        out.append((m.span(1), (m.start(), len(reply) if end < 0 else end)))
        if len(out) > MAX_EVIDENCE_SPANS:
            break
    return out


def _compare(n: int, relation: str, want: int) -> bool:
    return n >= want if relation == "at least" else n == want if relation == "exactly" else n <= want


def _mention(r: str, a: dict) -> Score:
    spans = word_spans(r, a["word"])
    return _score(bool(spans), f"'{a['word']}' is not mentioned", r, spans)


def _avoid(r: str, a: dict) -> Score:
    spans = word_spans(r, a["word"])
    return _score(not spans, f"uses '{a['word']}' {len(spans)} time{'s' if len(spans) != 1 else ''}", r, spans)


def _capitalized(r: str, a: dict) -> Score:
    spans = word_spans(r, a["word"])
    caps = [s for s in spans if r[s[0]:s[1]] == a["word"].upper()]
    reason = f"'{a['word']}' is not mentioned" if not spans else f"'{a['word']}' is never written in capitals"
    return _score(bool(caps), reason, r, spans)


def _starts_with(r: str, a: dict) -> Score:
    s = len(r) - len(r.lstrip())
    head = r[s:s + len(a["phrase"])]
    return _score(head.lower() == a["phrase"].lower(), f"starts with {head!r}, not {a['phrase']!r}", r,
                  [(s, s + len(head))])


def _ends_with(r: str, a: dict) -> Score:
    e = len(r.rstrip())
    tail = r[max(0, e - len(a["phrase"])):e]
    return _score(tail.lower() == a["phrase"].lower(), f"ends with {tail!r}, not {a['phrase']!r}", r,
                  [(e - len(tail), e)])


def _bullets(r: str, a: dict) -> Score:
    found = bullet_lines(r)
    n = len(found)
    return _score(_compare(n, a["relation"], a["count"]), f"{n} bullet point{'s' if n != 1 else ''}, needs "
                  f"{a['relation']} {a['count']}", r, [marker for marker, _ in found])


def _bullet_mentions(r: str, a: dict) -> Score:
    found = bullet_lines(r)
    n = a["bullet"]
    if len(found) < n:
        return Score(0.0, f"there is no bullet point {n} ({len(found)} bullet point{'s' if len(found) != 1 else ''})",
                     [])
    s, e = found[n - 1][1]
    spans = word_spans(r, a["word"], s, e)
    return _score(bool(spans), f"bullet point {n} does not mention '{a['word']}'", r, spans or [(s, e)])


def _first_line(r: str, a: dict) -> Score:
    m = re.search(r"\S", r)
    if m is None:
        return Score(0.0, "the reply is empty", [])
    s = r.rfind("\n", 0, m.start()) + 1
    e = r.find("\n", m.start())
    e = len(r) if e < 0 else e
    spans = word_spans(r, a["word"], s, e)
    return _score(bool(spans), f"the first line does not mention '{a['word']}'", r, spans or [(s, e)])


def _chars(char: str, what: str) -> Callable[[str, dict], Score]:
    def check(r: str, a: dict) -> Score:
        spans = [m.span() for _, m in zip(range(MAX_EVIDENCE_SPANS + 1), re.finditer(re.escape(char), r))]
        return _score(bool(spans), f"no {what}", r, spans)
    return check


def _number(r: str, a: dict) -> Score:
    spans = [m.span() for _, m in zip(range(MAX_EVIDENCE_SPANS + 1), re.finditer(r"\d+", r))]
    return _score(bool(spans), "no number written in digits", r, spans)


KINDS: dict[str, ItemKind] = {k.name: k for k in (
    ItemKind("mention", {"word": "str"}, 'Mention "{word}".', _mention),
    ItemKind("avoid", {"word": "str"}, 'Do not use the word "{word}".', _avoid),
    ItemKind("capitalized", {"word": "str"}, 'Write the word "{word}" in capital letters.', _capitalized),
    ItemKind("starts_with", {"phrase": "str"}, 'Start your reply with "{phrase}".', _starts_with),
    ItemKind("ends_with", {"phrase": "str"}, 'End your reply with "{phrase}".', _ends_with),
    ItemKind("bullets", {"count": "int", "relation": "relation"}, "Use {relation} {count} bullet points.", _bullets),
    ItemKind("bullet_mentions", {"bullet": "int", "word": "str"}, 'Bullet point {bullet} must mention "{word}".',
             _bullet_mentions),
    ItemKind("first_line", {"word": "str"}, 'The first line must mention "{word}".', _first_line),
    ItemKind("question", {}, "Ask the reader a question.", _chars("?", "question mark")),
    ItemKind("exclaim", {}, "Use an exclamation mark.", _chars("!", "exclamation mark")),
    ItemKind("number", {}, "Include a number written in digits.", _number),
)}


def _arg(kind: str, value: Any, where: str):
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
            raise ValueError(f"{where}: must be an integer from 1 to {MAX_COUNT}, got {value!r}")
        return value
    if kind == "relation":
        if value not in RELATIONS:
            raise ValueError(f"{where}: must be one of {', '.join(repr(r) for r in RELATIONS)}, got {value!r}")
        return value
    if not isinstance(value, str) or not value.strip() or "\n" in value or len(value) > MAX_WORD_CHARS:
        raise ValueError(f"{where}: must be a non-empty one-line string of at most {MAX_WORD_CHARS} characters, "
                         f"got {value!r}"[:300])
    return value.strip()


def default_id(kind: ItemKind, args: dict) -> str:
    """An item's reward name when its line gives none: the kind, then its text argument (``mention:towel``), or its
    bullet number (``bullet_mentions:2:hat``)."""
    parts = [kind.name] + [str(args[a]) for a in ("bullet", "word", "phrase", "count") if a in args]
    return ":".join(parts)


def parse_item(obj: Any, where: str) -> dict:
    """One item object ``{"kind", <its arguments>, "id"?}`` as ``{"id", "kind", "args", "wording"}``; ValueError
    ``"<where>.<field>: problem"`` (KeyError ``<where>.<field>`` when missing) naming the bad field."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: must be an object with 'kind' and its arguments, got {type(obj).__name__}")
    if "kind" not in obj:
        raise KeyError(f"{where}.kind")
    name = obj["kind"]
    if not isinstance(name, str) or name not in KINDS:
        raise ValueError(f"{where}.kind: unknown item kind {name!r} (kinds: {', '.join(KINDS)})")
    kind = KINDS[name]
    for key in obj:
        if key not in ("kind", "id", *kind.args):
            raise ValueError(f"{where}.{key}: unknown field for a '{name}' item (its arguments: "
                             f"{', '.join(kind.args) or 'none'})")
    args = {}
    for arg, typ in kind.args.items():
        if arg not in obj:
            raise ValueError(f"{where}.{arg}: missing (required by a '{name}' item)")
        args[arg] = _arg(typ, obj[arg], f"{where}.{arg}")
    item_id = obj.get("id", default_id(kind, args))
    if not isinstance(item_id, str) or not item_id.strip() or len(item_id) > MAX_WORD_CHARS:
        raise ValueError(f"{where}.id: must be a non-empty string of at most {MAX_WORD_CHARS} characters")
    return {"id": item_id.strip(), "kind": name, "args": args, "wording": kind.words(args)}


def check_item(item: dict, reply: str) -> Score:
    """The item's Score for ``reply``."""
    return KINDS[item["kind"]].check(reply, item["args"])
