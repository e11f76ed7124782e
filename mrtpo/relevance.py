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

import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from mrtpo.errors import MrtpoError
from mrtpo.kvtrie import shared_hidden
from mrtpo.model import (
    Decoder,
    LoadedModel,
    Sample,
    check_length,
    compute_dtype,
    decode,
    decoder_stack,
    token_offsets,
    tokenize_response,
)
from mrtpo.templates import ALL, Template, TemplateError

LN2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------- pure math
def js_distance(logp: torch.Tensor, logq: torch.Tensor, p: torch.Tensor | None = None) -> torch.Tensor:
    """Jensen-Shannon distance between distributions given as log-probabilities.

    logp, logq: (..., V) log-probabilities (e.g. log_softmax outputs); p: optional exp(logp), to reuse it.
    Returns (...).  Per vocabulary entry, with a = |log q − log p| and m = ½(p + q):

        p log(p/m) + q log(q/m) = −min(p, q)·a − (p + q)·log1p(expm1(−a) / 2)     (symmetric in p, q)

    d = sqrt(½ Σ_v of that).  Every term is ≥ 0 and exactly 0 where p = q, so nothing cancels across the
    vocabulary: identical distributions give exactly 0 and close ones keep their relative accuracy.  A zero
    probability (log = −inf) contributes (p + q)·ln 2.  Natural log, so d ∈ [0, sqrt(ln 2)]; equals
    ``scipy.spatial.distance.jensenshannon(p, q)``.
    """
    logp, logq = logp.float(), logq.float()
    p = logp.exp() if p is None else p
    q = logq.exp()
    a = torch.sub(logq, logp).abs_()
    f = torch.neg(a).expm1_().mul_(0.5).log1p_()  # log(m / max(p, q)) ∈ [−ln 2, 0]
    s = torch.add(p, q)
    t = torch.minimum(p, q).mul_(a).add_(s.mul_(f))
    total = t.sum(-1).neg_()
    bad = ~torch.isfinite(total)
    if bad.any():  # zero probabilities (−inf log-probs): those terms are (p + q)·ln 2
        lp, lq = logp[bad], logq[bad]
        pp, qq = lp.exp(), lq.exp()
        aa = (lq - lp).abs()
        tt = -(torch.minimum(pp, qq) * aa + (pp + qq) * torch.log1p(torch.expm1(-aa) / 2))
        total[bad] = torch.where(torch.isfinite(tt), tt, (pp + qq) * LN2).sum(-1)
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


# ---------------------------------------------------------------------------------------------- measures
@dataclass
class MeasureInput:
    """What the replay gives a relevance measure, for one response and one reward k (arrays (T,), float32)."""

    js: np.ndarray  # d_kt: the JS distance between π(·|P_all, y<t) and π(·|P_\\k, y<t)
    logp_all: np.ndarray  # log π(y_t | P_all, y<t): the sampled token under P_all
    logp_without: np.ndarray  # log π(y_t | P_\\k, y<t): the sampled token under P_\\k
    offsets: Sequence[tuple[int, int]]  # each token's characters [start, end) in ``text``
    text: str
    js_others: np.ndarray | None = None  # (K', T): d of the other rewards replayed for this response (K' may be 0)


#: a relevance measure: MeasureInput -> (T,) scores ≥ 0; :func:`measure_relevance` normalizes them to ρ (mean 1)
Measure = Callable[[MeasureInput], np.ndarray]
MEASURES: dict[str, Measure] = {}
MEASURE_HELP: dict[str, str] = {}


def register_measure(name: str, help: str):
    """Decorator: add a measure to :data:`MEASURES` under ``name`` (the CLI, app, trainer and TRL take the name)."""
    def add(fn: Measure) -> Measure:
        MEASURES[name], MEASURE_HELP[name] = fn, help
        return fn
    return add


def measure_names() -> list[str]:
    return list(MEASURES)


def get_measure(name: str) -> Measure:
    """The measure called ``name``; an MrtpoError naming the choices for an unknown one."""
    if name not in MEASURES:
        raise MrtpoError(f"unknown relevance measure {name!r}; choose one of: {', '.join(MEASURES)}")
    return MEASURES[name]


def measure_relevance(name: str, inp: MeasureInput) -> np.ndarray:
    """ρ (T,) float32 of measure ``name``: its scores normalized by :func:`normalize_relevance` (mean 1)."""
    scores = np.asarray(get_measure(name)(inp), dtype=np.float32)
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


def relevance_tensor(relevance: Sequence[Mapping[str, Sequence[float]]], reward_names: Sequence[str],
                     lengths: Sequence[int], T: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-response relevance {reward: (T_i,)} as the (N, K, T) ρ tensor and the (N, T) mask of valid tokens.

    relevance: N dicts (a reward a response lacks, e.g. one not replayed because it is constant in its group, is
    uniform: ρ = 1); reward_names: the K columns; lengths: T_i per response; T: padded length (default max T_i).
    ρ is 1 on padding too (the reallocation multiplies by the mask).  The one place where relevance from a replay,
    a file or a store becomes the tensor that :func:`mrtpo.advantages.token_advantages` takes.
    """
    N, K = len(lengths), len(reward_names)
    T = max(lengths, default=0) if T is None else T
    mask = torch.zeros(N, T, dtype=torch.bool)
    rho = torch.ones(N, K, T)
    col = {k: j for j, k in enumerate(reward_names)}
    for i, (rel, n) in enumerate(zip(relevance, lengths)):
        mask[i, :n] = True
        for k, v in rel.items():
            if k in col:
                v = torch.as_tensor(np.asarray(v, dtype=np.float32))
                if v.shape != (n,):
                    raise MrtpoError(f"relevance of reward '{k}' for response {i} has {v.numel()} values "
                                     f"for {n} tokens")
                rho[i, col[k], :n] = v
    return rho, mask


# ---------------------------------------------------------------------------------------------- results
@dataclass
class ResponseRelevance:
    """Relevance of one response: tokens with character offsets, raw JS distances, normalized relevance.

    ``js`` is always the paper's d_kt; ``relevance`` is ρ of the measure named ``measure`` (:data:`MEASURES`;
    ``"js"``: ρ from d itself). ``logp_all`` / ``logp_without`` are the sampled tokens' log-probabilities under
    P_all and P_\\k, which other measures read (None for relevance that did not come from a replay)."""

    text: str
    token_ids: list[int]
    offsets: list[tuple[int, int]]
    js: dict[str, np.ndarray]  # reward -> (T,)
    relevance: dict[str, np.ndarray]  # reward -> (T,), mean 1
    skipped: list[str] = field(default_factory=list)  # rewards with no variance in the group
    logp_all: np.ndarray | None = None  # (T,) log π(y_t | P_all, y<t)
    logp_without: dict[str, np.ndarray] = field(default_factory=dict)  # reward -> (T,) log π(y_t | P_\k, y<t)
    measure: str = "js"

    def measure_input(self, reward: str) -> "MeasureInput":
        """What a relevance measure reads for ``reward`` (see :class:`MeasureInput`)."""
        T = len(self.token_ids)
        lp = np.zeros(T, np.float32) if self.logp_all is None else self.logp_all
        rest = [v for k, v in self.js.items() if k != reward]
        others = np.array(rest, dtype=np.float32).reshape(len(rest), T)
        return MeasureInput(self.js[reward], lp, self.logp_without.get(reward, lp), self.offsets, self.text, others)

    def with_measure(self, name: str) -> "ResponseRelevance":
        """The same response with ``relevance`` from measure ``name`` (no model call)."""
        rel = {k: measure_relevance(name, self.measure_input(k)) for k in self.js}
        return replace(self, relevance=rel, measure=name)

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
    """A replayed group: per response its tokens, d and ρ (``responses``), the prompts and the replay's cost."""

    responses: list[ResponseRelevance]
    prompts: list[dict[str, str]]  # per response: {"__all__": P_all text, reward: P_\k text} as the model sees them
    rewards: list[str]  # rewards replayed
    skipped: list[str]
    prefix_tokens: int = 0
    forward_tokens: int = 0  # tokens run through the model (prefix once + every padded batch)
    forward_passes: int = 0
    seconds: float = 0.0

    @property
    def measure(self) -> str:
        return self.responses[0].measure if self.responses else "js"

    def with_measure(self, name: str) -> "ReplayResult":
        """The same replay with every response's relevance from measure ``name`` (:data:`MEASURES`; no model
        call: the measures read what the replay stored)."""
        get_measure(name)
        if name == self.measure:
            return self
        return replace(self, responses=[r.with_measure(name) for r in self.responses])


@dataclass
class ReplayConfig:
    token_budget: int = 2048  # max batch × padded new tokens per forward pass (small batches pad less)
    kv_budget: int = 4096  # max batch × padded (cached + new) tokens per forward pass: bounds the KV copies
    logits_budget: int = 1 << 22  # max (1 + K) × tokens × vocab logits per chunk (16 MiB in float32)
    # KV reuse over a trie of the group's sequences: every shared prefix (the task prompt; the items before the
    # one left out; verifier text that is the same for several responses) runs once and its KV cache serves
    # every sequence through it.  False: every (response, variant) sequence runs in full (still batched).
    share_prefix: bool = True
    # "auto": on a CPU with AMX / AVX512-BF16 the decoder runs on bfloat16 copies of the weights (what a GPU run
    # does; about 3x faster than float32), else in the model's dtype; "model": always the model's dtype (exact;
    # what tests compare); "bfloat16": bf16 copies on any device.  Log-softmax and JS always run in float32; with
    # bf16 weights the vocabulary projection
    # runs in bf16 on P_all and on the difference h(P_\k) − h(P_all), which keeps the JS close to float32.
    precision: str = "auto"


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
    for i, (r, info) in enumerate(zip(responses, infos)):
        text, rid, off = _response_tokens(lm, r)
        try:  # each message's length is checked before it is built (at most MAX_FILLED_CHARS characters) ...
            msgs = template.variants(prompt, info, act)
        except TemplateError as e:
            raise TemplateError(f"the prompts for response {i}: {e}") from None
        full = {v: lm.chat_prompt(m) for v, m in msgs.items()}
        toks = {}
        for v, t in full.items():
            if t not in enc_cache:
                enc_cache[t] = lm.encode(t)
            toks[v] = enc_cache[t]
            # ... and in tokens against the model's context here, before any forward pass (P_all, the longest, first)
            name = "P_all" if v == ALL else f"P_\\{v} (without reward '{v}')"
            check_length(lm, len(toks[v]) + len(rid), f"{name} + response {i}")
        texts.append(text), ids.append(rid), offs.append(off), ptexts.append(full), pids.append(toks)
    return _Plan(texts, ids, offs, ptexts, pids, act, skip)


def _finish(lm, plan: _Plan, hidden_of, t0: float, stats: dict, dtype: torch.dtype, measure: str = "js"
            ) -> ReplayResult:
    """JS + normalization from final hidden states ``hidden_of(i, variant) -> (T, H)``, in vocab-bounded chunks.

    Per chunk of a response's tokens, one matrix product projects every variant onto the vocabulary (in
    ``dtype``).  Below float32 it projects P_all's states and the differences h(P_\\k) − h(P_all)
    (logits_k = logits_all + W·(h_k − h_all)): both distributions then share the rounding of logits_all, and
    their difference is as exact as the hidden states allow."""
    head = lm.model.get_output_embeddings()
    Wt = head.weight.detach().to(dtype).t().contiguous()  # (H, V)
    bias = getattr(head, "bias", None)
    bias = None if bias is None else bias.detach().float()
    cap = getattr(lm.model.config, "final_logit_softcapping", None)
    exact = dtype == torch.float32
    chunk = max(1, stats.pop("logits_budget") // (Wt.shape[1] * (1 + len(plan.rewards))))

    def logprobs(z: torch.Tensor) -> torch.Tensor:
        if bias is not None:
            z = z + bias
        if cap:
            z = torch.tanh(z / cap) * cap
        return torch.log_softmax(z, dim=-1)

    rows_max = min(chunk, max((len(r) for r in plan.resp_ids), default=1)) * (1 + len(plan.rewards))
    z32 = torch.empty((rows_max, Wt.shape[1]), device=Wt.device)
    zlow = None if exact else torch.empty((rows_max, Wt.shape[1]), dtype=dtype, device=Wt.device)
    out = []
    for i, rid in enumerate(plan.resp_ids):
        T = len(rid)
        js = {k: torch.zeros(T) for k in plan.rewards}
        ids = torch.tensor(rid, dtype=torch.long, device=Wt.device).unsqueeze(1)  # (T, 1) the sampled tokens
        lp_all = torch.zeros(T)
        lp_k = {k: torch.zeros(T) for k in plan.rewards}
        for s in range(0, T, chunk):
            h_all = hidden_of(i, ALL)[s : s + chunk]  # (n, H)
            n = h_all.shape[0]
            # rewards whose P_\k state equals P_all's here (an empty item) have d = 0 and are not projected
            todo = [k for k in plan.rewards if not torch.equal(hidden_of(i, k)[s : s + chunk], h_all)]
            rows = [h_all] + [hidden_of(i, k)[s : s + chunk] if exact else
                              hidden_of(i, k)[s : s + chunk].float() - h_all.float() for k in todo]
            m = sum(r.shape[0] for r in rows)
            if exact:
                z = torch.matmul(torch.cat(rows), Wt, out=z32[:m])  # ((1 + |todo|) n, V)
            else:  # project into a reused buffer: fresh 30 MB blocks cost page faults on every chunk
                z = z32[:m].copy_(torch.matmul(torch.cat(rows).to(dtype), Wt, out=zlow[:m]))
            z_all = z[:n]
            lp = logprobs(z_all)
            p = lp.exp()
            y = ids[s : s + n]
            lp_all[s : s + n] = lp.gather(1, y)[:, 0].cpu()
            for k in plan.rewards:  # rewards not projected here have P_\k's distribution = P_all's
                lp_k[k][s : s + n] = lp_all[s : s + n]
            for j, k in enumerate(todo, start=1):
                z_k = z[j * n : (j + 1) * n] if exact else z[j * n : (j + 1) * n].add_(z_all)
                lq = logprobs(z_k)
                js[k][s : s + chunk] = js_distance(lp, lq, p=p).cpu()
                lp_k[k][s : s + n] = lq.gather(1, y)[:, 0].cpu()
        rr = ResponseRelevance(
            text=plan.texts[i], token_ids=rid, offsets=plan.offsets[i],
            js={k: v.numpy() for k, v in js.items()}, relevance={}, skipped=list(plan.skipped),
            logp_all=lp_all.numpy(), logp_without={k: v.numpy() for k, v in lp_k.items()}, measure=measure)
        rr.relevance = {k: measure_relevance(measure, rr.measure_input(k)) for k in plan.rewards}
        out.append(rr)
    return ReplayResult(responses=out, prompts=plan.prompt_texts, rewards=plan.rewards, skipped=plan.skipped,
                        seconds=time.perf_counter() - t0, **stats)


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
    measure: str = "js",
) -> ReplayResult:
    """Batched leave-one-out replay of one group, with KV reuse across variants.

    prompt:        the task prompt x (user message the responses were sampled under).
    verifier_info: {reward: text}, shared by the group, or one such dict per response (v_k(x, y)).
    responses:     G responses, as text (tokenized with offsets) or sampled token ids / Samples.
    rewards:       optional (G, K) rewards in verifier_info's key order; constant columns are skipped.
    measure:       the relevance measure (:data:`MEASURES`; default ``"js"``, the paper's).
    Returns per-response tokens, JS distances d (T,) and relevance ρ (T,) for every replayed reward.

    The (1 + K') × G sequences P_all + y_i, P_\\k + y_i go through :func:`mrtpo.kvtrie.shared_hidden`: a trie of
    their tokens, each shared prefix (the task prompt, the items before the one left out, response-independent
    verifier text) computed once and reused as KV cache, the rest in padded batches under the token budgets.
    """
    cfg = config or ReplayConfig()
    get_measure(measure)  # an unknown name fails before any model work
    t0 = time.perf_counter()
    plan = _plan(lm, prompt, verifier_info, responses, template, rewards)
    dtype = compute_dtype(lm, cfg.precision)
    keys = [(i, v) for i in range(len(plan.resp_ids)) for v in [ALL] + plan.rewards]
    seqs = [plan.prompt_ids[i][v] + plan.resp_ids[i] for i, v in keys]
    # the state before response token t predicts it: positions S - 1 ... S + T - 2
    want = [(len(plan.prompt_ids[i][v]) - 1, len(plan.prompt_ids[i][v]) - 1 + len(plan.resp_ids[i])) for i, v in keys]
    pad = lm.tokenizer.pad_token_id
    states, trie, passes = shared_hidden(
        Decoder(decoder_stack(lm.model), dtype), 0 if pad is None else pad, lm.device, seqs, want,
        cfg.token_budget, cfg.kv_budget, share=cfg.share_prefix)
    top = trie.segments[trie.paths[0][0]] if seqs else None
    shared = len(top.tokens) if top is not None and all(p[0] == trie.paths[0][0] for p in trie.paths) else 0
    stats = {"prefix_tokens": shared, "forward_tokens": passes.forward_tokens,
             "forward_passes": passes.forward_passes, "logits_budget": cfg.logits_budget}
    hidden = dict(zip(keys, states))
    return _finish(lm, plan, lambda i, v: hidden[(i, v)], t0, stats, dtype, measure)


@torch.no_grad()
def naive_replay_group(
    lm: LoadedModel,
    prompt: str,
    verifier_info: dict[str, str] | Sequence[dict[str, str]],
    responses: Sequence[Response],
    template: Template | None = None,
    rewards: np.ndarray | torch.Tensor | None = None,
    measure: str = "js",
) -> ReplayResult:
    """Reference replay: every (variant, response) sequence alone, full prompt, full logits, no cache."""
    t0 = time.perf_counter()
    plan = _plan(lm, prompt, verifier_info, responses, template, rewards)
    stats = {"prefix_tokens": 0, "forward_tokens": 0, "forward_passes": 0, "logits_budget": 1 << 62}
    backbone = decoder_stack(lm.model)
    hidden = {}
    for i, rid in enumerate(plan.resp_ids):
        for v in [ALL] + plan.rewards:
            p = plan.prompt_ids[i][v]
            ids = torch.tensor([p + rid], device=lm.device)
            h = backbone(input_ids=ids, use_cache=False).last_hidden_state[0]
            hidden[(i, v)] = h[len(p) - 1 : len(p) - 1 + len(rid)]
            stats["forward_tokens"] += ids.shape[1]
            stats["forward_passes"] += 1
    return _finish(lm, plan, lambda i, v: hidden[(i, v)], t0, stats, lm.dtype, measure)


# ---------------------------------------------------------------------------------------------- one position, shown
@torch.no_grad()
def next_token_topk(
    lm: LoadedModel,
    prompt: str,
    verifier_info: dict[str, str],
    response: Response,
    reward: str,
    t: int,
    k: int = 10,
    template: Template | None = None,
) -> dict:
    """The two next-token distributions that the JS distance of ``reward`` compares at response position ``t``.

    p_t = π(·|P_all, y<t) and q_t = π(·|P_\\k, y<t): each of the two sequences P_all + y<t and P_\\k + y<t runs in
    one plain forward pass of the model in its own dtype (float32 on CPU: no bf16 copies, no KV sharing), and
    log-softmax runs in float32 over the whole vocabulary.  ``t`` is 0-based (0 ≤ t < T); y_t is the token the two
    distributions predict.

    Returns a dict:

    - ``rows``: the union of the top-``k`` tokens of p_t and of q_t (so both sets of bars align), ordered by
      max(p, q) descending: ``[{"id", "text", "p", "q"}]``;
    - ``token``: y_t as ``{"id", "text", "p", "q"}`` (its probabilities under both prompts);
    - ``js``: :func:`js_distance` of the full distributions (the replay's d_kt at t, up to its precision);
    - ``p_other``, ``q_other``: the probability mass outside ``rows`` (1 − Σ rows);
    - ``prompts``: ``{"__all__": P_all text, reward: P_\\k text}`` as the model sees them.
    """
    template = template or Template()
    if reward not in verifier_info:
        raise MrtpoError(f"reward '{reward}' has no verifier information (rewards: {', '.join(verifier_info)})")
    if not isinstance(k, int) or k < 1:
        raise MrtpoError(f"k must be an integer >= 1, got {k!r}")
    plan = _plan(lm, prompt, [verifier_info], [response], template, None)
    rid = plan.resp_ids[0]
    if not 0 <= t < len(rid):
        raise MrtpoError(f"position t = {t} is outside the response (0 ≤ t < {len(rid)})")
    logps = []
    for v in (ALL, reward):
        ids = torch.tensor([plan.prompt_ids[0][v] + rid[:t]], device=lm.device)
        logits = lm.model(input_ids=ids, use_cache=False).logits[0, -1].float()
        logps.append(torch.log_softmax(logits, dim=-1).cpu())
    lp, lq = logps
    p, q = lp.exp(), lq.exp()
    kk = min(k, p.numel())
    ids = dict.fromkeys(p.topk(kk).indices.tolist() + q.topk(kk).indices.tolist())
    order = sorted(ids, key=lambda i: -max(float(p[i]), float(q[i])))

    def row(i: int) -> dict:
        text = lm.tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return {"id": i, "text": text, "p": float(p[i]), "q": float(q[i])}

    rows = [row(i) for i in order]
    return {"rows": rows, "token": row(rid[t]), "js": float(js_distance(lp, lq, p=p)),
            "p_other": max(0.0, 1.0 - sum(r["p"] for r in rows)), "q_other": max(0.0, 1.0 - sum(r["q"] for r in rows)),
            "prompts": {ALL: plan.prompt_texts[0][ALL], reward: plan.prompt_texts[0][reward]}}
