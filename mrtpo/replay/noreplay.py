"""Relevance without the replay: the measures that read none (the oracle, ``ktae``, ``entropy``: their registry
entries say so, :class:`mrtpo.core.measures.Needs`).

The oracle reads what each checker read; ``ktae`` reads the group's token ids and rewards (no model pass);
``entropy`` reads the policy's next-token entropy H(π(·|x, y<t)) under the *sampling* prompt x (not P_all), which the
sampler records in each :class:`Sample` (:func:`mrtpo.model.sample`); for a response it did not sample (a given text,
an uploaded rollout) one forward pass under x gives it (:func:`sampling_entropy`: x once, shared by the group, as the
replay runs P_all).  None runs the K + 1 passes of the replay: :func:`mrtpo.replay.replay_groups` gives a group asked
for only these :func:`unreplayed`, a :class:`ReplayResult` of the same shape with no JS (``replayed`` False).
:meth:`ReplayResult.attach_context` gives a result what these measures read (the group's rewards, the sampler's
entropies), so that :meth:`ReplayResult.with_measure` re-derives them with no model call; :func:`with_entropy` fills
in the entropies the sampler did not record.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from mrtpo.model import (
    Decoder,
    LoadedModel,
    check_length,
    compute_dtype,
    decoder_stack,
)
from mrtpo.model.arch import check_model, final_softcap
from mrtpo.model.defaults import TEMPERATURE
from mrtpo.model.llama_step import llama_step
from mrtpo.replay.kvtrie import shared_hidden
from mrtpo.replay.plan import group_rewards, response_tokens, text_and_offsets
from mrtpo.replay.results import ReplayResult, ResponseRelevance

#: the most logits (tokens × vocabulary) the entropy's head projects at a time (64 MiB in float32)
ENTROPY_LOGITS = 1 << 24
#: the entropy forward's pass budgets: the replay's defaults (mrtpo.replay.ReplayConfig)
TOKEN_BUDGET, KV_BUDGET = 2048, 4096




def sampling_entropy(lm: LoadedModel, prompt: str, responses: Sequence[Sequence[int]], temperature: float = TEMPERATURE,
                     precision: str = "auto", token_budget: int = TOKEN_BUDGET, kv_budget: int = KV_BUDGET
                     ) -> list[np.ndarray]:
    """Each response's next-token entropy under the sampling prompt, as the sampler records it:
    H_t = −Σ_v π_τ(v | x, y<t) log π_τ(v | x, y<t), π_τ = softmax(logits / τ).

    Args:
        lm: the policy.
        prompt: the user message x the responses were sampled under (``lm.chat_prompt(prompt)``, as
            :func:`mrtpo.model.sample` builds it).
        responses: each response's token ids.
        temperature: the sampling temperature τ (≤ 0: 1).
        precision: the decoder stack's (:func:`mrtpo.model.compute_dtype`: ``"auto"`` bf16 weight copies on a CPU
            with fast bf16 products, ``"model"`` the model's dtype).
        token_budget, kv_budget: the passes' budgets (:func:`mrtpo.replay.kvtrie.shared_hidden`).

    Returns:
        Per response, H (T_i,) float32. One forward of the group as the replay runs P_all alone: x once, its KV cache
        serving every response; the head in the stack's dtype over at most :data:`ENTROPY_LOGITS` logits at a time,
        the softmax and the entropy in float32 (the model's own logits: bias, Gemma 2's soft-cap)."""
    check_model(lm.model, lm.tokenizer, lm.name)
    x = lm.encode(lm.chat_prompt(prompt))
    out = [np.zeros(0, np.float32) for _ in responses]
    todo = [i for i, r in enumerate(responses) if len(r)]
    for i in todo:
        check_length(lm, len(x) + len(responses[i]), f"the sampling prompt + response {i}", response=i)
    if not todo:
        return out
    dec = Decoder(decoder_stack(lm.model), compute_dtype(lm, precision), keep=lm.frozen)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    head = lm.model.get_output_embeddings()
    bias = None if getattr(head, "bias", None) is None else head.bias.detach().float()
    cap = final_softcap(lm.model.config)
    with torch.no_grad():
        states, _, _ = shared_hidden(dec, pad, lm.device, [x + list(responses[i]) for i in todo],
                                     [(len(x) - 1, len(x) - 1 + len(responses[i])) for i in todo],
                                     token_budget, kv_budget, own=llama_step(dec), store=dec.prefixes())
        W = dec.weight(head.weight)  # (V, H)
        rows = max(1, ENTROPY_LOGITS // W.shape[0])
        for i, h in zip(todo, states):  # h: (T_i, H), the states that predict each response token
            ent = []
            for s in range(0, len(h), rows):
                z = (h[s:s + rows].to(W.dtype) @ W.t()).float()  # (n, V)
                z = z + bias if bias is not None else z
                z = torch.tanh(z / cap) * cap if cap else z
                lsm = torch.log_softmax(z / temperature if temperature > 0 else z, dim=-1)
                ent.append(-(lsm.exp() * lsm).sum(-1))
            out[i] = torch.cat(ent).cpu().numpy()
    return out








def with_entropy(lm: LoadedModel, result: ReplayResult, prompt: str, temperature: float = TEMPERATURE,
                 precision: str = "auto") -> ReplayResult:
    """``result`` with every response's entropy under the sampling prompt ``prompt``: those the sampler did not record
    from one forward (:func:`sampling_entropy` in ``precision``), timed as ``entropy_seconds``; the same object when
    none is missing."""
    missing = [i for i, r in enumerate(result.responses) if r.entropy is None]
    if not missing:
        return result
    t0 = time.perf_counter()
    ent = sampling_entropy(lm, prompt, [result.responses[i].token_ids for i in missing], temperature, precision)
    responses = list(result.responses)
    for i, h in zip(missing, ent):
        responses[i] = replace(responses[i], entropy=h)
    took = time.perf_counter() - t0
    return replace(result, responses=responses, entropy_seconds=result.entropy_seconds + took,
                   seconds=result.seconds + took, forward_passes=result.forward_passes + 1)


def unreplayed(lm: LoadedModel, verifier_info, responses: Sequence, rewards) -> ReplayResult:
    """A group's result without the replay, for the measures that read none (the oracle, ``ktae``, ``entropy``): a
    :class:`ReplayResult` of the replay's shape, its tokens and offsets, no JS (``js`` {}, ``replayed`` False) and no
    relevance yet (:func:`mrtpo.replay.replay_groups` fills it in from the measure); no model pass.

    Arguments as :class:`mrtpo.replay.GroupInput`'s (verifier_info gives the reward names; rewards (G, K) in its key
    order, or None): the rewards constant in the group are skipped as the replay skips them."""
    t0 = time.perf_counter()
    _, act, skip = group_rewards(verifier_info, responses, rewards)
    out = []
    for r in responses:
        text, ids, offs = response_tokens(lm, r)
        text, offs = text_and_offsets(lm, text, ids, offs)
        out.append(ResponseRelevance(text=text, token_ids=ids, offsets=offs, js={}, relevance=dict.fromkeys(act),
                                     skipped=list(skip), measure=""))
    return ReplayResult(out, [{} for _ in out], act, skip, replayed=False, seconds=time.perf_counter() - t0)
