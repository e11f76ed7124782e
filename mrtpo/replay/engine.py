"""The leave-one-out replay (METHOD.md steps 1-3): teacher-force each response under P_all and every P_\\k.

For reward k the policy teacher-forces its own response y under P_all (the task prompt with every reward's
verifier information) and under P_\\k (the same with v_k left out); d_kt = JS(p_t, q_t) (:mod:`mrtpo.core.js`)
and ρ_kt from the chosen measure (:mod:`mrtpo.core.measures`). ``mrtpo/method.py`` is the same, top to bottom and
one sequence at a time: the reference this engine is tested equal to.

:func:`replay_groups` is the one way in: any groups (:class:`GroupInput` or scored groups), any measures. It asks the
registry once what the measures read (:func:`replay_needs`) and runs only that:

- **the replay** where a measure reads it (:func:`_replayed`), in named parts, each a module:
  1. the plan (:func:`mrtpo.replay.plan.plan_group`): each response's tokens, the rewards to replay (those with no
     variance in the group are skipped when rewards are given: their advantage is 0 anyway), every variant prompt
     tokenized and checked against the model's context;
  2. the passes (:func:`mrtpo.replay.kvtrie.shared_hidden`): the token prefix common to several sequences runs once
     and its KV cache serves every (variant, response) pair through it; the rest in right-padded passes under token
     budgets (on a Llama-family stack through :mod:`mrtpo.model.llama_step`), keeping only the final hidden states of
     response positions (T, H);
  3. the vocabulary side (:func:`mrtpo.replay.vocab.vocabulary_side`): projection, log-softmax and JS in token chunks,
     so no (variants × responses × T × V) tensor ever exists;
- **no replay** for measures that read none (the oracle, ``ktae``, ``entropy``: :mod:`mrtpo.replay.noreplay`);
- then (:func:`_complete`) the group's rewards, the entropies, and ρ of the first measure from what was run.

:func:`mrtpo.replay.replay_group` (one group, optionally in parts) and :func:`mrtpo.replay.replay_scored` (one scored
group as a view shows it) call it. :func:`naive_replay_group` is the one-sequence-at-a-time reference (full prompt, no
cache, full logits).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from mrtpo.config import check_fields, opt
from mrtpo.core.measures import Needs, needs
from mrtpo.errors import MrtpoError
from mrtpo.groups import ScoredGroup
from mrtpo.model import Decoder, LoadedModel, Sample, compute_dtype, decoder_stack
from mrtpo.model.arch import check_model
from mrtpo.model.decoder import PRECISIONS
from mrtpo.model.defaults import TEMPERATURE
from mrtpo.model.heap import keep_freed_memory
from mrtpo.model.llama_step import llama_step
from mrtpo.model.rates import measuring
from mrtpo.replay.attention import info_attention, info_span
from mrtpo.replay.kvtrie import shared_hidden
from mrtpo.replay.noreplay import unreplayed, with_entropy
from mrtpo.replay.plan import Plan, cuts, plan_group, replay_progress, sequences
from mrtpo.replay.results import ReplayResult
from mrtpo.replay.vocab import FUSED, use_fused, vocabulary_side
from mrtpo.templates import ALL, Template


@dataclass
class ReplayConfig:
    """How the replay runs (its numbers do not depend on it, beyond float rounding and ``precision``): the forward
    passes' token budgets, the vocabulary side's logits budget, prefix sharing, the precision, the temperature of the
    entropy forward and the compiled vocabulary chain. Each field's default, help and limits are its metadata
    (:func:`mrtpo.config.opt`): the ``train`` / ``experiment`` flags, ``TrainConfig``'s ``replay`` part and TRL's
    configs are generated from them."""

    token_budget: int = opt(2048, "replay: max batch × padded new tokens per forward pass (small batches pad less)",
                            lo=1)
    kv_budget: int = opt(4096, "replay: max batch × padded (cached + new) tokens per forward pass (bounds the KV "
                               "copies)", lo=1)
    # the log-softmax and JS then run over JS_LOGITS of them at a time (eager) or the whole chunk (kernel, compiled).
    # Each projection reads the whole head, so a larger budget projects more rows per read of it (bench/vocab.py). A
    # chunk above glibc's 32 MiB ceiling needs mrtpo.model.heap's thresholds, or the chain's temporaries fault in
    # fresh pages
    logits_budget: int = opt(1 << 25, "replay: max (1 + K) × tokens × vocabulary logits per projection onto the "
                                      "vocabulary", lo=1)
    # every shared prefix (the task prompt; the items before the one left out; verifier text that is the same for
    # several responses) runs once and its KV cache serves every sequence through it
    share_prefix: bool = opt(True, "replay: reuse the KV cache of prefixes the sequences share (off: every (response, "
                                   "variant) sequence runs in full, still batched)")
    # with bf16 weights the vocabulary projection runs in bf16 on P_all and on the difference h(P_\k) − h(P_all),
    # which keeps the JS close to float32 (mrtpo.replay.vocab); log-softmax and JS always run in float32
    precision: str = opt("auto", "replay: auto (bf16 weight copies on a CPU with AMX / AVX512-BF16, as on a GPU; else "
                                 "the model's dtype) | model (always the model's dtype: exact) | bfloat16 (bf16 copies "
                                 "on any device)", choices=PRECISIONS)
    temperature: float = opt(TEMPERATURE, "the sampling temperature at which the entropy measure reads the policy "
                                          "where the sampler did not record it (<= 0: 1)")
    fused: str = opt("auto", "replay: the element-wise vocabulary chain in one kernel (the same numbers within float32 "
                             "rounding): auto (on a CPU the built C++ kernel, else compiled when the replay is large "
                             "enough to pay for compiling it, or it is compiled already) | on (compiled) | off (eager)",
                     choices=FUSED)

    def __post_init__(self):
        check_fields(self, "replay config")


Response = str | Sample | Sequence[int]


class GroupInput(NamedTuple):
    """One group to replay: the task prompt x, {reward: v_k} shared by the group or one per response, G responses
    (texts, Samples or token ids), optional (G, K) rewards in verifier_info's key order, and the prompt the responses
    were sampled under (``entropy`` reads the policy there; None: ``prompt``)."""

    prompt: str
    verifier_info: dict[str, str] | Sequence[dict[str, str]]
    responses: Sequence[Response]
    rewards: np.ndarray | torch.Tensor | None = None
    sampling_prompt: str | None = None  # the prompt x the responses were sampled under (entropy); None: ``prompt``


class _Group(NamedTuple):
    """A group as :func:`replay_groups` runs it: its input (rewards only where constant ones are skipped), the reward
    names and rewards the measures read, each response's evidence (None: no checkers) and the sampling prompt."""

    input: GroupInput
    names: list[str]
    rewards: np.ndarray | torch.Tensor | None
    evidence: list[dict] | None
    sampling_prompt: str

    @classmethod
    def of(cls, g: GroupInput | ScoredGroup, skip_constant: bool) -> "_Group":
        if isinstance(g, ScoredGroup):
            gi = GroupInput(g.prompt, g.verifier_info, g.samples, g.rewards if skip_constant else None)
            return cls(gi, list(g.reward_names), g.rewards, g.evidence or None, g.example.prompt)
        return cls(g if skip_constant else g._replace(rewards=None), _names(g.verifier_info), g.rewards, None,
                   g.sampling_prompt if g.sampling_prompt is not None else g.prompt)


def replay_needs(measures: str | Sequence[str], reword: bool | None = None, attention: bool | None = None) -> Needs:
    """What a replay runs for ``measures`` (one name or several): the registry's :func:`mrtpo.core.measures.needs`,
    with the rewordings (P_k′) and P_all's attention pass forced on or off by ``reword`` / ``attention`` where given.
    The replay's one question about its measures; the estimate and the callers that check a replay's inputs ask it."""
    need = needs(measures)
    return replace(need, rewording=need.rewording if reword is None else bool(reword),
                   attention=need.attention if attention is None else bool(attention))


def scored_measures(measure: str | Sequence[str]) -> list[str]:
    """What :func:`mrtpo.replay.replay_scored` asks for: ``measure`` (or several), and ``js`` beside the oracle (a
    view of a scored group shows the replay's d beside the checkers' evidence; the oracle itself reads no replay)."""
    measures = [measure] if isinstance(measure, str) else list(measure)
    return measures + ["js"] if replay_needs(measures).evidence else measures


@torch.no_grad()
def replay_groups(
    lm: LoadedModel,
    groups: Sequence[GroupInput | ScoredGroup],
    template: Template | None = None,
    config: ReplayConfig | None = None,
    measure: str | Sequence[str] = "js",
    reword: bool | None = None,
    attention: bool | None = None,
    progress: Callable[[float, float], None] | None = None,
    skip_constant: bool = True,
) -> list[ReplayResult]:
    """Relevance of every group's responses: the one way into the replay (module docstring).

    Args:
        lm: the policy.
        groups: :class:`GroupInput` (texts, token ids or Samples, rewards optional) or scored groups (their samples,
            rewards, evidence, and their example's prompt as the sampling prompt).
        template: how P_all and P_\\k are written (default :class:`mrtpo.templates.Template`).
        config: the replay's budgets, precision and sampling temperature (:class:`ReplayConfig`).
        measure: the relevance measure (:data:`mrtpo.core.measures.MEASURES`), or several: the result's ρ is the
            first's, and it holds what every one reads, so each re-derives from it with no model call
            (:meth:`ReplayResult.with_measure`).
        reword: also replay P_k′ (v_k reworded) for ``js-reworded``; None: when a measure reads it.
        attention: also read P_all's attention to each v_k (one more pass of the responses under P_all) for
            ``attn-contrast``; None: when a measure reads it.
        progress: ``progress(done, total)`` after each forward pass and each chunk of the vocabulary side, in forward
            tokens (a vocabulary row counts :func:`mrtpo.model.rates.head_share` of one); what it raises stops the
            replay there (a Cancel). None: no calls, the same numbers.
        skip_constant: rewards constant in a group are not replayed (their advantage is 0); False: every reward is
            (the rewards are then only what ``ktae`` reads).

    Returns:
        One :class:`ReplayResult` per group: per response its tokens, d (T,) for every replayed reward where the replay
        ran, ρ (T,) of the first measure, and what the other measures read. Where several groups are replayed, their
        sequences go through one trie, so the passes are fewer and larger; each result is what the group gives alone,
        up to the rounding of other batches; its ``forward_tokens`` / ``forward_passes`` / ``attention_pairs`` are those
        of the joint replay, its ``seconds`` run from the joint replay's start to this group's result. The joint
        replay's forward tokens and own seconds are recorded as a run of this machine's replay rate
        (:func:`mrtpo.model.rates.measuring`; not when P_all's attention is read: its passes are not counted).
    """
    cfg = config or ReplayConfig()
    measures = [measure] if isinstance(measure, str) else list(measure)
    need = replay_needs(measures, reword, attention)
    items = [_Group.of(g, skip_constant) for g in groups]
    if need.evidence and any(it.evidence is None for it in items):  # before any model work
        oracle = next(m for m in measures if replay_needs(m).evidence)
        raise MrtpoError(f"the '{oracle}' measure reads each checker's evidence, not a replay: give the scored group "
                         "(replay_scored) or its evidence (ReplayResult.with_measure)")
    if need.rewards and any(it.rewards is None for it in items):
        raise MrtpoError(f"the '{measures[0]}' measure needs the group's rewards; none were given")
    if need.replay:
        results = _replayed(lm, [it.input for it in items], template, cfg, need, progress)
    else:  # the oracle, ktae, entropy: no K + 1 passes (mrtpo.replay.noreplay)
        results = [unreplayed(lm, it.input.verifier_info, it.input.responses, it.input.rewards) for it in items]
    return [_complete(lm, res, it, need, measures[0], cfg) for res, it in zip(results, items)]


def _complete(lm: LoadedModel, res: ReplayResult, group: _Group, need: Needs, measure: str,
              cfg: ReplayConfig) -> ReplayResult:
    """A group's result with what the measures read beyond the replay (its rewards; the entropies the sampler did not
    record, from one forward under the sampling prompt) and ρ of ``measure`` from all of it."""
    res.attach_context(group.input.responses, group.names, group.rewards)
    if need.entropy:
        res = with_entropy(lm, res, group.sampling_prompt, cfg.temperature, cfg.precision)
    return res.measured(measure, group.evidence)


def _replayed(lm: LoadedModel, groups: Sequence[GroupInput], template: Template | None, cfg: ReplayConfig,
              need: Needs, progress: Callable[[float, float], None] | None) -> list[ReplayResult]:
    """The K + 1 passes of every group through one trie, then the vocabulary side
    (:func:`mrtpo.replay.vocab.vocabulary_side`)."""
    check_model(lm.model, lm.tokenizer, lm.name)  # a model it cannot run is refused before any work
    keep_freed_memory()  # the vocabulary chain's temporaries reuse warm pages (mrtpo.model.heap)
    dtype = compute_dtype(lm, cfg.precision)
    with measuring(lm, dtype, "replay") as run:
        plans = [plan_group(lm, g.prompt, g.verifier_info, g.responses, template, g.rewards, need.rewording)
                 for g in groups]
        V = lm.model.get_output_embeddings().weight.shape[0]
        kind = use_fused(cfg.fused, lm.device, V * sum(len(r) * len(p.variants) for p in plans for r in p.resp_ids))
        keys, seqs, want = sequences(plans)
        pad = lm.tokenizer.pad_token_id
        dec = Decoder(decoder_stack(lm.model), dtype, keep=lm.frozen)
        on_pass, tick = replay_progress(lm, plans, progress)
        states, trie, passes = shared_hidden(
            dec, 0 if pad is None else pad, lm.device, seqs, want,
            cfg.token_budget, cfg.kv_budget, share=cfg.share_prefix, own=llama_step(dec), progress=on_pass,
            store=dec.prefixes(), cuts=cuts(plans))
        hidden = dict(zip(keys, states))
        t_attn = time.perf_counter()
        attn = [_info_attention(lm, plan, dec) if need.attention else None for plan in plans]
        t_attn = time.perf_counter() - t_attn if need.attention else 0.0
        extra = sum(1 + sum(len(r) > 0 for r in plan.resp_ids) for plan in plans) if need.attention else 0
        out = []
        for g, plan in enumerate(plans):
            paths = [trie.paths[n] for n, key in enumerate(keys) if key[0] == g]
            responses = vocabulary_side(lm, plan, lambda i, v, g=g: hidden[(g, i, v)], dtype, cfg.logits_budget,
                                        attn[g], dec, tick, kind)
            out.append(ReplayResult(responses, plan.prompt_texts, plan.rewards, plan.skipped,
                                    prefix_tokens=_common_prefix(trie, paths), forward_tokens=passes.forward_tokens,
                                    forward_passes=passes.forward_passes + extra,
                                    attention_pairs=passes.attention_pairs, seconds=time.perf_counter() - run.t0,
                                    attention_seconds=t_attn))
        if not need.attention:  # (P_all's attention passes are not counted in the forward tokens)
            run.tokens = passes.forward_tokens
    return out


def _names(verifier_info) -> list[str]:
    """The reward names of a group's verifier information (one dict, or one per response)."""
    infos = list(verifier_info) if isinstance(verifier_info, (list, tuple)) else [verifier_info]
    return list(infos[0]) if infos else []


def _common_prefix(trie, paths: list[list[int]]) -> int:
    """Tokens at the start of every one of ``paths`` (a group's sequences): whole segments they all run through."""
    n = 0
    for segs in zip(*paths):
        if len(set(segs)) > 1:
            break
        n += len(trie.segments[segs[0]].tokens)
    return n


def _info_attention(lm: LoadedModel, plan: Plan, dec: Decoder) -> list[dict[str, np.ndarray]]:
    """Per response, {reward: a_kt (T,)}: P_all's attention from y_t to v_k's tokens (those P_\\k lacks)."""
    prompts = [p[ALL] for p in plan.prompt_ids]
    spans = [{k: info_span(p[ALL], p[k]) for k in plan.rewards} for p in plan.prompt_ids]
    return info_attention(dec, prompts, spans, plan.resp_ids, lm.device)


@torch.no_grad()
def naive_replay_group(lm: LoadedModel, prompt: str, verifier_info: dict[str, str] | Sequence[dict[str, str]],
                       responses: Sequence[Response], template: Template | None = None, rewards=None,
                       measure: str = "js", reword: bool | None = None, attention: bool | None = None) -> ReplayResult:
    """Reference replay: every (variant, response) sequence alone, full prompt, full logits, no cache (P_all's
    attention, where read, as in :func:`replay_groups`); ρ of ``measure`` as :func:`replay_groups` gives it."""
    check_model(lm.model, lm.tokenizer, lm.name)
    t0 = time.perf_counter()
    need = replay_needs(measure, reword, attention)
    plan = plan_group(lm, prompt, verifier_info, responses, template, rewards, need.rewording)
    stats = {"forward_tokens": 0, "forward_passes": 0, "attention_pairs": 0}
    backbone = decoder_stack(lm.model)
    hidden = {}
    for i, rid in enumerate(plan.resp_ids):
        for v in plan.variants:
            p = plan.prompt_ids[i][v]
            ids = torch.tensor([p + rid], device=lm.device)
            h = backbone(input_ids=ids, use_cache=False).last_hidden_state[0]
            hidden[(i, v)] = h[len(p) - 1 : len(p) - 1 + len(rid)]
            stats["forward_tokens"] += ids.shape[1]
            stats["forward_passes"] += 1
            stats["attention_pairs"] += ids.shape[1] * (ids.shape[1] + 1) // 2
    attn = [_info_attention(lm, plan, Decoder(backbone, lm.dtype))] if need.attention else [None]
    V = lm.model.get_output_embeddings().weight.shape[0]
    longest = max((len(r) for r in plan.resp_ids), default=1)  # a response's logits at once, as before chunking
    responses = vocabulary_side(lm, plan, lambda i, v: hidden[(i, v)], lm.dtype, V * len(plan.variants) * longest,
                                attn[0])
    res = ReplayResult(responses, plan.prompt_texts, plan.rewards, plan.skipped, seconds=time.perf_counter() - t0,
                       **stats)
    group = _Group.of(GroupInput(prompt, verifier_info, responses, rewards), True)
    return _complete(lm, res, group, need, measure, ReplayConfig(precision="model"))
