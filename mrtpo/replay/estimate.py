"""Before the work: the forward tokens that sampling and replaying a group cost, and the seconds they take at this
machine's rate (:mod:`mrtpo.model.rates`) — what the app asks about before it starts, and the CLI says.

- Sampling n responses of at most T new tokens: the prompt once, then n tokens per decoding step,
  prompt + n · (T − 1) at most (:func:`mrtpo.model.rates.sample_tokens`; the rows may all stop earlier).
- A replay: exactly the padded tokens of its passes, from the trie of its sequences and the token budgets
  (:func:`mrtpo.replay.kvtrie.plan_passes`, what :func:`mrtpo.replay.replay_groups` then runs), known from the token
  ids before any pass (:func:`replay_tokens`).
- A replay of responses not sampled yet: the same with every response ``max_new_tokens`` long, no two alike, every
  reward replayed — an upper bound (:func:`estimate_unsampled`).

Seconds = tokens / the phase's rate.  Work estimated above :func:`ask_above` seconds (:data:`ASK_ABOVE_S`, or
``$MRTPO_ASK_ABOVE_S``) is asked about first in the app and announced on stderr by the CLI.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from mrtpo.model import LoadedModel, TooLong, compute_dtype, decoder_stack
from mrtpo.model import decoder as _decoder
from mrtpo.model.rates import Rates, forward_rate, n_params, sample_tokens
from mrtpo.replay.engine import GroupInput, ReplayConfig, replay_needs, scored_measures
from mrtpo.replay.kvtrie import pass_pairs, pass_tokens, plan_passes
from mrtpo.replay.plan import cuts, plan_group, sequences
from mrtpo.templates import Template, variant_label

if TYPE_CHECKING:
    from mrtpo.groups import ScoredGroup
    from mrtpo.tasks.base import Example, TaskFamily

ASK_ABOVE_S = 60.0  # work estimated longer than this is asked about first (app) and announced (CLI)
ASK_ENV = "MRTPO_ASK_ABOVE_S"  # sets it (seconds, >= 0)


def ask_above() -> float:
    """The threshold in seconds: ``$MRTPO_ASK_ABOVE_S`` when it is a number >= 0, else :data:`ASK_ABOVE_S`."""
    try:
        v = float(os.environ.get(ASK_ENV, ""))
    except ValueError:
        return ASK_ABOVE_S
    return v if math.isfinite(v) and v >= 0 else ASK_ABOVE_S


@dataclass
class Estimate:
    """Forward tokens and seconds of some work; ``parts`` {phase: tokens}; ``measured``: every rate used was measured
    on this machine (else some are first guesses); ``bound``: the tokens are an upper bound (responses not sampled
    yet). Estimates add up (``a + b``)."""

    tokens: int = 0
    seconds: float = 0.0
    measured: bool = True
    bound: bool = False
    parts: dict[str, int] = field(default_factory=dict)
    params: int = 0  # the model's parameters (named by a first guess)

    @property
    def rate(self) -> float:
        """Forward tokens per second over the whole work."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def __add__(self, other: Estimate) -> Estimate:
        parts = dict(self.parts)
        for k, v in other.parts.items():
            parts[k] = parts.get(k, 0) + v
        return Estimate(self.tokens + other.tokens, self.seconds + other.seconds,
                        self.measured and other.measured, self.bound or other.bound, parts,
                        max(self.params, other.params))

    def times(self, k: int) -> Estimate:
        """The same work ``k`` times."""
        return Estimate(self.tokens * k, self.seconds * k, self.measured, self.bound,
                        {p: v * k for p, v in self.parts.items()}, self.params)

    def text(self) -> str:
        """``about 3 min 10 s (at most 290,000 forward tokens at 250 tokens/s on this machine)``."""
        where = ("on this machine" if self.measured else
                 f"— a first guess for {self.params / 1e6:,.0f}M parameters; nothing measured on this machine yet")
        return (f"about {duration_text(self.seconds)} ({'at most ' if self.bound else ''}{self.tokens:,} forward "
                f"tokens at {self.rate:,.0f} tokens/s {where})")

    def above(self, threshold: float | None = None) -> bool:
        """Whether it is estimated longer than ``threshold`` (default :func:`ask_above`)."""
        return self.seconds > (ask_above() if threshold is None else threshold)


def duration_text(seconds: float) -> str:
    """``45 s``, ``3 min 10 s``, ``25 min``, ``2 h 5 min``."""
    s = max(0.0, float(seconds))
    if s < 59.5:
        return f"{s:.1f} s" if s < 9.95 else f"{s:.0f} s"
    if s < 3570:
        m, r = divmod(int(round(s)), 60)
        return f"{m} min {r} s" if m < 10 and r else f"{m} min"
    h, m = divmod(int(round(s / 60)), 60)
    return f"{h} h {m} min" if m else f"{h} h"


def eta_text(fraction: float, elapsed: float) -> str:
    """``37 % · 1 min 10 s left`` after ``elapsed`` seconds at ``fraction`` done (the rest at the same pace);
    ``100 % · 12 s`` when done."""
    f = min(max(float(fraction), 0.0), 1.0)
    if f >= 1.0:
        return f"100 % · {duration_text(elapsed)}"
    if f <= 0.0 or elapsed <= 0:
        return f"{int(f * 100)} %"
    return f"{int(f * 100)} % · {duration_text(elapsed * (1 - f) / f)} left"


def _phase(lm: LoadedModel, dtype, phase: str, tokens: int, bound: bool, rates: Rates | None) -> Estimate:
    rate, measured = forward_rate(lm, dtype, phase, rates)
    return Estimate(tokens, tokens / rate, measured, bound, {phase: tokens}, n_params(lm))


def estimate_sample(lm: LoadedModel, prompt: str, n: int, max_new_tokens: int, precision: str = "auto",
                    rates: Rates | None = None) -> Estimate:
    """Sampling ``n`` responses of at most ``max_new_tokens`` to ``prompt``: an upper bound."""
    P = len(lm.encode(lm.chat_prompt(prompt)))
    return _phase(lm, compute_dtype(lm, precision), "sample", sample_tokens(P, n, max_new_tokens), True, rates)


def prompt_tokens(lm: LoadedModel, prompt: str, verifier_info: dict[str, str], template: Template | None = None,
                  reword: bool = False) -> dict[str, int]:
    """{label: tokens} of every prompt a replay of one response builds under ``prompt`` with ``verifier_info`` (P_all,
    each P_\\k and, with ``reword``, each rewording; labelled as the replay's length errors label them): a response
    of T tokens must fit the model's positions after the longest (:func:`mrtpo.model.check_length`)."""
    msgs = (template or Template()).variants(prompt, verifier_info, reworded=reword)
    return {variant_label(v, list(verifier_info)): len(lm.encode(lm.chat_prompt(m))) for v, m in msgs.items()}


def replay_tokens(lm: LoadedModel, groups: Sequence[GroupInput], template: Template | None = None,
                  config: ReplayConfig | None = None, measure: str | Sequence[str] = "js", reword: bool | None = None,
                  attention: bool | None = None) -> tuple[int, int]:
    """(the forward tokens :func:`mrtpo.replay.replay_groups` will report for these arguments — its
    ``forward_tokens`` —, the tokens of the passes that read P_all's attention, which it does not count), from the
    token ids and the token budgets, without a pass; (0, 0) for measures that need no replay."""
    need = replay_needs(measure, reword, attention)
    if not groups or not need.replay:
        return 0, 0
    plans, trie, batches = _passes(lm, groups, template, config or ReplayConfig(), need)
    extra = 0
    if need.attention:  # one more pass per response under P_all
        extra = sum(len(p.prompt_ids[i][p.variants[0]]) + len(r) for p in plans for i, r in enumerate(p.resp_ids))
    return sum(pass_tokens(trie.segments, b) for b in batches), extra


def replay_pairs(lm: LoadedModel, groups: Sequence[GroupInput], template: Template | None = None,
                 config: ReplayConfig | None = None, measure: str | Sequence[str] = "js") -> int:
    """The (query, key) pairs the replay's passes will see — the ``attention_pairs`` of
    :func:`mrtpo.replay.replay_groups` for these arguments (:func:`mrtpo.replay.kvtrie.pass_pairs`) —, without a
    pass; 0 for measures that need no replay."""
    need = replay_needs(measure)
    if not groups or not need.replay:
        return 0
    _, trie, batches = _passes(lm, groups, template, config or ReplayConfig(), need)
    return sum(pass_pairs(trie.segments, b) for b in batches)


def _passes(lm: LoadedModel, groups: Sequence[GroupInput], template: Template | None, cfg: ReplayConfig, need):
    """(the groups' plans, the trie, the passes) the replay builds for these arguments, from the token ids."""
    plans = [plan_group(lm, g.prompt, g.verifier_info, g.responses, template, g.rewards, need.rewording, offsets=False)
             for g in groups]
    _, seqs, _ = sequences(plans)
    share = cfg.share_prefix and _decoder.prefix_mode(decoder_stack(lm.model)) != "unshared"  # as the replay does
    trie, batches, _ = plan_passes(seqs, cfg.token_budget, cfg.kv_budget, share, cuts(plans))
    return plans, trie, batches


def estimate_replay(lm: LoadedModel, groups: Sequence[GroupInput], template: Template | None = None,
                    config: ReplayConfig | None = None, measure: str | Sequence[str] = "js", reword: bool | None = None,
                    attention: bool | None = None, rates: Rates | None = None, bound: bool = False) -> Estimate:
    """:func:`replay_tokens` (both counts) and their seconds at this machine's replay rate; ``parts["replay"]`` is
    the replay's ``forward_tokens``."""
    cfg = config or ReplayConfig()
    fwd, extra = replay_tokens(lm, groups, template, cfg, measure, reword, attention)
    est = _phase(lm, compute_dtype(lm, cfg.precision), "replay", fwd + extra, bound, rates)
    est.parts = {"replay": fwd, **({"attention": extra} if extra else {})}
    return est


def estimate_scored(lm: LoadedModel, groups: Sequence[ScoredGroup], template: Template | None = None,
                    skip_constant: bool = True, config: ReplayConfig | None = None, measure: str = "js",
                    reword: bool | None = None, attention: bool | None = None, rates: Rates | None = None
                    ) -> Estimate:
    """:func:`estimate_replay` for what :func:`mrtpo.replay.replay_scored` runs on each of ``groups``."""
    inputs = [GroupInput(g.prompt, g.verifier_info, g.samples, g.rewards if skip_constant else None) for g in groups]
    return estimate_replay(lm, inputs, template, config, scored_measures(measure), reword, attention, rates)


def estimate_unsampled(lm: LoadedModel, prompt: str, replay_prompt: str, verifier_info: dict[str, str], n: int,
                       max_new_tokens: int, template: Template | None = None, config: ReplayConfig | None = None,
                       measure: str = "js", precision: str = "auto", rates: Rates | None = None,
                       replay: bool = True, replays: int = 1, reword: bool | None = None,
                       attention: bool | None = None) -> Estimate:
    """Sampling n responses to ``prompt`` and (``replay``, where ``measure`` reads one: the replay of a scored group,
    :func:`mrtpo.replay.replay_scored`'s) replaying them ``replays`` times under ``replay_prompt`` with
    ``verifier_info``, before anything is sampled: an upper bound (every response ``max_new_tokens`` long — as long as
    the model's context allows —, no two alike, every reward replayed)."""
    est = estimate_sample(lm, prompt, n, max_new_tokens, precision, rates)
    if not replay or not verifier_info:
        return est
    measure = scored_measures(measure)
    V = lm.model.get_output_embeddings().weight.shape[0]
    T = max_new_tokens
    for _ in range(3):
        fake = [[(i + 1) % V] * T for i in range(n)]
        try:
            return est + estimate_replay(lm, [GroupInput(replay_prompt, verifier_info, fake, None)], template, config,
                                         measure, reword, attention, rates, bound=True).times(replays)
        except TooLong as e:  # the longest variant prompt leaves less room: the responses can be no longer
            T = max(0, T - (e.n_tokens - e.limit))
    return est


def estimate_task_group(lm: LoadedModel, family: TaskFamily, example: Example, n: int, max_new_tokens: int,
                        template: Template | None = None, config: ReplayConfig | None = None, measure: str = "js",
                        precision: str = "auto", rates: Rates | None = None, replay: bool = True, replays: int = 1,
                        reword: bool | None = None, attention: bool | None = None) -> Estimate:
    """:func:`estimate_unsampled` for a task example, with each reward's rule as its verifier information (the
    ``rule`` regime; the others add what the checker found, a few tokens more)."""
    rules = family.rule_info(example)
    vi = {k: rules.get(k, "") for k in family.reward_names(example)}
    return estimate_unsampled(lm, example.prompt, family.replay_prompt(example), vi, n, max_new_tokens, template,
                              config, measure, precision, rates, replay, replays, reword, attention)
