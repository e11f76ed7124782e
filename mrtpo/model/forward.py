"""Log-probabilities and entropies of given responses under given prompts: one right-padded forward pass through
the model's own head (the trainer's update, the credit log, and the ``entropy`` relevance measure for responses the
sampler did not record).
"""
from __future__ import annotations

import torch

from mrtpo.model.arch import head_logits
from mrtpo.model.decoder import decoder_stack


def response_logits(model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                    temperature: float = 1.0, stack=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits (N, T, V) float32 at ``temperature``, sampled tokens (N, T), mask (N, T)) of every response token, one
    right-padded forward pass; only response positions go through the LM head.  ``stack``: what runs the decoder
    stack (default the model's own; a :class:`mrtpo.model.decoder.Decoder` runs it on cast weight copies, its states
    then go through the head in the head's dtype)."""
    dev = next(model.parameters()).device
    N = len(prompts)
    L = max(len(p) + len(r) for p, r in zip(prompts, responses))
    T = max(len(r) for r in responses)
    ids = torch.full((N, L), pad_id, dtype=torch.long)
    attn = torch.zeros((N, L), dtype=torch.long)
    pos = torch.zeros((N, T), dtype=torch.long)
    tok = torch.full((N, T), pad_id, dtype=torch.long)
    mask = torch.zeros((N, T), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        s = p + r
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        pos[i, : len(r)] = len(p) - 1 + torch.arange(len(r))
        pos[i, len(r):] = len(p) - 1
        tok[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    # on CUDA a float32 (master-weight) model runs its forward under bf16 autocast; on a CPU it stays exact
    fp32_cuda = dev.type == "cuda" and next(model.parameters()).dtype == torch.float32
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=fp32_cuda):
        h = (stack or decoder_stack(model))(input_ids=ids.to(dev), attention_mask=attn.to(dev)).last_hidden_state
    h = torch.gather(h, 1, pos.to(dev).unsqueeze(-1).expand(N, T, h.shape[-1]))  # (N, T, H)
    if stack is not None:
        h = h.to(model.get_output_embeddings().weight.dtype)
    logits = head_logits(model, h).float()  # the model's own logits (Gemma 2: soft-capped)
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return logits, tok.to(dev), mask.to(dev)


def token_logprobs(model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y_t | x, y<t) of every response token, one right-padded forward pass (in the model's dtype; bf16
    autocast for a float32 model on CUDA).

    prompts, responses: N token-id lists.  Returns (logp (N, T), mask (N, T)), T = longest response.
    Only response positions go through the LM head, so no (N, L, V) logits tensor exists.
    """
    logits, tok, mask = response_logits(model, prompts, responses, pad_id, temperature)
    logp = torch.gather(logits, -1, tok.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
    return logp * mask, mask


def token_logprobs_entropy(model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]],
                           pad_id: int, temperature: float = 1.0, stack=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), each (N, T), 0 on padding: :func:`token_logprobs` and H_t = −Σ_v π(v | x, y<t) log π(v | …)
    of the same distribution (for the credit log and the ``entropy`` relevance measure; no gradient); ``stack`` as in
    :func:`response_logits`."""
    with torch.no_grad():
        logits, tok, mask = response_logits(model, prompts, responses, pad_id, temperature, stack)
        logq = torch.log_softmax(logits, -1)
        logp = torch.gather(logq, -1, tok.unsqueeze(-1)).squeeze(-1)
        ent = -(logq.exp() * logq).sum(-1)
    return logp * mask, ent * mask
