"""The choice file: what ``mrtpo tune`` chose, in one versioned JSON format that ``explain``, ``train``,
``experiment``, the app and ``MRTPOGRPOTrainer`` read (:func:`load_choice`), validated, with a message naming the
problem for a bad file and for a stale one (tuned on another model or for another family: :meth:`Choice.check`).

Format (``version`` :data:`VERSION`)::

    {"kind": "mrtpo-tune-choice", "version": 1,
     "model": "default", "model_id": "SmolLM2-135M-Instruct", "family": "sql",
     "layout": {"name": "after", "template": {"prompt": "...", "item": "...", "separator": "..."}},
     "default": {"wording": "rule", "text": "{rule}", "measure": "attn-contrast"},
     "kinds":   {"correct": {"wording": "checker", "text": "The {kind} checker: {rule}", "measure": "js-support"}},
     "rewards": {},
     "report":  {...}}

A reward's entry is ``rewards[name]``, else ``kinds[its kind]`` (:func:`mrtpo.tune.space.reward_kind`), else
``default``: its ``text`` (a field template over :data:`mrtpo.tune.space.FIELDS`; ``wording`` only names it) and
its ``measure`` (the registry's, or a combination ``a+b``).  ``layout.template`` is the verifier-information
template of P_all / P_\\k.  ``family`` may be null (texts tuned without a task family); ``report`` holds the figures
the choice was made on and judged by (read by people, not by the consumers).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.errors import MrtpoError
from mrtpo.jsonl import InputFileError, dumps, load_json, write_text
from mrtpo.templates import Template, TemplateError
from mrtpo.tune.space import check_measure, check_wording_text, reward_kind

KIND = "mrtpo-tune-choice"
VERSION = 1
MAX_CHOICE_BYTES = 4 * 1024 * 1024  # a choice file is small; a larger one is not one


class ChoiceError(MrtpoError):
    """A choice file that cannot be used: not one, malformed, of another version, or stale."""


@dataclass(frozen=True)
class Entry:
    """One reward's configuration: how its text is worded and which measure gives its ρ."""

    wording: str
    text: str
    measure: str

    def to_dict(self) -> dict:
        return {"wording": self.wording, "text": self.text, "measure": self.measure}


@dataclass
class Choice:
    """A validated choice (see the module docstring); ``source`` names where it came from in messages."""

    template: Template
    layout: str
    default: Entry
    kinds: dict[str, Entry] = field(default_factory=dict)
    rewards: dict[str, Entry] = field(default_factory=dict)
    model: str | None = None
    model_id: str | None = None
    family: str | None = None
    report: dict = field(default_factory=dict)
    source: str = "the choice"

    def entry(self, reward: str) -> Entry:
        """Reward ``reward``'s entry: by name, else by kind, else the default."""
        return self.rewards.get(reward) or self.kinds.get(reward_kind(reward)) or self.default

    def measures(self) -> list[str]:
        """Every measure the choice can give (what a replay for it must read)."""
        return list(dict.fromkeys(e.measure for e in (self.default, *self.kinds.values(), *self.rewards.values())))

    def check(self, model_id: str | None = None, family: str | None = None) -> "Choice":
        """This choice, if it was tuned for model ``model_id`` (:func:`model_identity`) and task family ``family``
        (None: not checked); else a ChoiceError saying which and what to do."""
        if family is not None and self.family is not None and self.family != family:
            raise ChoiceError(f"{self.source} was tuned for the '{self.family}' task, not '{family}': its wordings "
                              f"and measures were chosen on that family's checkers; run `mrtpo tune --task {family}`"
                              " for this one")
        if model_id is not None and self.model_id is not None and self.model_id != model_id:
            raise ChoiceError(f"{self.source} was tuned on model '{self.model}' ({self.model_id}), not on "
                              f"'{model_id}': relevance is the policy's own, so a choice made on another model is "
                              "stale; tune again with this model (mrtpo tune --model ...)")
        return self

    def to_dict(self) -> dict:
        return {"kind": KIND, "version": VERSION, "model": self.model, "model_id": self.model_id,
                "family": self.family, "layout": {"name": self.layout, "template": self.template.to_dict()},
                "default": self.default.to_dict(), "kinds": {k: e.to_dict() for k, e in self.kinds.items()},
                "rewards": {k: e.to_dict() for k, e in self.rewards.items()}, "report": self.report}


def model_identity(lm) -> str:
    """What a choice file records of the model it was tuned on, and is checked against: the last part of the model's
    own name or path (``HuggingFaceTB/SmolLM2-135M-Instruct`` and a local copy of it agree), else the name it was
    loaded by."""
    path = str(getattr(getattr(lm.model, "config", None), "_name_or_path", "") or "").rstrip("/")
    return Path(path).name if path else str(lm.name)


def _entry(obj: Any, where: str) -> Entry:
    if not isinstance(obj, dict):
        raise ChoiceError(f"{where} must be an object {{\"wording\", \"text\", \"measure\"}}")
    unknown = sorted(set(obj) - {"wording", "text", "measure"})
    if unknown:
        raise ChoiceError(f"{where}: unknown key {unknown[0]!r} (an entry has wording, text, measure)")
    for key in ("text", "measure"):
        if key not in obj:
            raise ChoiceError(f"{where}.{key}: missing")
    wording = obj.get("wording", "custom")
    if not isinstance(wording, str):
        raise ChoiceError(f"{where}.wording must be a name, not {wording!r}")
    try:
        text = check_wording_text(obj["text"], f"{where}.text")
        measure = check_measure(obj["measure"])
    except MrtpoError as e:
        raise ChoiceError(f"{e}" if str(e).startswith(where) else f"{where}.measure: {e}") from None
    return Entry(wording, text, measure)


def _entries(obj: Any, where: str) -> dict[str, Entry]:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise ChoiceError(f"{where} must be an object {{name: entry}}")
    return {str(k): _entry(v, f"{where}.{k}") for k, v in obj.items()}


def choice_from_dict(d: Any, source: str = "the choice") -> Choice:
    """A :class:`Choice` from the parsed JSON ``d``; ChoiceError naming the key for anything wrong."""
    if not isinstance(d, dict) or d.get("kind") != KIND:
        raise ChoiceError(f"{source} is not a choice file (a JSON object with \"kind\": \"{KIND}\", written by "
                          "`mrtpo tune`)")
    v = d.get("version")
    if v != VERSION:
        raise ChoiceError(f"{source}: version {v!r}; this mrtpo reads choice files of version {VERSION} (tune again "
                          "with this mrtpo)")
    for key in ("model", "model_id", "family"):
        if d.get(key) is not None and not isinstance(d[key], str):
            raise ChoiceError(f"{source}: {key} must be a name or null, not {d[key]!r}")
    layout = d.get("layout")
    if not isinstance(layout, dict) or "template" not in layout:
        raise ChoiceError(f"{source}: layout must be an object {{\"name\", \"template\"}}")
    try:
        template = Template.from_dict(layout["template"])
    except TemplateError as e:
        raise ChoiceError(f"{source}: layout.template: {e}") from None
    if "default" not in d:
        raise ChoiceError(f"{source}: default: missing (the entry of rewards the file does not name)")
    report = d.get("report") or {}
    if not isinstance(report, dict):
        raise ChoiceError(f"{source}: report must be an object")
    return Choice(template, str(layout.get("name", "custom")), _entry(d["default"], f"{source}: default"),
                  _entries(d.get("kinds"), f"{source}: kinds"), _entries(d.get("rewards"), f"{source}: rewards"),
                  d.get("model"), d.get("model_id"), d.get("family"), report, source)


def load_choice(path: str | Path) -> Choice:
    """The choice file at ``path``, validated (ChoiceError / InputFileError naming the file and the problem)."""
    p = Path(path).expanduser()
    try:
        size = p.stat().st_size
    except OSError:
        size = 0
    if size > MAX_CHOICE_BYTES:
        raise ChoiceError(f"{path}: {size:,} bytes is not a choice file (at most {MAX_CHOICE_BYTES:,})")
    try:
        d = load_json(p)
    except InputFileError as e:
        raise ChoiceError(f"choice file {e}") from None
    return choice_from_dict(d, f"choice file {path}")


def parse_choice(text: str, source: str) -> Choice:
    """A choice from JSON ``text`` (an upload), validated as :func:`load_choice` validates a file."""
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ChoiceError(f"{source} is not JSON: {e}") from None
    return choice_from_dict(d, source)


def save_choice(choice: Choice, path: str | Path) -> None:
    """Write ``choice`` to ``path`` (atomically: a failed write leaves the old file)."""
    write_text(path, dumps(choice.to_dict()))
