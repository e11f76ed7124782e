"""Verifier-information templates: user-editable text with plain named fields, never code.

A template has three strings:

- ``prompt``: the user message of P_all / P_\\k, with the fields ``{prompt}`` (the task prompt x) and
  ``{verifier_info}`` (the items of the rewards kept in this variant, joined by ``separator``);
- ``item``: one reward's entry, with the fields ``{reward}`` (its name) and ``{text}`` (its verifier information);
- ``separator``: placed between items, taken literally (no fields).

Filling is plain substitution of whole fields: ``{{`` and ``}}`` are literal braces, and anything else in braces
(attribute or index access, conversions, format specs, unknown names) is rejected with a message naming it.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from mrtpo.errors import MrtpoError

_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
PROMPT_FIELDS = ("prompt", "verifier_info")
ITEM_FIELDS = ("reward", "text")


class TemplateError(MrtpoError):
    """A malformed template (unknown placeholder, stray brace, empty, missing a required field)."""


@dataclass(frozen=True)
class Template:
    prompt: str = "{prompt}\n\nThe answer will be checked as follows:\n{verifier_info}"
    item: str = "- {text}"
    separator: str = "\n"

    def __post_init__(self):
        _parse(self.prompt, PROMPT_FIELDS, "prompt", required=PROMPT_FIELDS)
        _parse(self.item, ITEM_FIELDS, "item", required=("text",))

    @classmethod
    def from_dict(cls, d: dict | None) -> "Template":
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise TemplateError("a template must be a JSON object with 'prompt', 'item' and 'separator' strings")
        unknown = set(d) - {"prompt", "item", "separator"}
        if unknown:
            raise TemplateError(f"unknown template key(s): {', '.join(sorted(unknown))} (use prompt, item, separator)")
        for k, v in d.items():
            if not isinstance(v, str):
                raise TemplateError(f"template '{k}' must be a string")
        return cls(**{k: v for k, v in d.items()})

    @classmethod
    def from_file(cls, path: str | Path) -> "Template":
        """A JSON object {prompt, item, separator}, or plain text used as the ``prompt`` string."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise TemplateError(f"cannot read template file {path}: {e.strerror or e}") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            return cls(prompt=text)
        if isinstance(obj, dict):
            return cls.from_dict(obj)
        return cls(prompt=text)

    def to_dict(self) -> dict:
        return asdict(self)

    def fill(self, prompt: str, verifier_info: dict[str, str], drop: str | None = None) -> str:
        """The user message with every reward's item except ``drop`` (None → P_all)."""
        items = [
            _substitute(self.item, {"reward": name, "text": text})
            for name, text in verifier_info.items()
            if name != drop
        ]
        return _substitute(self.prompt, {"prompt": prompt, "verifier_info": self.separator.join(items)})

    def variants(self, prompt: str, verifier_info: dict[str, str], rewards: list[str] | None = None) -> dict[str, str]:
        """{"__all__": P_all message, reward: P_\\reward message for each reward in ``rewards`` (default all)}."""
        out = {"__all__": self.fill(prompt, verifier_info)}
        for k in rewards if rewards is not None else list(verifier_info):
            out[k] = self.fill(prompt, verifier_info, drop=k)
        return out


ALL = "__all__"


def template_fields(template: str, what: str = "template") -> list[str]:
    """The field names a plain-field template uses (``{name}``), in order; stray braces raise TemplateError.

    Any non-empty name is accepted here (check it against the values with :func:`fill_fields`).
    """
    return _parse(template, None, what)


def fill_fields(template: str, values: dict[str, str], what: str = "template") -> str:
    """Fill a user template whose fields are the keys of ``values`` (plain lookup by whole name, never code).

    ``{{`` / ``}}`` are literal braces; a name that is not a key of ``values`` raises TemplateError naming it.
    """
    _parse(template, tuple(values), what)
    return _substitute(template, values)


def _parse(template: str, allowed: tuple[str, ...] | None, what: str, required: tuple[str, ...] = ()) -> list[str]:
    if not template.strip():
        raise TemplateError(f"template '{what}' is empty")
    found = []
    for m in _FIELD.finditer(template):
        tok = m.group(0)
        if tok in ("{{", "}}"):
            continue
        if m.group(1) is None:
            raise TemplateError(f"template '{what}' has a stray '{tok}' at character {m.start()}; write '{tok * 2}' for a literal brace")
        name = m.group(1)
        if allowed is None:
            if not name.strip():
                raise TemplateError(f"template '{what}' has an empty placeholder '{{}}' at character {m.start()}")
        elif name not in allowed:
            hint = f"allowed: {', '.join('{' + a + '}' for a in allowed)}"
            raise TemplateError(f"template '{what}' has an unknown placeholder '{{{name}}}' ({hint})")
        found.append(name)
    missing = [r for r in required if r not in found]
    if missing:
        raise TemplateError(f"template '{what}' must contain {', '.join('{' + r + '}' for r in missing)}")
    return found


def _substitute(template: str, values: dict[str, str]) -> str:
    def rep(m: re.Match) -> str:
        tok = m.group(0)
        if tok == "{{":
            return "{"
        if tok == "}}":
            return "}"
        return values[m.group(1)]

    return _FIELD.sub(rep, template)
