"""The leave-one-out replay (METHOD.md steps 1-3): teacher-force each response under P_all and every P_\\k.

For reward k the policy teacher-forces its own response y under P_all (the task prompt with every reward's
verifier information) and under P_\\k (the same with v_k left out); d_kt = JS(p_t, q_t) (:mod:`mrtpo.core.js`)
and ρ_kt from the chosen measure (:mod:`mrtpo.core.measures`).

:func:`replay_group` does this for a whole group at once:

- **prefix shared**: the token prefix common to every variant prompt (system prompt + task prompt) runs once;
  its KV cache is reused by every (variant, response) pair (:mod:`mrtpo.replay.kvtrie`);
- **batched**: pairs are sorted by length and packed into right-padded forward passes under a token budget;
- **memory-bounded**: the forward passes keep only final hidden states of response positions (T, H); the
  vocabulary projection, log-softmax and JS run in token chunks, so no (variants × responses × T × V) tensor
  ever exists and a 150k vocabulary works;
- rewards with no variance in the group are skipped when rewards are given (their advantage is 0 anyway).

:func:`naive_replay_group` is the one-sequence-at-a-time reference (full prompt, no cache, full logits).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np
import torch

from mrtpo.core.advantages import active_rewards
from mrtpo.core.measures import ORACLE, measure_relevance, needs_attention, needs_replay, needs_rewording
from mrtpo.errors import MrtpoError
from mrtpo.model import Decoder, LoadedModel, Sample, check_length, compute_dtype, decoder_stack
from mrtpo.model.arch import check_model, final_softcap
from mrtpo.model.defaults import TEMPERATURE
from mrtpo.model.heap import keep_freed_memory
from mrtpo.model.llama_step import llama_step
from mrtpo.model.rates import measuring
from mrtpo.replay.attention import info_attention, info_span
from mrtpo.replay.kvtrie import shared_hidden
from mrtpo.replay.noreplay import attach_context, replay_free
from mrtpo.replay.noreplay import response_tokens as _response_tokens
from mrtpo.replay.noreplay import text_and_offsets as _text_and_offsets
from mrtpo.replay.passes import replay_progress, sequences
from mrtpo.replay.results import ReplayResult, ResponseRelevance
from mrtpo.replay.vocab import chain, fused_chain, logprobs, use_fused
from mrtpo.templates import ALL, REWORDINGS, Template, TemplateError, reworded_key, variant_label

if TYPE_CHECKING:
    from mrtpo.groups import ScoredGroup


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


@dataclass
class _Plan:
    """Everything both replays need: per response, the token ids of every variant prompt and of the response."""

    texts: list[str]
    resp_ids: list[list[int]]
    offsets: list[list[tuple[int, int]]]
    prompt_texts: list[dict[str, str]]
    prompt_ids: list[dict[str, list[int]]]
    rewards: list[str]
    skipped: list[str]
    reworded: dict[str, list[str]]  # reward -> the variant keys of its rewordings (P_k′; empty without rewording)

    @property
    def variants(self) -> list[str]:
        """Every prompt variant's key: P_all, each P_\\k, each P_k′."""
        return [ALL] + self.rewards + [v for vs in self.reworded.values() for v in vs]


def _plan(lm, prompt, verifier_info, responses, template, rewards, reword: bool = False, offsets: bool = True) -> _Plan:
    template = template or Template()
    G = len(responses)
    infos = list(verifier_info) if isinstance(verifier_info, (list, tuple)) else [verifier_info] * G
    if len(infos) != G:
        raise ValueError(f"verifier_info has {len(infos)} entries for {G} responses")
    names = list(infos[0]) if infos else []
    act, skip = active_rewards(names, rewards)
    texts, ids, offs, ptexts, pids = [], [], [], [], []
    enc_cache: dict[str, list[int]] = {}
    for i, (r, info) in enumerate(zip(responses, infos)):
        text, rid, off = _response_tokens(lm, r)
        try:  # each message's length is checked before it is built (at most MAX_FILLED_CHARS characters) ...
            msgs = template.variants(prompt, info, act, reworded=reword)
        except TemplateError as e:
            raise TemplateError(f"the prompts for response {i}: {e}") from None
        full = {v: lm.chat_prompt(m) for v, m in msgs.items()}
        toks = {}
        for v, t in full.items():
            if t not in enc_cache:
                enc_cache[t] = lm.encode(t)
            toks[v] = enc_cache[t]
            # ... and in tokens against the model's context here, before any forward pass (P_all, the longest, first)
            check_length(lm, len(toks[v]) + len(rid), f"{variant_label(v, act)} + response {i}", response=i)
        texts.append(text), ids.append(rid), offs.append(off), ptexts.append(full), pids.append(toks)
    for i, (text, rid, off) in enumerate(zip(texts, ids, offs)):  # every length checked: the offsets now
        if offsets:  # (an estimate needs only the token ids)
            texts[i], offs[i] = _text_and_offsets(lm, text, rid, off)
    reworded = {k: [reworded_key(k, j) for j in range(len(REWORDINGS))] if reword else [] for k in act}
    return _Plan(texts, ids, offs, ptexts, pids, act, skip, reworded)


def _finish(lm, plan: _Plan, hidden_of, t0: float, stats: dict, dtype: torch.dtype, measure: str = "js",
            attn: list[dict[str, np.ndarray]] | None = None, dec: Decoder | None = None,
            tick: Callable[[int], None] | None = None, fused: bool = False) -> ReplayResult:
    """JS + normalization from final hidden states ``hidden_of(i, variant) -> (T, H)``, in vocab-bounded chunks.

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
            js={k: js[k].numpy() for k in plan.rewards}, relevance={}, skipped=list(plan.skipped),
            logp_all=lp_all.numpy(), logp_without={k: v.numpy() for k, v in lp_k.items()}, measure=measure,
            js_reworded={k: torch.stack([js[v] for v in vs]).numpy() for k, vs in plan.reworded.items() if vs},
            attn=attn[i] if attn is not None else {})
        rr.relevance = {k: measure_relevance(measure, rr.measure_input(k)) for k in plan.rewards}
        out.append(rr)
    return ReplayResult(responses=out, prompts=plan.prompt_texts, rewards=plan.rewards, skipped=plan.skipped,
                        seconds=time.perf_counter() - t0, **stats)


class GroupInput(NamedTuple):
    """One group to replay: what :func:`replay_group` takes (see there)."""

    prompt: str
    verifier_info: dict[str, str] | Sequence[dict[str, str]]
    responses: Sequence[Response]
    rewards: np.ndarray | torch.Tensor | None = None
    sampling_prompt: str | None = None  # the prompt x the responses were sampled under (entropy); None: ``prompt``


def replay_group(
    lm: LoadedModel,
    prompt: str,
    verifier_info: dict[str, str] | Sequence[dict[str, str]],
    responses: Sequence[Response],
    template: Template | None = None,
    rewards: np.ndarray | torch.Tensor | None = None,
    config: ReplayConfig | None = None,
    measure: str = "js",
    reword: bool | None = None,
    attention: bool | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> ReplayResult:
    """Batched leave-one-out replay of one group, with KV reuse across variants.

    prompt:        the task prompt x (user message the responses were sampled under).
    verifier_info: {reward: text}, shared by the group, or one such dict per response (v_k(x, y)).
    responses:     G responses, as text (tokenized with offsets) or sampled token ids / Samples.
    rewards:       optional (G, K) rewards in verifier_info's key order; constant columns are skipped.
    measure:       the relevance measure (:data:`MEASURES`; default ``"js"``, the paper's); ``ktae`` and ``entropy``
                   run no replay (:func:`mrtpo.replay.noreplay.replay_free`).
    reword:        also replay P_k′ (v_k reworded, R = len(REWORDINGS) per reward) for ``js-reworded``; default:
                   when ``measure`` needs it.
    attention:     also read P_all's attention to each v_k (:mod:`mrtpo.replay.attention`: one more pass of the
                   responses under P_all) for ``attn-contrast``; default: when ``measure`` needs it.
    progress:      ``progress(done, total)`` after each forward pass and each chunk of the vocabulary side, in
                   forward tokens (a vocabulary row counts :func:`mrtpo.model.rates.head_share` of one); ``done``
                   grows to ``total``. What it raises stops the replay there (a Cancel). None: no calls, the same
                   numbers.
    Returns per-response tokens, JS distances d (T,) and relevance ρ (T,) for every replayed reward.

    The (1 + K') × G sequences P_all + y_i, P_\\k + y_i go through :func:`mrtpo.replay.kvtrie.shared_hidden`: a trie of
    their tokens, each shared prefix (the task prompt, the items before the one left out, response-independent
    verifier text) computed once and reused as KV cache, the rest in padded batches under the token budgets.
    """
    return replay_groups(lm, [GroupInput(prompt, verifier_info, responses, rewards)], template, config, measure,
                         reword, attention, progress)[0]


@torch.no_grad()
def replay_groups(
    lm: LoadedModel,
    groups: Sequence[GroupInput],
    template: Template | None = None,
    config: ReplayConfig | None = None,
    measure: str = "js",
    reword: bool | None = None,
    attention: bool | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> list[ReplayResult]:
    """:func:`replay_group` for several groups at once (a training step's): the sequences of every group go through
    one trie, so the passes are fewer and larger (on a CPU a small pass costs mostly the reading of the weights).
    Each result is what :func:`replay_group` gives for its group, up to the rounding of other batches; its
    ``forward_tokens`` / ``forward_passes`` are those of the joint replay, its ``seconds`` run from the joint replay's
    start to this group's result. The joint replay's forward tokens and own seconds are recorded as a run of this
    machine's replay rate (:func:`mrtpo.model.rates.measuring`; not when P_all's attention is read: its passes are not
    counted)."""
    cfg = config or ReplayConfig()
    if measure == ORACLE:  # before any model work, as an unknown name
        raise MrtpoError(f"the '{measure}' measure reads each checker's evidence, not a replay: give the scored group "
                         "(replay_scored) or its evidence (ReplayResult.with_measure)")
    if not groups:
        return []
    if not needs_replay(measure):  # ktae, entropy: no K + 1 passes (mrtpo.replay.noreplay)
        return [replay_free(lm, g.prompt, g.verifier_info, g.responses, g.rewards, measure, g.sampling_prompt,
                            cfg.temperature, precision=cfg.precision) for g in groups]
    check_model(lm.model, lm.tokenizer, lm.name)  # a model it cannot run is refused before any work
    keep_freed_memory()  # the vocabulary chain's temporaries reuse warm pages (mrtpo.model.heap)
    dtype = compute_dtype(lm, cfg.precision)
    with measuring(lm, dtype, "replay") as run:
        plans = [_plan(lm, g.prompt, g.verifier_info, g.responses, template, g.rewards,
                       needs_rewording(measure) if reword is None else reword) for g in groups]
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
        read_attention = needs_attention(measure) if attention is None else attention
        t_attn = time.perf_counter()
        attn = [_info_attention(lm, plan, dec) if read_attention else None for plan in plans]
        t_attn = time.perf_counter() - t_attn if read_attention else 0.0
        extra = sum(1 + sum(len(r) > 0 for r in plan.resp_ids) for plan in plans) if read_attention else 0
        out = []
        for g, plan in enumerate(plans):
            paths = [trie.paths[n] for n, key in enumerate(keys) if key[0] == g]
            stats = {"prefix_tokens": _common_prefix(trie, paths), "forward_tokens": passes.forward_tokens,
                     "forward_passes": passes.forward_passes + extra, "logits_budget": cfg.logits_budget}
            res = _finish(lm, plan, lambda i, v, g=g: hidden[(g, i, v)], run.t0, stats, dtype, measure, attn[g], dec,
                          tick, fused)
            res.attention_seconds = t_attn
            out.append(attach_context(res, groups[g].responses, _names(groups[g].verifier_info), groups[g].rewards))
        if not read_attention:  # (P_all's attention passes are not counted in the forward tokens)
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


def _info_attention(lm: LoadedModel, plan: _Plan, dec: Decoder) -> list[dict[str, np.ndarray]]:
    """Per response, {reward: a_kt (T,)}: P_all's attention from y_t to v_k's tokens (those P_\\k lacks)."""
    prompts = [p[ALL] for p in plan.prompt_ids]
    spans = [{k: info_span(p[ALL], p[k]) for k in plan.rewards} for p in plan.prompt_ids]
    return info_attention(dec, prompts, spans, plan.resp_ids, lm.device)


@torch.no_grad()
def naive_replay_group(
    lm: LoadedModel,
    prompt: str,
    verifier_info: dict[str, str] | Sequence[dict[str, str]],
    responses: Sequence[Response],
    template: Template | None = None,
    rewards: np.ndarray | torch.Tensor | None = None,
    measure: str = "js",
    reword: bool | None = None,
    attention: bool | None = None,
) -> ReplayResult:
    """Reference replay: every (variant, response) sequence alone, full prompt, full logits, no cache (P_all's
    attention, where read, as in :func:`replay_group`)."""
    check_model(lm.model, lm.tokenizer, lm.name)
    t0 = time.perf_counter()
    plan = _plan(lm, prompt, verifier_info, responses, template, rewards,
                 needs_rewording(measure) if reword is None else reword)
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
    attn = None
    if needs_attention(measure) if attention is None else attention:
        attn = _info_attention(lm, plan, Decoder(backbone, lm.dtype))
    return _finish(lm, plan, lambda i, v: hidden[(i, v)], t0, stats, lm.dtype, measure, attn)


def replay_scored(lm: LoadedModel, group: ScoredGroup, template: Template, skip_constant: bool = True,
                  config: ReplayConfig | None = None, measure: str = "js", reword: bool | None = None,
                  attention: bool | None = None, progress: Callable[[float, float], None] | None = None
                  ) -> ReplayResult:
    """Replay a scored group; rewards constant in the group are skipped when ``skip_constant``; relevance from the
    measure named ``measure`` (:data:`mrtpo.core.measures.MEASURES`; the oracle reads the group's evidence, after a
    replay that gives the tokens and the JS distances shown beside it); ``progress`` as :func:`replay_group`."""
    return replay_scored_groups(lm, [group], template, skip_constant, config, measure, reword, attention, progress)[0]


def replay_scored_groups(lm: LoadedModel, groups: Sequence[ScoredGroup], template: Template,
                         skip_constant: bool = True, config: ReplayConfig | None = None, measure: str = "js",
                         reword: bool | None = None, attention: bool | None = None,
                         progress: Callable[[float, float], None] | None = None) -> list[ReplayResult]:
    """:func:`replay_scored` for several scored groups through one joint replay (:func:`replay_groups`; none for
    ``ktae`` and ``entropy``, which read the group's rewards and the sampler's entropies under the example's prompt)."""
    if measure != ORACLE and not needs_replay(measure):
        c = config or ReplayConfig()
        return [replay_free(lm, g.prompt, g.verifier_info, g.samples, g.rewards, measure, g.example.prompt,
                            c.temperature, skip_constant, c.precision) for g in groups]
    replay_with = "js" if measure == ORACLE else measure
    inputs = [GroupInput(g.prompt, g.verifier_info, g.samples, g.rewards if skip_constant else None) for g in groups]
    reps = [attach_context(rep, g.samples, g.reward_names, g.rewards)
            for rep, g in zip(replay_groups(lm, inputs, template, config, replay_with, reword, attention, progress),
                              groups)]
    return [rep if replay_with == measure else rep.with_measure(measure, g.evidence or None)
            for rep, g in zip(reps, groups)]
