"""Leave-one-out replay and per-token relevance (METHOD.md steps 1-3).

For reward k the policy teacher-forces its own response y under P_all (the task prompt with every reward's
verifier information) and under P_\\k (the same with v_k left out). With p_t = π(·|P_all, y<t) and
q_t = π(·|P_\\k, y<t):

    d_kt = JS(p_t, q_t) = sqrt(½ KL(p_t‖m_t) + ½ KL(q_t‖m_t)),   m_t = ½(p_t + q_t),  natural log,
    ρ_kt = T · d_kt / Σ_t d_kt        (mean 1 over the response; ρ = 1 when Σ_t d = 0).

:func:`replay_group` does this for a whole group at once:

- **prefix shared**: the token prefix common to every variant prompt (system prompt + task prompt) runs once;
  its KV cache is reused by every (variant, response) pair;
- **batched**: pairs are sorted by length and packed into right-padded forward passes under a token budget;
- **memory-bounded**: the forward passes keep only final hidden states of response positions (T, H); the
  vocabulary projection, log-softmax and JS run in token chunks, so no (variants × responses × T × V) tensor
  ever exists and a 150k vocabulary works;
- rewards with no variance in the group are skipped when rewards are given (their advantage is 0 anyway).

:func:`naive_replay_group` is the one-sequence-at-a-time reference (full prompt, no cache, full logits).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel, Sample, check_length, decode, token_offsets, tokenize_response
from mrtpo.templates import ALL, Template

LN2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------- pure math
def js_distance(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon distance between distributions given as log-probabilities.

    logp, logq: (..., V) log-probabilities (e.g. log_softmax outputs).  Returns (...).
    d = sqrt(½ Σ p (log p − log m) + ½ Σ q (log q − log m)),  log m = logaddexp(log p, log q) − ln 2.
    Natural log, so d ∈ [0, sqrt(ln 2)]; equals ``scipy.spatial.distance.jensenshannon(p, q)``.
    """
    logp, logq = logp.float(), logq.float()
    logm = torch.logaddexp(logp, logq).sub_(LN2)
    total = None
    for lx in (logp, logq):  # Σ x (log x − log m), one temporary at a time; 0 · (−inf) → 0
        t = (lx - logm).mul_(lx.exp()).nan_to_num_(nan=0.0).sum(-1)
        total = t if total is None else total.add_(t)
    return total.mul_(0.5).clamp_min_(0.0).sqrt_()


def normalize_relevance(d: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """ρ_t = T · d_t / Σ_t d_t over valid tokens (mean 1); ρ = 1 where Σ_t d = 0.

    d: (..., T) distances; mask: (..., T) bool of valid tokens (default all).  Returns (..., T), 0 on padding.
    """
    d = d.float()
    mask = torch.ones_like(d, dtype=torch.bool) if mask is None else mask.bool()
    d = torch.where(mask, d, torch.zeros_like(d))
    total = d.sum(-1, keepdim=True)
    n = mask.sum(-1, keepdim=True).float()
    rho = torch.where(total > 0, n * d / total.clamp_min(1e-30), torch.ones_like(d))
    return torch.where(mask, rho, torch.zeros_like(rho))


# ---------------------------------------------------------------------------------------------- results
@dataclass
class ResponseRelevance:
    """Relevance of one response: tokens with character offsets, raw JS distances, normalized relevance."""

    text: str
    token_ids: list[int]
    offsets: list[tuple[int, int]]
    js: dict[str, np.ndarray]  # reward -> (T,)
    relevance: dict[str, np.ndarray]  # reward -> (T,), mean 1
    skipped: list[str] = field(default_factory=list)  # rewards with no variance in the group

    def tokens(self) -> list[dict]:
        return [{"text": self.text[s:e], "start": s, "end": e} for s, e in self.offsets]

    def to_json(self) -> dict:
        return {
            "tokens": self.tokens(),
            "js": {k: [round(float(x), 6) for x in v] for k, v in self.js.items()},
            "relevance": {k: [round(float(x), 6) for x in v] for k, v in self.relevance.items()},
            "skipped": list(self.skipped),
        }


@dataclass
class ReplayResult:
    responses: list[ResponseRelevance]
    prompts: list[dict[str, str]]  # per response: {"__all__": P_all text, reward: P_\k text} as the model sees them
    rewards: list[str]  # rewards replayed
    skipped: list[str]
    prefix_tokens: int = 0
    forward_tokens: int = 0  # tokens run through the model (prefix once + every padded batch)
    forward_passes: int = 0
    seconds: float = 0.0


@dataclass
class ReplayConfig:
    token_budget: int = 1024  # max batch × padded length per forward pass (small batches pad less)
    logits_budget: int = 1 << 22  # max tokens × vocab elements per log-softmax chunk (16 MiB in float32)
    share_prefix: bool = True
    # "auto": the decoder runs in bfloat16 autocast on a CPU with AMX / AVX512-BF16 (as a GPU run does; about
    # 2.3x faster), else in the model's dtype; "model": always the model's dtype (exact; what tests compare).
    # The vocabulary projection, log-softmax and JS always run in float32.
    precision: str = "auto"


def _fast_bf16_cpu() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def _autocast(lm: LoadedModel, precision: str):
    """Context manager for the decoder passes of the replay."""
    import contextlib

    if precision not in ("auto", "model"):
        raise MrtpoError(f"replay precision must be 'auto' or 'model', not {precision!r}")
    if precision == "auto" and lm.device.type == "cpu" and lm.dtype == torch.float32 and _fast_bf16_cpu():
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------- inputs
Response = str | Sample | Sequence[int]


def _response_tokens(lm: LoadedModel, r: Response) -> tuple[str, list[int], list[tuple[int, int]]]:
    if isinstance(r, str):
        ids, offs = tokenize_response(lm, r)
        return r, ids, offs
    ids = list(r.token_ids) if isinstance(r, Sample) else [int(t) for t in r]
    return decode(lm, ids), ids, token_offsets(lm, ids)


def active_rewards(names: list[str], rewards: np.ndarray | torch.Tensor | None) -> tuple[list[str], list[str]]:
    """Split reward names into (replayed, skipped): a reward is skipped when its group column is constant.

    rewards: (G, K) in the order of ``names``, NaN for "not scored"; None replays every reward.
    """
    if rewards is None:
        return list(names), []
    r = np.asarray(rewards, dtype=float).reshape(-1, len(names))
    act, skip = [], []
    for j, k in enumerate(names):
        col = r[:, j][~np.isnan(r[:, j])]
        (act if col.size > 1 and np.ptp(col) > 0 else skip).append(k)
    return act, skip


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


def _plan(lm, prompt, verifier_info, responses, template, rewards) -> _Plan:
    template = template or Template()
    G = len(responses)
    infos = list(verifier_info) if isinstance(verifier_info, (list, tuple)) else [verifier_info] * G
    if len(infos) != G:
        raise ValueError(f"verifier_info has {len(infos)} entries for {G} responses")
    names = list(infos[0]) if infos else []
    act, skip = active_rewards(names, rewards)
    texts, ids, offs, ptexts, pids = [], [], [], [], []
    enc_cache: dict[str, list[int]] = {}
    for r, info in zip(responses, infos):
        text, rid, off = _response_tokens(lm, r)
        msgs = template.variants(prompt, info, act)
        full = {v: lm.chat_prompt(m) for v, m in msgs.items()}
        toks = {}
        for v, t in full.items():
            if t not in enc_cache:
                enc_cache[t] = lm.encode(t)
            toks[v] = enc_cache[t]
            check_length(lm, len(toks[v]) + len(rid), f"prompt variant '{v}' + response")
        texts.append(text), ids.append(rid), offs.append(off), ptexts.append(full), pids.append(toks)
    return _Plan(texts, ids, offs, ptexts, pids, act, skip)


def _finish(lm, plan: _Plan, hidden_of, t0: float, stats: dict) -> ReplayResult:
    """JS + normalization from final hidden states ``hidden_of(i, variant) -> (T, H)``, in vocab-bounded chunks."""
    head = lm.model.get_output_embeddings()
    cap = getattr(lm.model.config, "final_logit_softcapping", None)
    vocab = head.weight.shape[0]
    chunk = max(1, stats.pop("logits_budget") // vocab)

    def logprobs(h: torch.Tensor) -> torch.Tensor:
        logits = head(h.to(head.weight.dtype)).float()
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return torch.log_softmax(logits, dim=-1)

    out = []
    for i, rid in enumerate(plan.resp_ids):
        T = len(rid)
        js = {k: torch.zeros(T) for k in plan.rewards}
        for s in range(0, T, chunk):
            lp = logprobs(hidden_of(i, ALL)[s : s + chunk])
            for k in plan.rewards:
                js[k][s : s + chunk] = js_distance(lp, logprobs(hidden_of(i, k)[s : s + chunk])).cpu()
        rel = {k: normalize_relevance(v) for k, v in js.items()}
        out.append(ResponseRelevance(
            text=plan.texts[i], token_ids=rid, offsets=plan.offsets[i],
            js={k: v.numpy() for k, v in js.items()}, relevance={k: v.numpy() for k, v in rel.items()},
            skipped=list(plan.skipped),
        ))
    return ReplayResult(responses=out, prompts=plan.prompt_texts, rewards=plan.rewards, skipped=plan.skipped,
                        seconds=time.perf_counter() - t0, **stats)


def _backbone(model):
    """The decoder stack (final norm included) under a causal-LM head; works through peft wrappers."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


# ---------------------------------------------------------------------------------------------- replays
@torch.no_grad()
def replay_group(
    lm: LoadedModel,
    prompt: str,
    verifier_info: dict[str, str] | Sequence[dict[str, str]],
    responses: Sequence[Response],
    template: Template | None = None,
    rewards: np.ndarray | torch.Tensor | None = None,
    config: ReplayConfig | None = None,
) -> ReplayResult:
    """Batched, prefix-shared leave-one-out replay of one group.

    prompt:        the task prompt x (user message the responses were sampled under).
    verifier_info: {reward: text}, shared by the group, or one such dict per response (v_k(x, y)).
    responses:     G responses, as text (tokenized with offsets) or sampled token ids / Samples.
    rewards:       optional (G, K) rewards in verifier_info's key order; constant columns are skipped.
    Returns per-response tokens, JS distances d (T,) and relevance ρ (T,) for every replayed reward.
    """
    cfg = config or ReplayConfig()
    t0 = time.perf_counter()
    plan = _plan(lm, prompt, verifier_info, responses, template, rewards)
    variants = [ALL] + plan.rewards
    pairs = [(i, v) for i in range(len(plan.resp_ids)) for v in variants]
    all_prompts = [plan.prompt_ids[i][v] for i, v in pairs]
    P = _common_prefix_len(all_prompts) if cfg.share_prefix else 0
    P = min(P, min(len(p) for p in all_prompts) - 1)  # every pair keeps >= 1 prompt token of its own
    backbone = _backbone(lm.model)
    stats = {"prefix_tokens": P, "forward_tokens": P, "forward_passes": 0, "logits_budget": cfg.logits_budget}

    with _autocast(lm, cfg.precision):
        hidden = _batched_hidden(lm, backbone, plan, pairs, all_prompts, P, cfg, stats)
    return _finish(lm, plan, lambda i, v: hidden[(i, v)], t0, stats)


def _batched_hidden(lm, backbone, plan, pairs, all_prompts, P, cfg, stats) -> dict:
    """Final hidden states (T, H) of every (response, variant) pair: prefix once, then padded batches."""
    dev = lm.device
    prefix_cache = None
    if P > 0:
        ids = torch.tensor([all_prompts[0][:P]], device=dev)
        out = backbone(input_ids=ids, use_cache=True)
        prefix_cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        stats["forward_passes"] += 1

    # (suffix + response) per pair; the hidden state predicting response token t sits at index S - 1 + t.
    seqs = [(all_prompts[n][P:], plan.resp_ids[i]) for n, (i, _) in enumerate(pairs)]
    order = sorted(range(len(pairs)), key=lambda n: len(seqs[n][0]) + len(seqs[n][1]))
    hidden: dict[tuple[int, str], torch.Tensor] = {}
    pad = lm.tokenizer.pad_token_id
    start = 0
    while start < len(order):
        # grow the batch while batch × longest stays within the token budget (sorted: last is longest)
        end = start + 1
        while end < len(order) and (end + 1 - start) * _len(seqs[order[end]]) <= cfg.token_budget:
            end += 1
        batch = order[start:end]
        L = _len(seqs[batch[-1]])
        b = len(batch)
        input_ids = torch.full((b, L), pad, dtype=torch.long)
        mask = torch.zeros((b, P + L), dtype=torch.long)
        mask[:, :P] = 1
        for row, n in enumerate(batch):
            s = seqs[n][0] + seqs[n][1]
            input_ids[row, : len(s)] = torch.tensor(s)
            mask[row, P : P + len(s)] = 1
        pos = (P + torch.arange(L)).unsqueeze(0).expand(b, L)
        kwargs = {}
        if prefix_cache is not None:
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(b)
            kwargs[_cache_kwarg(backbone)] = cache
        h = backbone(input_ids=input_ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                     use_cache=prefix_cache is not None, **kwargs).last_hidden_state
        for row, n in enumerate(batch):
            S, T = len(seqs[n][0]), len(seqs[n][1])
            hidden[pairs[n]] = h[row, S - 1 : S - 1 + T]
        stats["forward_tokens"] += b * L
        stats["forward_passes"] += 1
        start = end
    return hidden


@torch.no_grad()
def naive_replay_group(
    lm: LoadedModel,
    prompt: str,
    verifier_info: dict[str, str] | Sequence[dict[str, str]],
    responses: Sequence[Response],
    template: Template | None = None,
    rewards: np.ndarray | torch.Tensor | None = None,
) -> ReplayResult:
    """Reference replay: every (variant, response) sequence alone, full prompt, full logits, no cache."""
    t0 = time.perf_counter()
    plan = _plan(lm, prompt, verifier_info, responses, template, rewards)
    stats = {"prefix_tokens": 0, "forward_tokens": 0, "forward_passes": 0, "logits_budget": 1 << 62}
    backbone = _backbone(lm.model)
    hidden = {}
    for i, rid in enumerate(plan.resp_ids):
        for v in [ALL] + plan.rewards:
            p = plan.prompt_ids[i][v]
            ids = torch.tensor([p + rid], device=lm.device)
            h = backbone(input_ids=ids, use_cache=False).last_hidden_state[0]
            hidden[(i, v)] = h[len(p) - 1 : len(p) - 1 + len(rid)]
            stats["forward_tokens"] += ids.shape[1]
            stats["forward_passes"] += 1
    return _finish(lm, plan, lambda i, v: hidden[(i, v)], t0, stats)


def _cache_kwarg(backbone) -> str:
    """transformers >= 5.2x calls the KV-cache argument ``cache``; older versions ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"


def _len(seq: tuple[list[int], list[int]]) -> int:
    return len(seq[0]) + len(seq[1])


def _common_prefix_len(seqs: list[list[int]]) -> int:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        j = 0
        while j < n and s[j] == first[j]:
            j += 1
        n = j
    return n
