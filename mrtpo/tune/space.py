"""The search space of ``mrtpo tune``, as data: how each reward's verifier information v_k is worded, how P_all lays
the rewards' texts out, and which relevance measure turns a replay into ρ — chosen per reward (ρ is per reward).

**Wordings** (:data:`WORDINGS`) say what v_k holds, as a field template filled by :func:`mrtpo.templates.fill_fields`
(plain whole-field substitution, never code) with the fields :data:`FIELDS`:

- ``{rule}``: the checker's rule as it applies to the example (:meth:`TaskFamily.rule_info`; for texts given without a
  task family, the text itself);
- ``{rule_short}``: the rule's first sentence, at most :data:`SHORT_CHARS` characters (cut at a word);
- ``{reward}``: the reward's name; ``{kind}``: its kind (:func:`reward_kind`);
- ``{findings}``: what the checker found in this reply (:meth:`TaskFamily.findings`, the ``findings`` regime), ""
  where it found nothing to add. Only a task family's checkers supply it.

**Layouts** (:data:`LAYOUTS`) say how P_all lists the texts: the family's own template (``after``: the task, then
the texts), the texts *before* the task, each text named by its reward, or all texts on one line.  One layout
serves every reward of a prompt (P_all is one text), so it is chosen once per family; wordings and measures are
chosen per reward.

**Measures** are the registry's (:mod:`mrtpo.core.measures`) and *combinations* ``a+b``: the mean over the parts
of each token's rank under that part's ρ (ranks averaged over ties, divided by T), normalized like every measure.
A combination is as black-box as its parts and reads what they read.  The oracle (``evidence``) is never a
candidate: it reads the checker's evidence, which is what the search scores against.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mrtpo.core.faith_metrics import average_ranks
from mrtpo.core.js import normalize_relevance
from mrtpo.core.measures import MeasureInput, get_measure, measure_names, measure_relevance, needs
from mrtpo.errors import MrtpoError
from mrtpo.templates import Template, TemplateError, template_fields

FIELDS = ("rule", "rule_short", "reward", "kind", "findings")
SHORT_CHARS = 120  # {rule_short}: the rule's first sentence, cut at a word boundary before this many characters


@dataclass(frozen=True)
class Wording:
    """One way to word v_k: ``text`` is a field template over :data:`FIELDS`."""

    name: str
    text: str
    help: str

    @property
    def needs_checker(self) -> bool:
        """Whether it reads ``{findings}`` (what a task family's checker found in the reply)."""
        return "findings" in template_fields(self.text, f"wording '{self.name}'")


WORDINGS: dict[str, Wording] = {w.name: w for w in (
    Wording("rule", "{rule}", "the rule as written (today's default)"),
    Wording("checker", "The {kind} checker: {rule}", "the checker's own description: which checker reads the "
                                                    "reply, then its rule"),
    Wording("imperative", "Make sure: {rule_short}", "a short imperative: the rule's first sentence"),
    Wording("findings", "{rule} {findings}", "the findings regime: the rule, then what the checker found in this "
                                             "reply (a task family's checkers supply it)"),
)}

#: how P_all lists the rewards' texts: None = the family's own template; else {"prompt", "item", "separator"} where
#: the keys given replace the family's
LAYOUTS: dict[str, dict | None] = {
    "after": None,
    "before": {"prompt": "The answer will be checked as follows:\n{verifier_info}\n\n{prompt}"},
    "named": {"item": "- {reward}: {text}", "separator": "\n"},
    "plain": {"item": "- {text}", "separator": "\n"},
    "inline": {"item": "{text}", "separator": " "},
}
LAYOUT_HELP = {"after": "the family's own template (the task, then the texts)",
               "before": "the texts before the task",
               "named": "one line per text, named by its reward",
               "plain": "one line per text, not named",
               "inline": "every text on one line"}

DEFAULT_WORDING, DEFAULT_LAYOUT, DEFAULT_MEASURE = "rule", "after", "js"  # today's configuration
DEFAULT_MEASURES = ("js", "js-word-carry", "js-contrast", "js-contrast-lead", "js-support", "attn-contrast", "ktae",
                    "attn-contrast+js-support", "attn-contrast+js-contrast-lead")
TUNED = "tuned"  # the measure label of a replay whose ρ came from a choice file (one measure per reward)
DEFAULT = "default"  # the held-out configuration of today: the family's template, the rule as written, js
CHOSEN = "chosen"  # the held-out configuration the choice file holds


@dataclass(frozen=True)
class Variant:
    """One candidate way to build the prompts: a layout (:data:`LAYOUTS`) and a wording (:data:`WORDINGS`)."""

    layout: str
    wording: str

    @property
    def name(self) -> str:
        return f"{self.layout}/{self.wording}"


def variants(layouts, wordings) -> list[Variant]:
    """The candidates that are replayed: every wording under the first layout, and every other layout with the first
    wording (the full cross would cost layouts × wordings replays a group)."""
    return [Variant(layouts[0], w) for w in wordings] + [Variant(lay, wordings[0]) for lay in layouts[1:]]


def default_variant(layouts, wordings, measures) -> str | None:
    """The candidate that is today's configuration (the family's template, the rule as written), when ``js`` is
    among the ``measures`` scored; None when the search leaves it out (it is then replayed for the report alone)."""
    name = Variant(DEFAULT_LAYOUT, DEFAULT_WORDING).name
    ok = DEFAULT_MEASURE in measures and any(v.name == name for v in variants(layouts, wordings))
    return name if ok else None


def reward_kind(reward: str) -> str:
    """A reward's kind: its name up to the first ``:`` (``detectable_format:json_format`` → ``detectable_format``;
    a checklist item ``mention:towel`` → ``mention``; ``format`` → ``format``)."""
    return reward.split(":", 1)[0]


def short_rule(rule: str, limit: int = SHORT_CHARS) -> str:
    """The rule's first sentence (up to the first ". "), at most ``limit`` characters, cut at a word (…)."""
    head = rule.strip()
    cut = head.find(". ")
    if cut >= 0:
        head = head[:cut + 1]
    if len(head) <= limit:
        return head
    room = head[:limit - 1]
    if not head[limit - 1].isspace() and " " in room:  # the cut falls inside a word: back to its start
        room = room[:room.rfind(" ")]
    return room.rstrip() + "…"


def wording_fields(rule: str, reward: str, findings: str = "") -> dict[str, str]:
    """The values of :data:`FIELDS` for one reward's text."""
    return {"rule": rule, "rule_short": short_rule(rule), "reward": reward, "kind": reward_kind(reward),
            "findings": findings}


def check_wording_text(text: str, where: str) -> str:
    """``text`` if it is a field template over :data:`FIELDS` (TemplateError naming an unknown field)."""
    if not isinstance(text, str):
        raise TemplateError(f"{where}: a wording must be text, not {type(text).__name__}")
    unknown = [f for f in template_fields(text, where) if f not in FIELDS]
    if unknown:
        raise TemplateError(f"{where}: unknown field {{{unknown[0]}}} (a wording's fields: "
                            f"{', '.join('{' + f + '}' for f in FIELDS)})")
    return text


def layout_template(name: str, family_template: Template) -> Template:
    """Layout ``name`` (:data:`LAYOUTS`) over the family's template ``family_template``."""
    if name not in LAYOUTS:
        raise MrtpoError(f"unknown layout {name!r}; choose from: {', '.join(LAYOUTS)}")
    return Template.from_dict({**family_template.to_dict(), **(LAYOUTS[name] or {})})


def check_names(names, known, what: str) -> list[str]:
    """``names`` (a list, or comma-separated text) if each is one of ``known``, else MrtpoError naming the first
    that is not."""
    out = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if not out:
        raise MrtpoError(f"no {what}s given; choose from: {', '.join(known)}")
    bad = [n for n in out if n not in known]
    if bad:
        raise MrtpoError(f"unknown {what} {bad[0]!r}; choose from: {', '.join(known)}")
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------------------------------------- measures
def combo_parts(name: str) -> list[str] | None:
    """The registry measures a combination ``a+b(+c…)`` ranks together; None for a plain measure name."""
    if "+" not in name or name in measure_names():
        return None
    return name.split("+")


def check_measure(name: str) -> str:
    """``name`` if it is a measure of the registry or a combination of them (not the oracle), else MrtpoError."""
    if not isinstance(name, str) or not name:
        raise MrtpoError(f"a measure must be a name, not {name!r}")
    for part in combo_parts(name) or [name]:
        try:
            get_measure(part)
        except MrtpoError:
            raise MrtpoError(f"unknown relevance measure {part!r} in {name!r}; choose one of: "
                             f"{', '.join(m for m in measure_names() if not needs(m).evidence)}, or a combination "
                             "a+b of them (mean rank)") from None
        if needs(part).evidence:
            raise MrtpoError(f"measure {name!r}: '{part}' (the oracle) reads the checkers' evidence, which tuning "
                             "scores against; it cannot be a candidate")
    if len(set(combo_parts(name) or [name])) != len(combo_parts(name) or [name]):
        raise MrtpoError(f"measure {name!r}: a combination names each measure once")
    return name


def measure_needs(names) -> dict[str, bool]:
    """What a replay must run for every measure of ``names`` (combinations read their parts'): {"replay",
    "reword", "attention"}."""
    parts = [p for n in names for p in (combo_parts(n) or [n])]
    need = needs(parts)
    return {"replay": need.replay, "reword": need.rewording, "attention": need.attention}


def relevance_of(name: str, inp: MeasureInput) -> np.ndarray:
    """ρ (T,) of measure ``name`` for one (response, reward): the registry's, or a combination's mean rank
    s_t = mean_p rank_p(t) / T (ranks of each part's ρ, ties averaged), normalized to mean 1."""
    parts = combo_parts(name)
    if parts is None:
        return measure_relevance(name, inp)
    T = len(inp.offsets)
    if T == 0:
        return np.zeros(0, dtype=np.float32)
    s = np.mean([average_ranks(measure_relevance(p, inp)) for p in parts], axis=0) / T
    return normalize_relevance(torch.from_numpy(s.astype(np.float32))).numpy()
