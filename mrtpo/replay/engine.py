"""The leave-one-out replay (METHOD.md steps 1-3): teacher-force each response under P_all and every P_\\k.

For reward k the policy teacher-forces its own response y under P_all (the task prompt with every reward's
verifier information) and under P_\\k (the same with v_k left out); d_kt = JS(p_t, q_t) (:mod:`mrtpo.core.js`)
and ρ_kt from the chosen measure (:mod:`mrtpo.core.measures`). ``mrtpo/method.py`` is the same, top to bottom and
one sequence at a time: the reference this engine is tested equal to.

:func:`replay_groups` is the one way in: any groups (:class:`GroupInput` or scored groups), any measures. It asks the
registry once what the measures read (:func:`replay_needs`) and runs only that:

- **the replay** where a measure reads it: the token prefix common to every variant prompt runs once and its KV cache
  serves every (variant, response) pair (:mod:`mrtpo.replay.kvtrie`); pairs are packed into right-padded forward
  passes under token budgets; the passes keep only the final hidden states of response positions (T, H), and the
  vocabulary projection, log-softmax and JS run in token chunks (:mod:`mrtpo.replay.vocab`), so no (variants ×
  responses × T × V) tensor ever exists; rewards with no variance in the group are skipped when rewards are given
  (their advantage is 0 anyway);
- **no replay** for measures that read none (the oracle, ``ktae``, ``entropy``: :mod:`mrtpo.replay.noreplay`);
- then the group's rewards, the entropies, and ρ of the first measure from what was run.

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

from mrtpo.core.measures import Needs, needs
from mrtpo.errors import MrtpoError
from mrtpo.groups import ScoredGroup
from mrtpo.model import Decoder, LoadedModel, Sample, compute_dtype, decoder_stack
from mrtpo.model.arch import check_model, final_softcap
from mrtpo.model.defaults import TEMPERATURE
from mrtpo.model.heap import keep_freed_memory
from mrtpo.model.llama_step import llama_step
from mrtpo.model.rates import measuring
from mrtpo.replay.attention import info_attention, info_span
from mrtpo.replay.kvtrie import shared_hidden
from mrtpo.replay.noreplay import attach_context, unreplayed, with_entropy
from mrtpo.replay.plan import Plan, plan_group, replay_progress, sequences
from mrtpo.replay.results import ReplayResult, ResponseRelevance
from mrtpo.replay.vocab import chain, fused_chain, logprobs, use_fused
from mrtpo.templates import ALL, Template


@dataclass
class ReplayConfig:
    token_budget: int = 2048  # max batch × padded new tokens per forward pass (small batches pad less)
    kv_budget: int = 4096  # max batch × padded (cached + new) tokens per forward pass: bounds the KV copies
    # max (1 + K) × tokens × vocab logits per projection (64 MiB in bf16, 128 MiB in float32); the log-softmax and
    # JS then run over JS_LOGITS of them at a time (eager) or the whole chunk (fused). Each projection reads the
    # whole head, so a larger budget projects more rows per read of it (bench/vocab.py). A chunk above glibc's
    # 32 MiB ceiling needs mrtpo.model.heap's thresholds, or the chain's temporaries fault in fresh pages at every step
    logits_budget: int = 1 << 25
    # KV reuse over a trie of the group's sequences: every shared prefix (the task prompt; the items before the
    # one left out; verifier text that is the same for several responses) runs once and its KV cache serves
    # every sequence through it.  False: every (response, variant) sequence runs in full (still batched).
    share_prefix: bool = True
    # "auto": on a CPU with AMX / AVX512-BF16 the decoder runs on bfloat16 copies of the weights (what a GPU run
    # does; much faster than float32 there), else in the model's dtype; "model": always the model's dtype (exact;
    # what tests compare); "bfloat16": bf16 copies on any device.  Log-softmax and JS always run in float32; with
    # bf16 weights the vocabulary projection
    # runs in bf16 on P_all and on the difference h(P_\k) − h(P_all), which keeps the JS close to float32.
    precision: str = "auto"
    # the sampling temperature at which the ``entropy`` measure reads the policy where the sampler did not record it
    # (one forward under the sampling prompt; ≤ 0: 1, the greedy policy's own distribution)
    temperature: float = TEMPERATURE
    # the element-wise vocabulary chain (log-softmax, JS) compiled into one fused kernel (mrtpo.replay.vocab: the
    # same numbers within float32 rounding, faster than the eager chain on a CPU): "auto" on a CPU when the
    # replay is large enough to pay for compiling it or it is compiled already; "on"; "off" (eager)
    fused: str = "auto"


Response = str | Sample | Sequence[int]
# logits per step of the eager element-wise chain (2 MiB in float32, e.g. 2 tokens × 4 variants of a 49k vocabulary: its
# temporaries stay in the CPU's cache; the fastest of the sizes tried, docs/benchmarks.md)
JS_LOGITS = 1 << 19


def _finish(lm, plan: Plan, hidden_of, t0: float, stats: dict, dtype: torch.dtype,
            attn: list[dict[str, np.ndarray]] | None = None, dec: Decoder | None = None,
            tick: Callable[[int], None] | None = None, fused: bool = False) -> ReplayResult:
    """The JS distances and log-probabilities from final hidden states ``hidden_of(i, variant) -> (T, H)``, in
    vocab-bounded chunks (ρ comes after, from the measure: :func:`_complete`).

    Per chunk of a response's tokens, one matrix product projects every variant onto the vocabulary (in
    ``dtype``).  Below float32 it projects P_all's states and the differences h(P_\\k) − h(P_all)
    (logits_k = logits_all + W·(h_k − h_all)): both distributions then share the rounding of logits_all, and
    their difference is as exact as the hidden states allow. ``dec``: the replay's Decoder, which keeps the head's
    cast, transposed copy where it keeps its weights (a frozen model's). ``tick(rows)`` after each chunk: the
    (1 + K′) · n rows of its n tokens are done (progress). ``fused``: the element-wise chain compiled
    (:func:`mrtpo.replay.vocab.fused_chain`), else eager.

    Long: the replay's hot kernel (``bench/replay.py``: the vocabulary products and the element-wise JS chain are
    most of a replay); the reused logits buffer, the chunk sizes and the per-response accumulators are shared by its
    nested loops, kept together so that what stays in cache is visible in one place."""
    head = lm.model.get_output_embeddings()

    def head_t() -> torch.Tensor:  # (H, V); a head tied to the embeddings transposes the decoder's cast copy
        return (dec.weight(head.weight) if dec is not None else head.weight.detach().to(dtype)).t().contiguous()

    Wt = dec.memo("head_t", head_t) if dec is not None else head_t()
    bias = getattr(head, "bias", None)
    bias = None if bias is None else bias.detach().float()
    cap = final_softcap(lm.model.config)  # Gemma 2's tanh(z / c) · c, as the model's own logits
    exact = dtype == torch.float32
    others = plan.variants[1:]  # every P_\\k, then every P_k′
    chunk = max(1, stats.pop("logits_budget") // (Wt.shape[1] * (1 + len(others))))
    rows_max = min(chunk, max((len(r) for r in plan.resp_ids), default=1)) * (1 + len(others))
    zbuf = torch.empty((rows_max, Wt.shape[1]), dtype=dtype, device=Wt.device)  # reused: fresh blocks page-fault
    # tokens per call of the element-wise chain: eager, a few at a time (its temporaries stay in the CPU's cache; over
    # the whole chunk they stream through memory ~15 times); compiled, the whole chunk (it has no temporaries)
    sub = chunk if fused else max(1, JS_LOGITS // (Wt.shape[1] * (1 + len(others))))
    step = fused_chain if fused else chain
    out = []
    for i, rid in enumerate(plan.resp_ids):
        T = len(rid)
        D = torch.zeros(len(others), T)  # d of every variant against P_all
        LQ = torch.zeros(len(others), T)  # log q(y_t) of every variant
        ids = torch.tensor(rid, dtype=torch.long, device=Wt.device).unsqueeze(1)  # (T, 1) the sampled tokens
        lp_all = torch.zeros(T)
        for s in range(0, T, chunk):
            h_all = hidden_of(i, ALL)[s : s + chunk]  # (n, H)
            n = h_all.shape[0]
            # variants whose state equals P_all's here (an empty item) have d = 0 and are not projected
            todo = [j for j, k in enumerate(others) if not torch.equal(hidden_of(i, k)[s : s + chunk], h_all)]
            rows = [h_all] + [hidden_of(i, others[j])[s : s + chunk] if exact else
                              hidden_of(i, others[j])[s : s + chunk].float() - h_all.float() for j in todo]
            m = (1 + len(todo)) * n
            z = torch.matmul(torch.cat(rows).to(dtype), Wt, out=zbuf[:m]).view(1 + len(todo), n, -1)
            at = torch.tensor(todo, dtype=torch.long)
            for u in range(0, n, sub):  # (1 + |todo|, n', V) logits at a time, every variant at once
                a, b = s + u, s + min(u + sub, n)
                y = ids[a:b]  # (n', 1)
                if not todo:
                    lp_all[a:b] = logprobs(z[0, u : u + sub].float(), bias, cap).gather(1, y)[:, 0].cpu()
                    continue
                lp_y, d, lq_y = step(z[:, u : u + sub], y, exact, bias, cap)  # (n',), (|todo|, n'), (|todo|, n')
                lp_all[a:b], D[at, a:b], LQ[at, a:b] = lp_y.cpu(), d.cpu(), lq_y.cpu()
            for j in set(range(len(others))) - set(todo):  # not projected: the variant's distribution is P_all's
                LQ[j, s : s + n] = lp_all[s : s + n]
            if tick is not None:
                tick(n * (1 + len(others)))
        js = dict(zip(others, D))
        lp_k = {k: LQ[j] for j, k in enumerate(others) if k in plan.rewards}
        rr = ResponseRelevance(
            text=plan.texts[i], token_ids=rid, offsets=plan.offsets[i],
            js={k: js[k].numpy() for k in plan.rewards}, relevance=dict.fromkeys(plan.rewards),
            skipped=list(plan.skipped), logp_all=lp_all.numpy(), logp_without={k: v.numpy() for k, v in lp_k.items()},
            measure="", js_reworded={k: torch.stack([js[v] for v in vs]).numpy() for k, vs in plan.reworded.items()
                                     if vs},
            attn=attn[i] if attn is not None else {})
        out.append(rr)
    return ReplayResult(responses=out, prompts=plan.prompt_texts, rewards=plan.rewards, skipped=plan.skipped,
                        seconds=time.perf_counter() - t0, **stats)


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
        up to the rounding of other batches; its ``forward_tokens`` / ``forward_passes`` are those of the joint
        replay, its ``seconds`` run from the joint replay's start to this group's result. The joint replay's forward
        tokens and own seconds are recorded as a run of this machine's replay rate (:func:`mrtpo.model.rates.measuring`;
        not when P_all's attention is read: its passes are not counted).
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
    attach_context(res, group.input.responses, group.names, group.rewards)
    if need.entropy:
        res = with_entropy(lm, res, group.sampling_prompt, cfg.temperature, cfg.precision)
    return res.measured(measure, group.evidence)


def _replayed(lm: LoadedModel, groups: Sequence[GroupInput], template: Template | None, cfg: ReplayConfig,
              need: Needs, progress: Callable[[float, float], None] | None) -> list[ReplayResult]:
    """The K + 1 passes of every group through one trie, then the vocabulary side (:func:`_finish`)."""
    check_model(lm.model, lm.tokenizer, lm.name)  # a model it cannot run is refused before any work
    keep_freed_memory()  # the vocabulary chain's temporaries reuse warm pages (mrtpo.model.heap)
    dtype = compute_dtype(lm, cfg.precision)
    with measuring(lm, dtype, "replay") as run:
        plans = [plan_group(lm, g.prompt, g.verifier_info, g.responses, template, g.rewards, need.rewording)
                 for g in groups]
        V = lm.model.get_output_embeddings().weight.shape[0]
        fused = use_fused(cfg.fused, lm.device, V * sum(len(r) * len(p.variants) for p in plans for r in p.resp_ids))
        keys, seqs, want = sequences(plans)
        pad = lm.tokenizer.pad_token_id
        dec = Decoder(decoder_stack(lm.model), dtype, keep=lm.frozen)
        on_pass, tick = replay_progress(lm, plans, progress)
        states, trie, passes = shared_hidden(
            dec, 0 if pad is None else pad, lm.device, seqs, want,
            cfg.token_budget, cfg.kv_budget, share=cfg.share_prefix, own=llama_step(dec), progress=on_pass)
        hidden = dict(zip(keys, states))
        t_attn = time.perf_counter()
        attn = [_info_attention(lm, plan, dec) if need.attention else None for plan in plans]
        t_attn = time.perf_counter() - t_attn if need.attention else 0.0
        extra = sum(1 + sum(len(r) > 0 for r in plan.resp_ids) for plan in plans) if need.attention else 0
        out = []
        for g, plan in enumerate(plans):
            paths = [trie.paths[n] for n, key in enumerate(keys) if key[0] == g]
            stats = {"prefix_tokens": _common_prefix(trie, paths), "forward_tokens": passes.forward_tokens,
                     "forward_passes": passes.forward_passes + extra, "logits_budget": cfg.logits_budget}
            res = _finish(lm, plan, lambda i, v, g=g: hidden[(g, i, v)], run.t0, stats, dtype, attn[g], dec,
                          tick, fused)
            res.attention_seconds = t_attn
            out.append(res)
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
    stats = {"prefix_tokens": 0, "forward_tokens": 0, "forward_passes": 0, "logits_budget": 1 << 62}
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
    attn = [_info_attention(lm, plan, Decoder(backbone, lm.dtype))] if need.attention else [None]
    res = _finish(lm, plan, lambda i, v: hidden[(i, v)], t0, stats, lm.dtype, attn[0])
    group = _Group.of(GroupInput(prompt, verifier_info, responses, rewards), True)
    return _complete(lm, res, group, need, measure, ReplayConfig(precision="model"))
