"""One group of responses to one example: sampled with the policy, scored by the task's verifiers.

A :class:`ScoredGroup` is what every later step reads (the replay, the credit, the views): the responses, each
reward's value, reason, verifier information and evidence. :func:`sample_until_varied` resamples until the rewards
vary (a reward constant in a group gives every response advantage 0).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from mrtpo.core.advantages import active_rewards
from mrtpo.core.info import INFO
from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel, Sample, SamplingConfig, sample
from mrtpo.model.defaults import MAX_TRIES, SEED_RANGE, resample_problem
from mrtpo.tasks.base import Example, Span, TaskFamily
from mrtpo.templates import Template


@dataclass
class ScoredGroup:
    """A group of responses to one example with every reward's score, reason and verifier information."""

    example: Example
    prompt: str  # fills the template's {prompt} for the replay (family.replay_prompt; usually example.prompt)
    samples: list[Sample]
    reward_names: list[str]
    rewards: np.ndarray  # (G, K)
    reasons: list[dict[str, str]]  # per response: {reward: reason}
    verifier_info: list[dict[str, str]]  # per response: {reward: text}
    # per response: {reward: the character spans its checker read (Score.evidence; None = the whole response)};
    # [] when no verifier scored the group (typed rewards)
    evidence: list[dict[str, list[Span] | None]] = field(default_factory=list)
    info: str = INFO  # the verifier information's regime (mrtpo.core.info); typed texts are the rule by construction

    @classmethod
    def unscored(cls, example: Example, samples: Sequence[Sample], reward_names: Sequence[str],
                 verifier_info: dict[str, str] | Sequence[dict[str, str]], rewards=None) -> "ScoredGroup":
        """A group no verifier scored: rewards given (G, K) or all 0 (typed later), no reasons, the example's prompt.

        verifier_info: one {reward: text} shared by the group, or one per response."""
        G, names = len(samples), list(reward_names)
        infos = [dict(verifier_info) for _ in samples] if isinstance(verifier_info, dict) else \
            [dict(v) for v in verifier_info]
        R = np.zeros((G, len(names))) if rewards is None else np.asarray(rewards, dtype=float).reshape(G, len(names))
        return cls(example, example.prompt, list(samples), names, R, [{k: "" for k in names} for _ in samples], infos)

    @property
    def fingerprint(self) -> str:
        """8 hex digits of the responses' token ids (text when a response has none): two groups with the same
        fingerprint hold the same responses, in the same order (the app shows it, so that users can compare)."""
        data = json.dumps([list(s.token_ids) or s.text for s in self.samples]).encode()
        return hashlib.sha256(data).hexdigest()[:8]

    def subset(self, idx: Sequence[int]) -> "ScoredGroup":
        """The same group restricted to the responses ``idx`` (in that order)."""
        idx = list(idx)
        return ScoredGroup(self.example, self.prompt, [self.samples[i] for i in idx], self.reward_names,
                           self.rewards[idx], [self.reasons[i] for i in idx], [self.verifier_info[i] for i in idx],
                           [self.evidence[i] for i in idx] if self.evidence else [], self.info)

    def with_info(self, family: TaskFamily, info: str) -> "ScoredGroup":
        """The same responses and scores with the verifier information of regime ``info`` (no model call; scoring
        runs again only for regimes that read the reply)."""
        return score_group(family, self.example, self.samples, info)


def score_group(family: TaskFamily, example: Example, samples: Sequence[Sample], info: str = INFO) -> ScoredGroup:
    """Score every response with the family's verifiers; the verifier information in regime ``info``
    (:meth:`mrtpo.tasks.base.TaskFamily.verifier_info`)."""
    names = family.reward_names(example)
    R = np.zeros((len(samples), len(names)))
    reasons, infos, evidence = [], [], []
    for i, s in enumerate(samples):
        sc = family.score(example, s.text)
        R[i] = [sc[k].value for k in names]
        reasons.append({k: sc[k].reason for k in names})
        evidence.append({k: sc[k].evidence for k in names})
        v = family.verifier_info(example, s.text, sc, info)
        infos.append({k: v[k] for k in names})
    return ScoredGroup(example, family.replay_prompt(example), list(samples), names, R, reasons, infos, evidence,
                       info)


def sample_group(lm: LoadedModel, family: TaskFamily, example: Example, config: SamplingConfig | None = None,
                 info: str = INFO, **fields) -> ScoredGroup:
    """Sample a group for ``example`` as ``config`` says (:class:`mrtpo.model.SamplingConfig`; keyword ``fields``
    replace its fields, ``n=`` the group size: :func:`mrtpo.model.sample`) and score it (:func:`score_group`)."""
    return score_group(family, example, sample(lm, example.prompt, SamplingConfig.of(config, **fields)), info)


def varied_rewards(group: ScoredGroup) -> list[str]:
    """The rewards that vary within the group (the others are constant: advantage 0 for every response)."""
    return active_rewards(group.reward_names, group.rewards)[0]


@dataclass
class SampleTry:
    """One try of :func:`sample_until_varied`: its seed, the rewards that varied and those that did not, the group's
    mean of each reward, the seconds it took (sampling and scoring) and whether its group is the one returned."""

    index: int  # 1-based
    seed: int
    varied: list[str]
    constant: list[str]
    means: dict[str, float]
    seconds: float
    kept: bool = False  # set on the try whose group sample_until_varied returns


def sample_until_varied(lm: LoadedModel | None, family: TaskFamily, example: Example, tries: int,
                        config: SamplingConfig | None = None, on_try: Callable[[SampleTry], None] | None = None,
                        sample_fn: Callable[[SamplingConfig], Sequence[Sample]] | None = None, want: int = 1,
                        info: str = INFO, **fields) -> tuple[ScoredGroup, list[SampleTry]]:
    """Sample and score groups as ``config`` says (:class:`mrtpo.model.SamplingConfig`; keyword ``fields`` replace
    its fields, ``n=`` the group size) with seeds ``seed``, ``seed + 1``, … — at most ``tries`` of them — until **at
    least ``want`` rewards vary** within the group (default one; ``want`` is capped at the number of rewards); ``tries``
    is at most :data:`MAX_TRIES` and, for more than one, the group size at least 2 (no reward varies within a group of
    one). A reward constant in the group gives every response advantage 0, so a group where every reward is constant
    has nothing to show or learn; the app asks for more varying rewards than its current group has.

    Returns the first group in which ``want`` rewards vary, else the one tried where the most rewards varied (the
    latest of equals: the last one when none varied), and the list of tries; ``on_try(SampleTry)`` is called
    after each.  ``sample_fn(config) -> samples`` (``config``: the try's, its seed set) replaces sampling from ``lm``
    (the app passes its cached sampler; ``lm`` may then be None).  Greedy sampling (``temperature`` 0) gives the
    same group for every seed, so it makes one try only.  ``info``: the verifier information's regime
    (:func:`score_group`).
    """
    if not isinstance(tries, int) or isinstance(tries, bool) or not 1 <= tries <= MAX_TRIES:
        raise MrtpoError(f"tries must be an integer in [1, {MAX_TRIES}], got {tries!r}")
    if not isinstance(want, int) or isinstance(want, bool) or want < 1:
        raise MrtpoError(f"want must be an integer >= 1, got {want!r}")
    cfg = SamplingConfig.of(config, **fields)
    if cfg.seed is None:
        raise MrtpoError("sampling until the rewards vary tries seeds seed, seed + 1, ...: give an integer seed")
    if cfg.temperature != 0 and cfg.seed + tries - 1 > SEED_RANGE[1]:
        raise MrtpoError(f"sampling until the rewards vary tries seeds {cfg.seed} … {cfg.seed + tries - 1}, past the "
                         f"largest seed ({SEED_RANGE[1]}): give a smaller seed or fewer tries")
    if cfg.group_size < 2 and tries > 1:  # one try is plain sampling
        raise MrtpoError(f"sampling until the rewards vary: {resample_problem(cfg.group_size, cfg.temperature)}; "
                         "sample a group of 2 responses or more")
    if sample_fn is None:
        def sample_fn(c: SamplingConfig) -> list[Sample]:
            return sample(lm, example.prompt, c)
    out: list[SampleTry] = []
    best = None
    seed = cfg.seed
    for j in range(1 if cfg.temperature == 0 else tries):
        t0 = time.perf_counter()
        group = score_group(family, example, sample_fn(replace(cfg, seed=seed + j)), info)
        varied, constant = active_rewards(group.reward_names, group.rewards)
        means = {k: float(np.nanmean(group.rewards[:, c])) if np.isfinite(group.rewards[:, c]).any() else float("nan")
                 for c, k in enumerate(group.reward_names)}
        out.append(SampleTry(j + 1, seed + j, varied, constant, means, time.perf_counter() - t0))
        if on_try:
            on_try(out[-1])
        if best is None or len(varied) >= len(best[1]):
            best = (group, varied, out[-1])
        if len(varied) >= min(want, len(group.reward_names)) and varied:
            break
    best[2].kept = True
    return best[0], out


def template_for(family: TaskFamily | None, override: Template | dict | None = None) -> Template:
    if isinstance(override, Template):
        return override
    if override is not None:
        return Template.from_dict(override)
    return Template.from_dict(family.template) if family is not None and family.template else Template()
