"""The policy and its update (METHOD.md, "The policy update"): log-probabilities of the sampled tokens, the clipped
surrogate on token advantages, AdamW steps (:class:`Policy`), and what of the policy trains (its checkpointed
state).  The loop that calls them is :mod:`mrtpo.train.loop`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel, decoder_stack, load_model, seeded_global
from mrtpo.model.arch import head_logits
from mrtpo.model.defaults import TEMPERATURE
from mrtpo.train.config import AGGREGATIONS, TrainConfig
from mrtpo.wording import plural


def clipped_surrogate_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: str = "token-mean",
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO/GRPO clipped surrogate on token advantages (TRL's ``_compute_loss``).

    logp, old_logp, adv, mask: (N, T) — log π_θ, log π_old of the taken tokens, token advantages, valid tokens.
    r_t = exp(logp − old_logp);  l_t = −min(r_t A_t, clip(r_t, 1 − ε_low, 1 + ε_high) A_t) (+ β_KL · k3_t,
    k3_t = exp(ref − logp) − (ref − logp) − 1).  ``token-mean``: Σ l / Σ mask over the batch (TRL "bnpo");
    ``seq-mean``: mean over a response's tokens, then over responses (TRL "grpo").
    Stats: clip_frac (tokens where the clipped term is the active one), ratio_mean, kl (k3 mean, if ref).
    """
    m = mask.float()
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_tok = -torch.min(ratio * adv, clipped * adv)
    kl = None
    if ref_logp is not None:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        if kl_coef:
            per_tok = per_tok + kl_coef * kl
    if aggregation == "token-mean":
        loss = (per_tok * m).sum() / m.sum().clamp_min(1)
    elif aggregation == "seq-mean":
        loss = ((per_tok * m).sum(-1) / m.sum(-1).clamp_min(1)).mean()
    else:
        raise MrtpoError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, not '{aggregation}'")
    with torch.no_grad():
        is_clipped = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
        n = m.sum().clamp_min(1)
        stats = {"clip_frac": float((is_clipped.float() * m).sum() / n), "ratio_mean": float((ratio * m).sum() / n)}
        if kl is not None:
            stats["kl"] = float((kl * m).sum() / n)
    return loss, stats


def _response_logits(model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                     temperature: float = TEMPERATURE, cpu_bf16: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits (N, T, V) float32 at ``temperature``, sampled tokens (N, T), mask (N, T)) of every response token, one
    right-padded forward pass; only response positions go through the LM head.  A float32 model's decoder runs under
    bf16 autocast on CUDA, and on a CPU when ``cpu_bf16`` (:class:`mrtpo.train.config.OptimConfig`'s ``bf16_update``);
    the head and the log-softmax stay float32."""
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
    # on CUDA a float32 (master-weight) model runs its forward under bf16 autocast; on a CPU only when asked
    fp32 = next(model.parameters()).dtype == torch.float32
    bf16 = fp32 and (dev.type == "cuda" or (dev.type == "cpu" and cpu_bf16))
    with torch.autocast(dev.type if dev.type in ("cuda", "cpu") else "cpu", dtype=torch.bfloat16, enabled=bf16):
        h = decoder_stack(model)(input_ids=ids.to(dev), attention_mask=attn.to(dev)).last_hidden_state  # (N, L, H)
    h = torch.gather(h, 1, pos.to(dev).unsqueeze(-1).expand(N, T, h.shape[-1]))  # (N, T, H)
    logits = head_logits(model, h).float()  # the model's own logits (Gemma 2: soft-capped)
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return logits, tok.to(dev), mask.to(dev)


def token_logprobs(model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                   temperature: float = TEMPERATURE, cpu_bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y_t | x, y<t) of every response token, one right-padded forward pass (in the model's dtype; bf16
    autocast for a float32 model on CUDA).

    prompts, responses: N token-id lists.  Returns (logp (N, T), mask (N, T)), T = longest response.
    Only response positions go through the LM head, so no (N, L, V) logits tensor exists.
    """
    logits, tok, mask = _response_logits(model, prompts, responses, pad_id, temperature, cpu_bf16)
    logp = torch.gather(logits, -1, tok.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
    return logp * mask, mask


def token_logprobs_entropy(model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]],
                           pad_id: int, temperature: float = TEMPERATURE) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), each (N, T), 0 on padding: :func:`token_logprobs` and H_t = −Σ_v π(v | x, y<t) log π(v | …)
    of the same distribution (for the credit log; no gradient)."""
    with torch.no_grad():
        logits, tok, mask = _response_logits(model, prompts, responses, pad_id, temperature)
        logq = torch.log_softmax(logits, -1)
        logp = torch.gather(logq, -1, tok.unsqueeze(-1)).squeeze(-1)
        ent = -(logq.exp() * logq).sum(-1)
    return logp * mask, ent * mask


def trainable_state(model: torch.nn.Module, lora: bool) -> dict[str, torch.Tensor]:
    """What trains, on the CPU: the LoRA adapter (``lora``), or every parameter with ``requires_grad`` (no frozen
    weights, no buffers; a tied head is saved once)."""
    if lora:
        from peft import get_peft_model_state_dict

        return {k: v.detach().cpu() for k, v in get_peft_model_state_dict(model).items()}
    return {k: p.detach().cpu() for k, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model: torch.nn.Module, weights: dict[str, torch.Tensor], lora: bool) -> None:
    """Put :func:`trainable_state`'s ``weights`` back into ``model``; MrtpoError if they do not fit it (a superset,
    e.g. an older checkpoint holding every weight, is fine)."""
    if lora:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, weights)
        return
    named = {k: p for k, p in model.named_parameters() if p.requires_grad}
    missing = [k for k in named if k not in weights]
    if missing:
        raise MrtpoError(f"lacks {plural(len(missing), 'trained tensor')} ({missing[0]}, …)")
    try:
        with torch.no_grad():
            for k, p in named.items():
                p.copy_(weights[k])
    except RuntimeError as e:
        raise MrtpoError(f"does not fit: {str(e).splitlines()[0]}") from None


@dataclass
class Policy:
    """The model being trained (``lm``, trained in place), its trainable parameters, AdamW, and the frozen reference
    for the KL term (None without one; with LoRA the reference is the model with its adapter disabled)."""

    lm: LoadedModel
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    reference: torch.nn.Module | None
    lora: bool
    pristine: bool = True  # the initial weights and optimizer (no update or checkpoint applied yet)

    @classmethod
    def build(cls, cfg: TrainConfig, lm: LoadedModel | None = None) -> "Policy":
        """Load ``cfg.model`` (or take ``lm``) and make it trainable: float32 master weights for full fine-tuning,
        a LoRA adapter with ``cfg.optim.lora``, a frozen copy as reference when the KL term is on.  What draws from
        torch's global generator (the LoRA initialization) runs as if it were seeded with ``cfg.seed``, and the
        global state is put back afterwards (:func:`mrtpo.model.seeded_global`)."""
        o = cfg.optim
        if lm is not None and lm.frozen:
            raise MrtpoError(f"the model '{lm.name}' is marked frozen (shared, its cast weight copies kept): load a "
                             "model of its own to train")
        lm = lm or load_model(cfg.model, cfg.device)  # not inside seeded_global: load_model takes that lock itself
        model, dtype = lm.model, lm.dtype
        if not o.lora and dtype != torch.float32:
            # Full fine-tuning keeps float32 master weights: AdamW steps at lr ~1e-5 are below bfloat16's resolution
            # for most weights (one bf16 step at lr 1e-5 changed 2 % of them). Sampling and the replay still decode
            # on bf16 copies (compute_dtype "auto"), and on CUDA the update's forward runs under bf16 autocast.
            model, dtype = model.float(), torch.float32
        reference = None
        if o.lora:
            from peft import LoraConfig, get_peft_model

            for prm in model.parameters():
                prm.requires_grad_(False)
            with seeded_global(cfg.seed):  # the LoRA initialization draws from torch's global generator
                model = get_peft_model(model, LoraConfig(r=o.lora_rank, lora_alpha=o.lora_alpha, lora_dropout=0.0,
                                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        else:
            for prm in model.parameters():
                prm.requires_grad_(True)
            if o.kl_coef > 0:
                reference = copy.deepcopy(model).eval().requires_grad_(False)
        model.eval()  # no dropout: deterministic; gradients still flow
        lm = LoadedModel(model=model, tokenizer=lm.tokenizer, name=lm.name, device=lm.device, dtype=dtype)
        params = [prm for prm in model.parameters() if prm.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)
        return cls(lm, params, optimizer, reference, o.lora)

    # ------------------------------------------------------------------------------------------ checkpoints
    def state(self, step: int) -> dict:
        """What an exact resume needs: what trains (:func:`trainable_state`) and the AdamW state. (No random state:
        every draw of a step comes from generators seeded by (seed, step).)"""
        return {"step": step, "lora": self.lora, "model": trainable_state(self.lm.model, self.lora),
                "optimizer": self.optimizer.state_dict()}

    def load(self, state: dict) -> None:
        """Put a checkpoint's :meth:`state` back (weights, AdamW); MrtpoError if its weights do not fit. The
        ``torch_rng`` of older checkpoints is not applied (it would set the process's global generator)."""
        load_trainable_state(self.lm.model, state["model"], self.lora)
        self.optimizer.load_state_dict(state["optimizer"])
        self.pristine = False

    # ------------------------------------------------------------------------------------------ the update
    def ref_logprobs(self, prompts, responses, kl_coef: float, temperature: float,
                     cpu_bf16: bool = False) -> torch.Tensor | None:
        """log π_ref of the sampled tokens (N, T), or None when the KL term is off."""
        if kl_coef <= 0:
            return None
        pad = self.lm.tokenizer.pad_token_id
        with torch.no_grad():
            if self.lora:
                with self.lm.model.disable_adapter():
                    return token_logprobs(self.lm.model, prompts, responses, pad, temperature, cpu_bf16)[0]
            return token_logprobs(self.reference, prompts, responses, pad, temperature, cpu_bf16)[0]

    def update(self, cfg: TrainConfig, prompt_ids: Sequence[list[int]], resp_ids: Sequence[list[int]],
               tok_adv: torch.Tensor, mask: torch.Tensor, seed: int) -> dict[str, float]:
        """Clipped-surrogate AdamW updates on the token advantages ``tok_adv`` (N, T) over ``mask`` (N, T):
        ``ppo_epochs`` passes × ``minibatches`` (their order drawn from a generator seeded with ``seed``); old
        log-probs from the sampling policy."""
        o, model, temperature = cfg.optim, self.lm.model, cfg.sampling.temperature
        pad = self.lm.tokenizer.pad_token_id
        N = len(resp_ids)
        tok_adv, mask = tok_adv.to(self.lm.device), mask.to(self.lm.device)
        old = None
        if o.ppo_epochs * o.minibatches > 1:  # one no-grad forward with the sampling weights; else ratio 1
            with torch.no_grad():
                old = token_logprobs(model, list(prompt_ids), list(resp_ids), pad, temperature, o.bf16_update)[0]
        ref = self.ref_logprobs(list(prompt_ids), list(resp_ids), o.kl_coef, temperature, o.bf16_update)
        gen = torch.Generator().manual_seed(seed)
        losses, stats, norms = [], [], []
        for _ in range(o.ppo_epochs):
            order = torch.randperm(N, generator=gen) if o.minibatches > 1 else torch.arange(N)
            for mb in torch.tensor_split(order, o.minibatches):
                idx = mb.tolist()
                T = max(len(resp_ids[i]) for i in idx)
                logp, _ = token_logprobs(model, [prompt_ids[i] for i in idx], [resp_ids[i] for i in idx], pad,
                                         temperature, o.bf16_update)
                old_mb = old[idx, :T] if old is not None else logp.detach()
                ref_mb = ref[idx, :T] if ref is not None else None
                loss, st = clipped_surrogate_loss(logp, old_mb, tok_adv[idx, :T], mask[idx, :T], o.clip_low,
                                                  o.clip_high, o.aggregation, ref_mb, o.kl_coef)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if o.max_grad_norm > 0:
                    norms.append(float(torch.nn.utils.clip_grad_norm_(self.params, o.max_grad_norm)))
                self.optimizer.step()
                self.pristine = False
                losses.append(float(loss.detach()))
                stats.append(st)
        out = {"loss": float(np.mean(losses)), "grad_norm": float(np.mean(norms)) if norms else float("nan")}
        for k in stats[0]:
            out[k] = float(np.mean([st[k] for st in stats]))
        return out
