"""A choice applied: each reward's verifier information worded as its entry says (:func:`tuned_texts`,
:func:`tuned_group`), the replay run under the choice's template with what its measures read, and each reward's ρ
from its own measure (:func:`choice_relevance`, :func:`tuned_replays`) — what ``explain``, the trainer, the app and
``MRTPOGRPOTrainer`` do with a choice file.  The relevance of a tuned replay is labelled
:data:`mrtpo.tune.space.TUNED` (one measure per reward)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

from mrtpo.core.measures import NO_EVIDENCE
from mrtpo.errors import MrtpoError
from mrtpo.replay import ReplayConfig, ReplayResult, replay_groups
from mrtpo.templates import fill_fields
from mrtpo.tune.choice import Choice
from mrtpo.tune.space import TUNED, WORDINGS, Wording, measure_needs, relevance_of, wording_fields

if TYPE_CHECKING:
    from mrtpo.groups import ScoredGroup
    from mrtpo.model import LoadedModel
    from mrtpo.tasks.base import TaskFamily


def reads_findings(text: str) -> bool:
    """Whether a wording's text reads ``{findings}`` (what a task family's checker found in the reply)."""
    return Wording("entry", text, "").needs_checker


def word(text: str, rule: str, reward: str, findings: str | None = None) -> str:
    """One reward's verifier information: the wording ``text`` filled with its fields (:func:`wording_fields`).
    ``findings`` None: no checker said what it found (texts given without a task family): a wording that reads
    ``{findings}`` is then an MrtpoError."""
    if findings is None and reads_findings(text):
        raise MrtpoError(f"reward '{reward}': its wording reads {{findings}}, what a task family's checker found in "
                         "the reply; these verifier texts come without a checker (use a wording without it)")
    return fill_fields(text, wording_fields(rule, reward, findings or ""), f"the wording of reward '{reward}'")


def tuned_texts(choice: Choice, texts: dict[str, str], findings: dict[str, str] | None = None) -> dict[str, str]:
    """``texts`` ({reward: its rule}) worded as ``choice`` says for each reward (``findings``: what the checkers
    found in the reply, None where no checker says)."""
    return {k: word(choice.entry(k).text, v, k, None if findings is None else findings.get(k, ""))
            for k, v in texts.items()}


def family_texts(family: TaskFamily, group: ScoredGroup, texts: dict[str, str] | Callable[[str], str]) -> list[dict]:
    """Per response of ``group``, {reward: v_k} with each reward's text from ``texts`` ({reward: wording text}, or
    a function of the reward name) filled from the family's rule and, where a text reads them, its findings."""
    ex = group.example
    text_of = texts if callable(texts) else texts.__getitem__
    rules = family.rule_info(ex)
    need = any(reads_findings(text_of(k)) for k in group.reward_names)
    out = []
    for s in group.samples:
        found = family.findings(ex, s.text, family.score(ex, s.text)) if need else {}
        out.append({k: word(text_of(k), rules.get(k, ""), k, found.get(k, "")) for k in group.reward_names})
    return out


def tuned_group(choice: Choice, family: TaskFamily, group: ScoredGroup) -> ScoredGroup:
    """``group`` (the same responses and scores) with each reward's verifier information worded as ``choice``
    says, from the family's rules and findings."""
    return replace(group, verifier_info=family_texts(family, group, lambda k: choice.entry(k).text))


def choice_relevance(rep: ReplayResult, choice: Choice, evidence: Sequence[dict] | None = None) -> ReplayResult:
    """``rep`` with every replayed reward's ρ from its own entry's measure (no model call; combinations rank their
    parts), labelled :data:`TUNED`; ``evidence`` is unused by black-box measures and kept for the record."""
    out = []
    for i, rr in enumerate(rep.responses):
        outcomes = rep.group_outcomes(i)
        rel = {k: relevance_of(choice.entry(k).measure, rr.measure_input(k, NO_EVIDENCE, outcomes))
               for k in rr.relevance}
        out.append(replace(rr, relevance=rel, measure=TUNED))
    return replace(rep, responses=out)


def replay_inputs(choice: Choice) -> dict[str, bool]:
    """What a replay must run for ``choice``'s measures: {"reword": P_k′, "attention": P_all's attention}."""
    need = measure_needs(choice.measures())
    return {"reword": need["reword"], "attention": need["attention"]}


def tuned_replays(lm: LoadedModel, groups: Sequence[ScoredGroup], choice: Choice, family: TaskFamily | None,
                  skip_constant: bool = True, config: ReplayConfig | None = None,
                  progress: Callable[[float, float], None] | None = None) -> tuple[list, list[ReplayResult]]:
    """``groups`` worded as ``choice`` says (``family``: their task family; None: their texts are the rules, worded
    as given), replayed together under the choice's template with what its measures read, and each reward's ρ from
    its own measure: (the worded groups, their replays)."""
    if family is not None:
        worded = [tuned_group(choice, family, g) for g in groups]
    else:
        worded = [replace(g, verifier_info=[tuned_texts(choice, v) for v in g.verifier_info]) for g in groups]
    reps = replay_groups(lm, worded, choice.template, config, "js", progress=progress, skip_constant=skip_constant,
                         **replay_inputs(choice))
    return worded, [choice_relevance(r, choice) for r in reps]


def wording(name: str) -> Wording:
    """The built-in wording called ``name`` (:data:`mrtpo.tune.space.WORDINGS`)."""
    if name not in WORDINGS:
        raise MrtpoError(f"unknown wording {name!r}; choose from: {', '.join(WORDINGS)}")
    return WORDINGS[name]
