"""Relevance measures: one registry by name (like the estimators), each a pure function of what a replay gives one
(response, reward) pair (:class:`MeasureInput`) returning per-token scores ≥ 0, normalized to ρ (mean 1) by
:func:`measure_relevance`.  ``js`` is the paper's; docs/METHOD.md says what each other one adds.

Each entry says, as data, what it reads (:class:`Needs`: the replay, P_all's attention, the rewordings, the group's
rewards, the checkers' evidence, the entropy under the sampling prompt), and callers ask :func:`needs` instead of
testing names.  Three need no replay: the oracle ``evidence`` (what each checker read), ``ktae`` (the group's token ids
and rewards, :mod:`mrtpo.core.ktae`) and ``entropy`` (the policy's next-token entropy under the sampling prompt, which
the sampler records).  :func:`allowed_measures` says which measures an input allows, and why not.
"""
from __future__ import annotations

import re
from dataclasses import astuple, dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from mrtpo.core.faith_metrics import token_labels
from mrtpo.core.js import normalize_relevance
from mrtpo.core.ktae import ktae_scores
from mrtpo.errors import MrtpoError

#: MeasureInput.evidence where no checker says what it read
NO_EVIDENCE = object()


@dataclass
class MeasureInput:
    """What the replay gives a relevance measure, for one response and one reward k (arrays (T,), float32).

    The measures that need no replay read the last fields: the group (``ktae``) and the entropy (``entropy``); the
    replay's fields are None on a result that came without a replay (:func:`needs_replay` False for its measure)."""

    js: np.ndarray | None  # d_kt: the JS distance between π(·|P_all, y<t) and π(·|P_\\k, y<t); None: no replay ran
    logp_all: np.ndarray  # log π(y_t | P_all, y<t): the sampled token under P_all
    logp_without: np.ndarray  # log π(y_t | P_\\k, y<t): the sampled token under P_\\k
    offsets: Sequence[tuple[int, int]]  # each token's characters [start, end) in ``text``
    text: str
    js_others: np.ndarray | None = None  # (K', T): d of the other rewards replayed for this response (K' may be 0)
    # the characters reward k's checker read (Score.evidence: spans, [] nothing specific, None the whole response);
    # NO_EVIDENCE where there is no checker to say (typed rewards, TRL reward functions, uploaded rollouts)
    evidence: list[tuple[int, int]] | None | object = NO_EVIDENCE
    # (R, T): d between π(·|P_all, y<t) and π(·|P_k′, y<t), P_k′ = P_all with v_k reworded (mrtpo.templates
    # REWORDINGS); None where the replay ran without rewordings (only js-reworded reads it)
    js_reworded: np.ndarray | None = None
    # a_kt: how much y_t's position attends to v_k's tokens in P_all, mean over heads and the upper half of the layers
    # (mrtpo.replay.attention); attn_others (K', T) the same for the other replayed rewards; None where the replay
    # did not read the attention (only attn-contrast reads it)
    attn: np.ndarray | None = None
    attn_others: np.ndarray | None = None
    # the group the response belongs to (ktae): every response's token ids (G lists, this one's at ``index``) and
    # reward k's value for each (G,); None where no group with rewards is known (given texts without rewards)
    group_ids: Sequence[Sequence[int]] | None = None
    group_rewards: np.ndarray | None = None
    index: int | None = None
    # H_t = H(π(·|x, y<t)) (T,): the policy's next-token entropy under the sampling prompt x at the sampling
    # temperature (the sampler records it; else one forward under x); the same for every reward; None: unknown
    entropy: np.ndarray | None = None


#: a relevance measure: MeasureInput -> (T,) scores ≥ 0; :func:`measure_relevance` normalizes them to ρ (mean 1)
Measure = Callable[[MeasureInput], np.ndarray]


@dataclass(frozen=True)
class Needs:
    """What a measure reads beyond the response's tokens (a registry entry's data), or several measures together
    (``a | b``: what either reads)."""

    replay: bool = True  # the replay's K + 1 passes: d_kt, the sampled tokens' log-probabilities under P_all, P_\k
    attention: bool = False  # P_all's attention from each response token to v_k (one more pass under P_all)
    rewording: bool = False  # P_k′: P_all with v_k reworded (R more prompts per reward)
    rewards: bool = False  # the group's rewards (a group of responses with rewards)
    evidence: bool = False  # what each reward's checker read (Score.evidence)
    entropy: bool = False  # the policy's entropy under the sampling prompt (the sampler's, else one forward)

    def __or__(self, other: "Needs") -> "Needs":
        return Needs(*(a or b for a, b in zip(astuple(self), astuple(other))))

    @property
    def model(self) -> bool:
        """Whether the model runs for it: the replay, the attention pass or the entropy forward (where the sampler did
        not record the entropy)."""
        return self.replay or self.attention or self.entropy


MEASURES: dict[str, Measure] = {}
MEASURE_HELP: dict[str, str] = {}
MEASURE_NEEDS: dict[str, Needs] = {}


def register_measure(name: str, help: str, needs: Needs = Needs()):
    """Decorator: add a measure to :data:`MEASURES` under ``name`` (the CLI, app, trainer and TRL take the name), with
    what it reads (``needs``; default: the replay alone)."""
    def add(fn: Measure) -> Measure:
        MEASURES[name], MEASURE_HELP[name], MEASURE_NEEDS[name] = fn, help, needs
        return fn
    return add


def needs(measures: str | Sequence[str]) -> Needs:
    """What ``measures`` (one name, or several) read, from their registry entries: the one question every caller asks
    (what to run, what to refuse) instead of testing names.  An MrtpoError names an unknown measure."""
    out = Needs(replay=False)
    for m in [measures] if isinstance(measures, str) else measures:
        get_measure(m)
        out = out | MEASURE_NEEDS[m]
    return out


def measure_names() -> list[str]:
    return list(MEASURES)


def get_measure(name: str) -> Measure:
    """The measure called ``name``; an MrtpoError naming the choices for an unknown one."""
    if name not in MEASURES:
        raise MrtpoError(f"unknown relevance measure {name!r}; choose one of: {', '.join(MEASURES)}")
    return MEASURES[name]


def measure_relevance(name: str, inp: MeasureInput) -> np.ndarray:
    """ρ (T,) float32 of measure ``name``: its scores normalized by :func:`normalize_relevance` (mean 1)."""
    fn = get_measure(name)
    if inp.js is None and MEASURE_NEEDS[name].replay and not MEASURE_NEEDS[name].attention:
        raise MrtpoError(f"the '{name}' measure reads the replay (K + 1 passes over the response); this result came "
                         "without one (only replay-free measures were asked for): replay the group for it")
    scores = np.asarray(fn(inp), dtype=np.float32)
    if not np.isfinite(scores).all():  # a zero probability (log = −inf): NaN → 0, +inf → the largest finite score
        finite = scores[np.isfinite(scores)]
        scores = np.nan_to_num(scores, nan=0.0, posinf=float(finite.max()) if finite.size else 1.0, neginf=0.0)
    return normalize_relevance(torch.from_numpy(np.ascontiguousarray(scores))).numpy()


def word_max(values: np.ndarray, offsets: Sequence[tuple[int, int]], text: str) -> np.ndarray:
    """Each token's value replaced by the largest value among the tokens of its word.

    values: (T,). Words are the maximal runs of non-space characters of ``text`` (``\\S+``). A token belongs to every
    word its characters [start, end) overlap; m_w = max over the tokens of word w, and a token gets the max of m_w
    over its words. A token in no word (whitespace only, or no characters) keeps its own value.
    """
    v = np.asarray(values, dtype=np.float32)
    words = [m.span() for m in re.finditer(r"\S+", text)]
    T = len(offsets)
    member: list[list[int]] = [[] for _ in range(T)]  # token -> words it overlaps
    w = 0
    for t, (s, e) in enumerate(offsets):  # offsets and words are both in text order: one sweep
        while w < len(words) and words[w][1] <= s:
            w += 1
        j = w
        while j < len(words) and words[j][0] < e:
            if e > s:
                member[t].append(j)
            j += 1
    best = np.full(len(words), -np.inf, dtype=np.float32)
    for t, ws in enumerate(member):
        for j in ws:
            best[j] = max(best[j], v[t])
    return np.array([max((best[j] for j in ws), default=v[t]) for t, ws in enumerate(member)], dtype=np.float32)


@register_measure("js", "the paper's: d_kt = JS distance between π(·|P_all, y<t) and π(·|P_\\k, y<t)")
def _js(inp: MeasureInput) -> np.ndarray:
    return inp.js


@register_measure("js-word", "d_kt, each token getting the max over the tokens of its word (words = runs of "
                             "non-space characters)")
def _js_word(inp: MeasureInput) -> np.ndarray:
    return word_max(inp.js, inp.offsets, inp.text)


@register_measure("logratio", "|log π(y_t|P_all, y<t) − log π(y_t|P_\\k, y<t)|: how much v_k moved the sampled "
                              "token's probability")
def _logratio(inp: MeasureInput) -> np.ndarray:
    return np.abs(inp.logp_all - inp.logp_without)


#: carry_forward's threshold: a token the policy gave at least this probability under P_all counts as fixed
CARRY_MIN_PROB = 0.5


def carry_forward(values: np.ndarray, logp: np.ndarray, min_prob: float = CARRY_MIN_PROB) -> np.ndarray:
    """Relevance carried to the tokens a decision fixes: v_0 = x_0, v_t = max(x_t, v_{t−1}) when
    π(y_t | P_all, y<t) = exp(logp_t) ≥ ``min_prob``, else x_t.

    values: (T,) scores x; logp: (T,) the sampled tokens' log-probabilities.  Once "calculate_tri" is written,
    "angle" is near certain under both prompts and its own JS is ≈ 0, although the decision that wrote it was
    reward k's; the run of near-certain tokens after a decision inherits its score.
    """
    x = np.asarray(values, dtype=np.float32)
    out = x.copy()
    sure = np.exp(np.asarray(logp, dtype=np.float64)) >= min_prob
    for t in range(1, len(out)):
        if sure[t]:
            out[t] = max(out[t], out[t - 1])
    return out


@register_measure("js-word-carry", "js-word, then carried forward over the following tokens the policy was sure "
                                   f"of (π(y_t|P_all) ≥ {CARRY_MIN_PROB:g})")
def _js_word_carry(inp: MeasureInput) -> np.ndarray:
    return carry_forward(word_max(inp.js, inp.offsets, inp.text), inp.logp_all)


def contrast(js: np.ndarray, others: np.ndarray | None) -> np.ndarray:
    """The part of reward k's JS not shared with the other rewards' removals: max(0, d_kt − mean_{j≠k} d_jt).

    js: (T,); others: (K', T) (K' = 0: d itself).  Removing any item of the prompt moves every token's distribution
    a little; what removing v_k moves more than removing the others is specific to k."""
    d = np.asarray(js, dtype=np.float32)
    if others is None or not len(others):
        return d
    return np.maximum(0.0, d - np.asarray(others, dtype=np.float32).mean(0))


@register_measure("js-contrast", "max(0, d_kt − mean over the other replayed rewards of d_jt), then word max and "
                                 "carried forward as in js-word-carry")
def _js_contrast(inp: MeasureInput) -> np.ndarray:
    return carry_forward(word_max(contrast(inp.js, inp.js_others), inp.offsets, inp.text), inp.logp_all)


#: js-support's share of the other rewards' mean JS that is taken off d_kt
SUPPORT_OTHERS = 0.5


def support(js: np.ndarray, others: np.ndarray | None, logp_all: np.ndarray, logp_without: np.ndarray,
            share: float = SUPPORT_OTHERS) -> np.ndarray:
    """The JS of reward k where v_k *supports* the written token: s_t = max(0, d_kt − share · mean_{j≠k} d_jt)
    when log π(y_t | P_all, y<t) > log π(y_t | P_\\k, y<t), else 0.

    js, logp_all, logp_without: (T,); others: (K', T) (K' = 0: nothing taken off).  A token that v_k made more likely
    is one its text calls for (a quoted word of the reply, a keyword, a fence); one it made less likely is one the
    rest of the prompt calls for, and removing v_k moved it only as any prompt change does."""
    d = np.asarray(js, dtype=np.float32)
    if others is not None and len(others):
        d = np.maximum(0.0, d - share * np.asarray(others, dtype=np.float32).mean(0))
    return np.where(np.asarray(logp_all) > np.asarray(logp_without), d, np.float32(0.0)).astype(np.float32)


def lead(values: np.ndarray) -> np.ndarray:
    """Each token's score joined by the next one's: v_t = max(x_t, x_{t+1}), v_{T−1} = x_{T−1}.

    values: (T,).  x_{t+1} is what v_k does to the prediction *after* y_t, so y_t is the token that made v_k matter
    there: the policy recognises a quoted span of the reply only once it has read the span's first token (the copy
    shows at the second), and the fence "```" is what the rule's "sql" follows."""
    x = np.asarray(values, dtype=np.float32)
    out = x.copy()
    out[:-1] = np.maximum(x[:-1], x[1:])
    return out


@register_measure("js-support", f"max(0, d_kt − {SUPPORT_OTHERS:g} · mean over the other replayed rewards of "
                                "d_jt), kept where v_k raised the written token's probability (else 0); each token "
                                "also takes the next one's; then word max and carried forward as in js-word-carry")
def _js_support(inp: MeasureInput) -> np.ndarray:
    s = lead(support(inp.js, inp.js_others, inp.logp_all, inp.logp_without))
    return carry_forward(word_max(s, inp.offsets, inp.text), inp.logp_all)


@register_measure("js-contrast-lead", "js-contrast, each token also taking the next one's contrasted score (the "
                                      "lead) before the word max and the carrying")
def _js_contrast_lead(inp: MeasureInput) -> np.ndarray:
    return carry_forward(word_max(lead(contrast(inp.js, inp.js_others)), inp.offsets, inp.text), inp.logp_all)


def reworded_contrast(js: np.ndarray, reworded: np.ndarray | None) -> np.ndarray:
    """What removing v_k moves beyond what rewording it moves: max(0, d_kt − mean_j d′_jt).

    js: (T,); reworded: (R, T), d′_j = JS(π(·|P_all, y<t), π(·|P_k′j, y<t)) where P_k′j says v_k in other words.
    A token whose distribution shifts under any edit of v_k's text (an uncertain position) is not thereby relevant
    to k; one that depends on what v_k *says* moves when it is removed and stays when it is reworded."""
    if reworded is None:
        raise MrtpoError("the 'js-reworded' measure needs a replay with v_k reworded (replay_group(..., reword=True)); "
                         "this replay has none")
    return np.maximum(0.0, np.asarray(js, dtype=np.float32) - np.asarray(reworded, dtype=np.float32).mean(0))


@register_measure("js-reworded", "max(0, d_kt − mean over rewordings of v_k of d′_kt), d′ the JS between P_all and "
                                 "P_all with v_k reworded (two more prompts per reward); then the lead, word max and "
                                 "carried forward as in js-contrast-lead", Needs(rewording=True))
def _js_reworded(inp: MeasureInput) -> np.ndarray:
    s = lead(reworded_contrast(inp.js, inp.js_reworded))
    return carry_forward(word_max(s, inp.offsets, inp.text), inp.logp_all)


@register_measure("attn-contrast", "how much y_t attends to v_k's tokens in P_all (mean over heads and the upper half "
                                   "of the layers) minus the mean over the other replayed rewards' v_j, at least 0; "
                                   "then word max (one more pass of the responses under P_all, reading its attention)",
                  Needs(attention=True))
def _attn_contrast(inp: MeasureInput) -> np.ndarray:
    """s_t = max(0, a_kt − mean_{j≠k} a_jt), word max. Black-box like every JS measure (v_k is the rule), but it
    asks where the policy *looks* at the rule while writing y_t rather than how the rule moves its prediction."""
    if inp.attn is None:
        raise MrtpoError("the 'attn-contrast' measure reads P_all's attention to each v_k; this replay did not read "
                         "it (replay_group(..., attention=True))")
    return word_max(contrast(inp.attn, inp.attn_others), inp.offsets, inp.text)


# ---------------------------------------------------------------------------------------------- the oracle
ORACLE = "evidence"  # needs no replay: relevance from the checker's own evidence


@register_measure(ORACLE, "the oracle: 1 on the tokens the reward's checker read (Score.evidence), 0 elsewhere; "
                          "uniform where it read the whole response or nothing specific; needs no replay",
                  Needs(replay=False, evidence=True))
def _evidence(inp: MeasureInput) -> np.ndarray:
    return evidence_scores(inp.offsets, inp.text, inp.evidence)


def evidence_scores(offsets: Sequence[tuple[int, int]], text: str, spans) -> np.ndarray:
    """(T,) the oracle's scores: 1 on the tokens overlapping a span of ``spans`` (the checker's evidence, with the
    whitespace token before an evidence token: :func:`mrtpo.core.faith_metrics.token_labels`), 0 elsewhere; all 1
    (uniform) for ``None`` (the whole response) or ``[]`` (nothing specific).  ``NO_EVIDENCE`` (no checker) is an
    MrtpoError: the oracle needs a task family's verifiers."""
    if spans is NO_EVIDENCE:
        raise MrtpoError("the 'evidence' measure (the oracle) needs what each checker read (a task family's "
                         "verifiers); typed rewards, TRL reward functions and uploaded rollouts have no evidence: "
                         "pick another measure")
    if not spans:
        return np.ones(len(offsets), dtype=np.float32)
    return token_labels(offsets, spans, text).astype(np.float32)


def oracle_relevance(offsets: Sequence[tuple[int, int]], text: str, spans) -> np.ndarray:
    """ρ (T,) of the oracle: :func:`evidence_scores` normalized like every measure (mean 1)."""
    return normalize_relevance(torch.from_numpy(evidence_scores(offsets, text, spans))).numpy()


# ---------------------------------------------------------------------------------------------- no replay either
@register_measure("ktae", "KTAE (arXiv 2505.16826): per token id, a 2 × 2 table over the group — present or not × "
                          "reward k above its group mean or not — scored by Fisher's exact test and information gain, "
                          "signed by the direction (Cohen's h); s_t = 1 + sign(r_ik − mean) · kt(y_t); needs the "
                          "group's rewards, no replay (no model pass)", Needs(replay=False, rewards=True))
def _ktae(inp: MeasureInput) -> np.ndarray:
    """:func:`mrtpo.core.ktae.ktae_scores` (the formula and the paper's choices are that module's docstring)."""
    if inp.group_ids is None or inp.group_rewards is None or inp.index is None:
        raise MrtpoError("the 'ktae' measure needs the group's responses and each reward's values (a scored group, "
                         "or cases with rewards); this input has no group with rewards")
    if len(inp.group_ids[inp.index]) != len(inp.offsets):
        raise MrtpoError(f"ktae: response {inp.index} has {len(inp.group_ids[inp.index])} token ids for "
                         f"{len(inp.offsets)} tokens")
    return ktae_scores(inp.group_ids, inp.group_rewards, inp.index)


@register_measure("entropy", "the policy's next-token entropy H(π(·|x, y<t)) under the sampling prompt x at the "
                             "sampling temperature (\"Beyond the 80/20 rule\", arXiv 2506.01939; TRL's "
                             "top_entropy_quantile): the same for every reward; recorded by the sampler, else one "
                             "forward under x; no replay", Needs(replay=False, entropy=True))
def _entropy(inp: MeasureInput) -> np.ndarray:
    """s_t = H_t: high-entropy ("forking") tokens get the credit, whichever reward — the control for whether
    per-reward relevance matters at all."""
    if inp.entropy is None:
        raise MrtpoError("the 'entropy' measure needs the policy's entropy under the sampling prompt (recorded by the "
                         "sampler, or one forward under x: mrtpo.replay.noreplay.with_entropy); this input has none")
    if len(inp.entropy) != len(inp.offsets):
        raise MrtpoError(f"entropy: {len(inp.entropy)} values for {len(inp.offsets)} tokens")
    return np.maximum(np.asarray(inp.entropy, dtype=np.float32), 0.0)


def needs_replay(measure: str) -> bool:
    """:func:`needs`' ``replay``: whether ``measure`` reads the replay (all but the oracle, ``ktae``, ``entropy``)."""
    return needs(measure).replay


def needs_rewording(measure: str) -> bool:
    """:func:`needs`' ``rewording``: whether ``measure`` reads P_k′ (v_k reworded)."""
    return needs(measure).rewording


def needs_attention(measure: str) -> bool:
    """:func:`needs`' ``attention``: whether ``measure`` reads P_all's attention to each v_k."""
    return needs(measure).attention


def allowed_measures(measures: Sequence[str], *, evidence: bool, outcomes: bool, entropy: bool = True,
                     replay: bool = True) -> tuple[list[str], dict[str, str]]:
    """The measures of ``measures`` an input allows, and {measure: why it was left out} for the others.

    evidence: the checkers say what they read (a task family's verifiers); outcomes: the responses form a group with
    rewards; entropy: the sampling prompt is known (or the sampler recorded the entropy); replay: the replay can run
    (verifier information and a model).  What ``--measure all`` means."""
    why = {}
    for m in measures:
        need = needs(m)
        if need.evidence and not evidence:
            why[m] = "the oracle needs what each checker read (a task family's verifiers)"
        elif need.rewards and not outcomes:
            why[m] = "needs a group of responses with rewards"
        elif need.entropy and not entropy:
            why[m] = "needs the sampling prompt (or the sampler's recorded entropy)"
        elif need.replay and not replay:
            why[m] = "needs the replay (verifier information and the model)"
    return [m for m in measures if m not in why], why
