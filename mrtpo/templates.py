"""Verifier-information templates: user-editable text with plain named fields, never code.

A template has three strings:

- ``prompt``: the user message of P_all / P_\\k, with the fields ``{prompt}`` (the task prompt x) and
  ``{verifier_info}`` (the items of the rewards kept in this variant, joined by ``separator``);
- ``item``: one reward's entry, with the fields ``{reward}`` (its name) and ``{text}`` (its verifier information);
- ``separator``: placed between items, taken literally (no fields).

Filling is plain substitution of whole fields: ``{{`` and ``}}`` are literal braces, and anything else in braces
(attribute or index access, conversions, format specs, unknown names) is rejected with a message naming it.

Sizes are bounded, so a template cannot exhaust memory (``{prompt}`` written 100,000 times, say):

- each template string holds at most :data:`MAX_TEMPLATE_CHARS` characters (a template file at most
  :data:`MAX_TEMPLATE_FILE_BYTES` bytes);
- a filled text holds at most :data:`MAX_FILLED_CHARS` characters, or the ``limit`` a caller gives.  Its length is
  computed before anything is built, from the template's literal text and how often each field is used:

      len = literal + Σ_f uses_f · len(value_f),
      len(verifier_info) = Σ_items len(item) + (items − 1) · len(separator),

  and a longer one is refused with a TemplateError giving the length, the limit and the fields that make it up.
  The replay then checks the filled prompts against the model's context in tokens (:func:`mrtpo.model.check_length`).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from mrtpo.errors import MrtpoError
from mrtpo.wording import plural

_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
PROMPT_FIELDS = ("prompt", "verifier_info")
ITEM_FIELDS = ("reward", "text")

MAX_TEMPLATE_CHARS = 100_000  # one template string (prompt, item, separator, a verifier template): ~25k tokens
MAX_FILLED_CHARS = 250_000  # one filled text, unless the caller gives a limit: ~60k tokens of English
# A template file holds three strings: at the cap, JSON-escaped at up to 12 bytes a character, they fit in this.
MAX_TEMPLATE_FILE_BYTES = 40 * MAX_TEMPLATE_CHARS


class TemplateError(MrtpoError):
    """A malformed template (unknown placeholder, stray brace, empty, too long, missing a required field), or a
    fill that would be longer than the limit."""


@dataclass(frozen=True)
class _Shape:
    """A parsed template: its literal characters (escaped braces count one) and how often each field is used."""

    what: str
    literal: int
    uses: dict[str, int]
    names: tuple[str, ...]  # the fields in order of use, repeats included

    def size(self, lengths: dict[str, int]) -> int:
        """len(filled text) = literal + Σ_f uses_f · lengths_f, without building it."""
        return self.literal + sum(n * lengths[f] for f, n in self.uses.items())


@dataclass(frozen=True)
class Template:
    prompt: str = "{prompt}\n\nThe answer will be checked as follows:\n{verifier_info}"
    item: str = "- {text}"
    separator: str = "\n"

    def __post_init__(self):
        # parsed once; not dataclass fields, so to_dict / equality see only the three strings
        object.__setattr__(self, "_prompt", _parse(self.prompt, PROMPT_FIELDS, "prompt", required=PROMPT_FIELDS))
        object.__setattr__(self, "_item", _parse(self.item, ITEM_FIELDS, "item", required=("text",)))
        _check_text(self.separator, "separator")

    @classmethod
    def from_dict(cls, d: dict | None) -> "Template":
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise TemplateError("a template must be a JSON object with 'prompt', 'item' and 'separator' strings")
        unknown = set(d) - {"prompt", "item", "separator"}
        if unknown:
            names = ", ".join(sorted(repr(k) if not isinstance(k, str) else k for k in unknown))
            raise TemplateError(f"unknown template key(s): {names} (use prompt, item, separator)")
        for k, v in d.items():
            if not isinstance(v, str):
                raise TemplateError(f"template '{k}' must be a string")
        return cls(**{k: v for k, v in d.items()})

    @classmethod
    def from_file(cls, path: str | Path) -> "Template":
        """A JSON object {prompt, item, separator}, or plain text used as the ``prompt`` string.

        At most :data:`MAX_TEMPLATE_FILE_BYTES` bytes are read; a longer file is refused."""
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_TEMPLATE_FILE_BYTES + 1)
        except OSError as e:
            raise TemplateError(f"cannot read template file {path}: {e.strerror or e}") from None
        if len(data) > MAX_TEMPLATE_FILE_BYTES:
            raise TemplateError(f"template file {path} is more than {MAX_TEMPLATE_FILE_BYTES:,} bytes; "
                                f"a template string holds at most {MAX_TEMPLATE_CHARS:,} characters")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TemplateError(f"template file {path} is not UTF-8 text (byte {e.start})") from None
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            return cls(prompt=text)
        if isinstance(obj, dict):
            return cls.from_dict(obj)
        return cls(prompt=text)

    def to_dict(self) -> dict:
        return asdict(self)

    def fill(self, prompt: str, verifier_info: dict[str, str], drop: str | None = None,
             limit: int | None = None) -> str:
        """The user message with every reward's item except ``drop`` (None → P_all).

        limit: most characters the message may have (default :data:`MAX_FILLED_CHARS`); its length is computed
        before it is built, and a longer one raises TemplateError with the length and what makes it up.
        """
        limit = MAX_FILLED_CHARS if limit is None else limit
        _check_value(prompt, "the value of {prompt}")
        if not isinstance(verifier_info, dict):
            raise TemplateError(f"verifier information must be a {{reward: text}} object, "
                                f"not {type(verifier_info).__name__}")
        kept = []
        for name, text in verifier_info.items():
            _check_value(name, "a reward name")
            _check_value(text, f"the verifier information of reward '{name}'")
            if name != drop:
                kept.append({"reward": name, "text": text})
        sizes = [self._item.size({k: len(v) for k, v in values.items()}) for values in kept]
        info = sum(sizes) + len(self.separator) * max(0, len(kept) - 1)
        total = self._prompt.size({"prompt": len(prompt), "verifier_info": info})
        if total > limit:
            detail = (f"{_uses(self._prompt, 'prompt', len(prompt))}, {_uses(self._prompt, 'verifier_info', info)} "
                      f"({plural(len(kept), 'item')} of up to {max(sizes, default=0):,} characters from template "
                      "'item')")
            raise _too_long(self._prompt, "prompt", total, limit, detail)
        items = [_substitute(self.item, values) for values in kept]
        return _substitute(self.prompt, {"prompt": prompt, "verifier_info": self.separator.join(items)})

    def variants(self, prompt: str, verifier_info: dict[str, str], rewards: list[str] | None = None,
                 limit: int | None = None, reworded: bool = False) -> dict[str, str]:
        """{"__all__": P_all message, reward: P_\\reward message for each reward in ``rewards`` (default all)}; with
        ``reworded``, also P_k′ under :func:`reworded_key` (k, j) for each rewording j of :data:`REWORDINGS`: P_all
        with v_k said in other words (an empty v_k stays empty)."""
        names = rewards if rewards is not None else list(verifier_info)
        out = {ALL: self.fill(prompt, verifier_info, limit=limit)}
        for k in names:
            out[k] = self.fill(prompt, verifier_info, drop=k, limit=limit)
        for k in names if reworded else []:
            for j, (before, after) in enumerate(REWORDINGS):
                text = verifier_info[k]
                info = {**verifier_info, k: f"{before}{text}{after}" if text.strip() else text}
                out[reworded_key(k, j)] = self.fill(prompt, info, limit=limit)
        return out


ALL = "__all__"

#: the rewordings of P_k′ (the js-reworded measure): v_k framed in other words, its content unchanged, so that what
#: changes between P_all and P_k′ is what any edit of v_k's text changes (before, after)
REWORDINGS = (("In other words: ", ""), ("", " (This is what is checked.)"))


def reworded_key(reward: str, j: int) -> str:
    """The variant key of reward ``reward``'s ``j``-th rewording in :meth:`Template.variants`."""
    return f"__reworded{j}__:{reward}"


def variant_label(key: str, rewards) -> str:
    """How messages name the prompt of :meth:`Template.variants`' ``key`` (``rewards``: the rewards left out one at
    a time): ``P_all``, ``P_\\k (without reward 'k')`` or ``P_all reworded (key)``."""
    return "P_all" if key == ALL else f"P_\\{key} (without reward '{key}')" if key in rewards else \
        f"P_all reworded ({key})"


def template_fields(template: str, what: str = "template") -> list[str]:
    """The field names a plain-field template uses (``{name}``), in order; stray braces raise TemplateError.

    Any non-empty name is accepted here (check it against the values with :func:`fill_fields`).
    """
    return list(_parse(template, None, what).names)


def fill_fields(template: str, values: dict[str, str], what: str = "template", limit: int | None = None) -> str:
    """Fill a user template whose fields are the keys of ``values`` (plain lookup by whole name, never code).

    ``{{`` / ``}}`` are literal braces; a name that is not a key of ``values`` raises TemplateError naming it.
    limit: most characters of the result (default :data:`MAX_FILLED_CHARS`), checked before it is built.
    """
    limit = MAX_FILLED_CHARS if limit is None else limit
    shape = _parse(template, tuple(values), what)
    for f in shape.uses:
        _check_value(values[f], f"the value of {{{f}}}")
    total = shape.size({f: len(values[f]) for f in shape.uses})
    if total > limit:
        big = sorted(shape.uses, key=lambda f: -shape.uses[f] * len(values[f]))[:3]
        raise _too_long(shape, "text", total, limit, ", ".join(_uses(shape, f, len(values[f])) for f in big))
    return _substitute(template, values)


def _check_text(template, what: str) -> None:
    if not isinstance(template, str):
        raise TemplateError(f"template '{what}' must be a string, not {type(template).__name__}")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"template '{what}' is {len(template):,} characters, more than the limit of "
                            f"{MAX_TEMPLATE_CHARS:,}; shorten it")


def _check_value(value, what: str) -> None:
    if not isinstance(value, str):
        raise TemplateError(f"{what} must be text, not {type(value).__name__}")


def _uses(shape: _Shape, field: str, length: int) -> str:
    n = shape.uses.get(field, 0)
    times = "once" if n == 1 else f"{n:,} times"
    return f"{{{field}}} {times} with {length:,} characters"


def _too_long(shape: _Shape, kind: str, total: int, limit: int, detail: str) -> TemplateError:
    return TemplateError(
        f"template '{shape.what}': the filled {kind} would be {total:,} characters, more than the limit of "
        f"{limit:,}; it is {shape.literal:,} characters of template text, {detail}; shorten the template or "
        f"the values")


def _parse(template: str, allowed: tuple[str, ...] | None, what: str, required: tuple[str, ...] = ()) -> _Shape:
    _check_text(template, what)
    if not template.strip():
        raise TemplateError(f"template '{what}' is empty")
    names: list[str] = []
    field_chars = escapes = 0
    for m in _FIELD.finditer(template):
        tok = m.group(0)
        if tok in ("{{", "}}"):
            escapes += 1
            continue
        if m.group(1) is None:
            raise TemplateError(f"template '{what}' has a stray '{tok}' at character {m.start()}; "
                                f"write '{tok * 2}' for a literal brace")
        name = m.group(1)
        if allowed is None:
            if not name.strip():
                raise TemplateError(f"template '{what}' has an empty placeholder '{{}}' at character {m.start()}")
        elif name not in allowed:
            hint = f"allowed: {', '.join('{' + a + '}' for a in allowed)}"
            raise TemplateError(f"template '{what}' has an unknown placeholder '{{{_clip(name)}}}' ({hint})")
        names.append(name)
        field_chars += len(tok)
    uses = Counter(names)
    missing = [r for r in required if r not in uses]
    if missing:
        raise TemplateError(f"template '{what}' must contain {', '.join('{' + r + '}' for r in missing)}")
    return _Shape(what, len(template) - field_chars - escapes, dict(uses), tuple(names))


def _clip(name: str, n: int = 60) -> str:
    return name if len(name) <= n else name[:n] + "…"


def _substitute(template: str, values: dict[str, str]) -> str:
    def rep(m: re.Match) -> str:
        tok = m.group(0)
        if tok == "{{":
            return "{"
        if tok == "}}":
            return "}"
        return values[m.group(1)]

    return _FIELD.sub(rep, template)
