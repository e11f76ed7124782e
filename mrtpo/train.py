"""The embedded training loop: one config dataclass and a :class:`Trainer` whose ``step()`` is one RL update.

``step()``: sample a group per prompt with the current policy → score with the task's verifiers → per-reward
advantages from the estimator registry (``mrtpo.advantages``) → for MRTPO methods, the leave-one-out replay
with the current policy (``mrtpo.relevance``, no grad) and the token reallocation → clipped-surrogate update
on the token advantages (METHOD.md "The policy update") → metrics.

Steps are numbered from 1. Everything random is seeded from (seed, step), so a run is deterministic for a
seed on CPU, and resuming from a checkpoint reproduces the steps a run would have taken.

With a :class:`mrtpo.store.Store` the trainer writes every step (metrics, sampled responses with their token
data, probe relevance) in one transaction after the step completes, and every ``checkpoint_every`` steps
(default 10) saves a checkpoint of what trains — the LoRA adapter, or the trainable parameters — with the AdamW
state and the RNG state (atomically: temp file, fsync, ``os.replace``), keeping only the last one.

Resuming: ``Trainer(None, store, run)`` only reads the store (it loads the last checkpoint). ``train()`` takes
the run's lock (``Store.locked``: a heartbeat thread keeps it alive while steps run) before it changes
anything; then, if the store holds steps after the last checkpoint, it drops them and says so (they are
recomputed identically). Every write checks that this trainer still owns the lock. A step that fails (full
disk, lost lock, any error) is not stored, and the next ``train()`` restores the trainer from the store, so
memory never runs ahead of what the store has. Other trainers and viewers can read meanwhile.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from mrtpo import advantages as A
from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel, decoder_stack, load_model, sample, token_offsets
from mrtpo.pipeline import ScoredGroup, replay_scored, score_group, template_for
from mrtpo.relevance import replay_group
from mrtpo.store import RunInfo, Store, validate_run_name
from mrtpo.tasks import get_family
from mrtpo.tasks.base import TaskFamily

AGGREGATIONS = ("token-mean", "seq-mean")


@dataclass
class TrainConfig:
    """Everything a run needs; stored with the run as JSON."""

    model: str = field(default="default", metadata={"help": "default | tiny-random | HF id | local folder"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    task: str = field(default="instructions", metadata={"help": "task family: instructions | tools | sql"})
    examples: str | None = field(default=None, metadata={"help": "examples JSONL in the family's format (default: built-in)"})
    example_ids: list[str] | None = field(default=None, metadata={"help": "train on these example ids only"})
    method: str = field(default="mrtpo", metadata={"help": "a name from mrtpo.advantages.method_names()"})
    beta: float = field(default=0.5, metadata={"help": "MRTPO reallocation strength β"})
    warmup: int = field(default=10, metadata={"help": "β smoothstep warmup in steps (0: none)"})
    cap: float | None = field(default=None, metadata={"help": "optional cap on mean ρ² (>= 1)"})
    group_size: int = field(default=8, metadata={"help": "responses per prompt G"})
    prompts_per_step: int = field(default=2, metadata={"help": "prompts per step B (N = B·G responses)"})
    lr: float = field(default=1e-5, metadata={"help": "AdamW learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    clip_low: float = field(default=0.2, metadata={"help": "ε_low: ratio clipped below at 1 − ε_low"})
    clip_high: float = field(default=0.2, metadata={"help": "ε_high: ratio clipped above at 1 + ε_high"})
    kl_coef: float = field(default=0.0, metadata={"help": "β_KL for the k3 KL to the reference (0: no reference)"})
    aggregation: str = field(default="token-mean", metadata={"help": "token-mean (over all tokens) | seq-mean"})
    ppo_epochs: int = field(default=1, metadata={"help": "passes over each batch"})
    minibatches: int = field(default=1, metadata={"help": "optimizer steps per pass"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping (0: none)"})
    max_new_tokens: int = field(default=64, metadata={"help": "longest sampled response"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling"})
    seed: int = field(default=0, metadata={"help": "seed of every random choice"})
    lora: bool = field(default=False, metadata={"help": "train a LoRA adapter (peft) instead of all weights"})
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha"})
    template: dict | None = field(default=None, metadata={"help": "verifier-info template {prompt,item,separator}"})
    checkpoint_every: int = field(default=10, metadata={"help": "save a checkpoint every N steps (store only; "
                                                                   "the last one is kept)"})
    probe_size: int = field(default=4, metadata={"help": "probe responses whose relevance is tracked (0: none)"})

    def __post_init__(self):
        A.parse_method(self.method)  # raises a clear MrtpoError for an unknown method
        checks = [
            (self.group_size >= 1, "group_size must be >= 1"),
            (self.prompts_per_step >= 1, "prompts_per_step must be >= 1"),
            (self.lr > 0, "lr must be > 0"),
            (0 <= self.clip_low < 1 and self.clip_high >= 0, "clip_low must be in [0, 1) and clip_high >= 0"),
            (self.kl_coef >= 0, "kl_coef must be >= 0"),
            (self.aggregation in AGGREGATIONS, f"aggregation must be one of {', '.join(AGGREGATIONS)}"),
            (self.ppo_epochs >= 1 and self.minibatches >= 1, "ppo_epochs and minibatches must be >= 1"),
            (self.minibatches <= self.group_size * self.prompts_per_step, "more minibatches than responses"),
            (self.max_new_tokens >= 1, "max_new_tokens must be >= 1"),
            (self.beta >= 0 and self.warmup >= 0, "beta and warmup must be >= 0"),
            (self.cap is None or self.cap >= 1, "cap must be >= 1"),
            (self.checkpoint_every >= 1, "checkpoint_every must be >= 1"),
            (self.probe_size >= 0, "probe_size must be >= 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise MrtpoError(f"bad training config: {msg}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise MrtpoError(f"unknown training config field(s): {', '.join(unknown)}")
        return cls(**d)


# ---------------------------------------------------------------------------------------------- the loss
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
        agg = lambda x: (x * m).sum() / m.sum().clamp_min(1)  # noqa: E731
    elif aggregation == "seq-mean":
        agg = lambda x: ((x * m).sum(-1) / m.sum(-1).clamp_min(1)).mean()  # noqa: E731
    else:
        raise MrtpoError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, not '{aggregation}'")
    loss = agg(per_tok)
    with torch.no_grad():
        is_clipped = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
        n = m.sum().clamp_min(1)
        stats = {"clip_frac": float((is_clipped.float() * m).sum() / n), "ratio_mean": float((ratio * m).sum() / n)}
        if kl is not None:
            stats["kl"] = float((kl * m).sum() / n)
    return loss, stats


# ---------------------------------------------------------------------------------------------- log-probs
def token_logprobs(model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y_t | x, y<t) of every response token, one right-padded forward pass.

    prompts, responses: N token-id lists.  Returns (logp (N, T), mask (N, T)), T = longest response.
    Only response positions go through the LM head, so no (N, L, V) logits tensor exists.
    """
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
    h = decoder_stack(model)(input_ids=ids.to(dev), attention_mask=attn.to(dev)).last_hidden_state  # (N, L, H)
    h = torch.gather(h, 1, pos.to(dev).unsqueeze(-1).expand(N, T, h.shape[-1]))  # (N, T, H)
    logits = model.get_output_embeddings()(h).float()
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = torch.gather(logits, -1, tok.to(dev).unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
    return logp * mask.to(dev), mask.to(dev)


# ---------------------------------------------------------------------------------------------- trainer
@dataclass
class _Rollout:
    """One step's sampled batch: B scored groups, the (N, K) reward matrix over the union of reward names."""

    groups: list[ScoredGroup]
    names: list[str]
    R: torch.Tensor  # (N, K), NaN where a reward does not apply to the example
    prompt_ids: list[list[int]]  # per response
    resp_ids: list[list[int]]  # per response: sampled tokens (+ EOS when the response ended)


class Trainer:
    """RL on a task family with any estimator of the registry, MRTPO or not.

    ``Trainer(config)`` trains in memory; ``Trainer(config, store, run="name")`` creates the run in the store,
    or resumes it (then the stored config wins; ``config`` may be None). ``lm`` reuses an already loaded model
    (it is trained in place). ``family`` overrides the task family named by ``config.task`` (custom families).
    """

    def __init__(self, config: TrainConfig | None = None, store: Store | None = None, run: str | None = None,
                 lm: LoadedModel | None = None, log: Callable[[str], None] | None = None,
                 family: TaskFamily | None = None):
        self.log = log or (lambda msg: None)
        self.store, self.run_name, self.run_id = store, run, None
        if store is not None and not run:
            raise MrtpoError("a run stored in the run store needs a name")
        existing = store.get_run(run) if store is not None else None
        if store is not None and existing is None:
            validate_run_name(run)
        if existing is not None:
            stored = TrainConfig.from_dict(existing.config)
            if config is not None and config.to_dict() != stored.to_dict():
                diff = [k for k, v in config.to_dict().items() if stored.to_dict()[k] != v]
                self.log(f"run '{run}' exists: using its stored config (ignoring new values of {', '.join(diff)})")
            config = stored
        elif config is None:
            raise MrtpoError(f"no run named '{run}' and no config to create it with")
        self.config = cfg = config
        self.method = A.parse_method(cfg.method)
        self.family = family or get_family(cfg.task)
        exs = self.family.load_examples(cfg.examples) if cfg.examples else self.family.examples()
        if cfg.example_ids:
            by_id = {e.id: e for e in exs}
            missing = [i for i in cfg.example_ids if i not in by_id]
            if missing:
                raise MrtpoError(f"task '{cfg.task}' has no example(s) {', '.join(missing)}")
            exs = [by_id[i] for i in cfg.example_ids]
        if not exs:
            raise MrtpoError(f"task '{cfg.task}' has no examples to train on")
        self.examples = exs
        self.template = template_for(self.family, cfg.template)
        self._setup_model(lm)
        self.steps_done = 0
        self.probe: list[dict] = []
        self._mu = threading.Lock()
        self._owner: str | None = None  # the lock's owner token while train() holds it
        self._seen: tuple | None = None  # the store's mark this trainer's memory matches (None: restore first)
        if store is not None:
            if existing is None:
                self.run_id = store.create_run(run, cfg.to_dict()).id
                try:
                    with store.locked(self.run_id) as self._owner:
                        self._init_probe()
                finally:
                    self._owner = None
                self._seen = self._store_mark()
            else:
                self.run_id = existing.id
                self.probe = store.probe(self.run_id)
                try:
                    self._restore(existing)  # reads only: steps after the checkpoint are dropped under the lock
                except MrtpoError:
                    if store.lock_holder(self.run_id) is None:
                        raise
                    self.steps_done = existing.last_checkpoint  # being trained now: train() restores under the lock

    # ------------------------------------------------------------------------------------------ model
    def _setup_model(self, lm: LoadedModel | None) -> None:
        cfg = self.config
        torch.manual_seed(cfg.seed)
        lm = lm or load_model(cfg.model, cfg.device)
        model = lm.model
        self.reference = None
        if cfg.lora:
            from peft import LoraConfig, get_peft_model

            for p in model.parameters():
                p.requires_grad_(False)
            model = get_peft_model(model, LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        else:
            for p in model.parameters():
                p.requires_grad_(True)
            if cfg.kl_coef > 0:
                self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        model.eval()  # no dropout: deterministic; gradients still flow
        self.lm = LoadedModel(model=model, tokenizer=lm.tokenizer, name=lm.name, device=lm.device, dtype=lm.dtype)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self._pristine = True  # the initial weights and optimizer (no update or checkpoint applied yet)

    def _ref_logprobs(self, prompts, resp) -> torch.Tensor | None:
        cfg = self.config
        if cfg.kl_coef <= 0:
            return None
        tok = self.lm.tokenizer
        with torch.no_grad():
            if cfg.lora:
                with self.lm.model.disable_adapter():
                    return token_logprobs(self.lm.model, prompts, resp, tok.pad_token_id, cfg.temperature)[0]
            return token_logprobs(self.reference, prompts, resp, tok.pad_token_id, cfg.temperature)[0]

    # ------------------------------------------------------------------------------------------ schedule
    def examples_for_step(self, step: int) -> list:
        """The B examples of ``step`` (1-based): a seeded permutation of the examples per epoch."""
        B, n = self.config.prompts_per_step, len(self.examples)
        out = []
        for j in range((step - 1) * B, step * B):
            epoch, pos = divmod(j, n)
            perm = np.random.default_rng([self.config.seed, epoch]).permutation(n)
            out.append(self.examples[int(perm[pos])])
        return out

    def _sample_seed(self, step: int, b: int) -> int:
        return (self.config.seed * 1_000_003 + step * 1009 + b) % (2 ** 31)

    # ------------------------------------------------------------------------------------------ a step
    def rollout(self, step: int) -> _Rollout:
        """Sample and score the B groups of ``step`` with the current policy."""
        cfg, lm = self.config, self.lm
        groups = []
        for b, ex in enumerate(self.examples_for_step(step)):
            samples = sample(lm, ex.prompt, n=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                             temperature=cfg.temperature, top_p=cfg.top_p, seed=self._sample_seed(step, b))
            groups.append(score_group(self.family, ex, samples))
        names: list[str] = []
        for g in groups:
            names += [k for k in g.reward_names if k not in names]
        G = cfg.group_size
        R = torch.full((len(groups) * G, len(names)), float("nan"))
        prompt_ids, resp_ids = [], []
        eos = lm.tokenizer.eos_token_id
        for b, g in enumerate(groups):
            cols = [names.index(k) for k in g.reward_names]
            R[b * G:(b + 1) * G, cols] = torch.tensor(g.rewards, dtype=torch.float32)
            p = lm.encode(lm.chat_prompt(g.example.prompt))  # the prompt the responses were sampled under
            for s in g.samples:
                ended = len(s.token_ids) < cfg.max_new_tokens
                prompt_ids.append(p)
                resp_ids.append(list(s.token_ids) + ([eos] if ended else []))
        return _Rollout(groups, names, R, prompt_ids, resp_ids)

    def step(self) -> dict[str, float]:
        """One update (see module docstring); returns the step's metrics. Holds the run's lock meanwhile."""
        return self.train(1)[-1]

    def train(self, n: int, callback: Callable[[int, dict], None] | None = None,
              checkpoint_last: bool = False) -> list[dict[str, float]]:
        """``n`` updates; ``callback(step, metrics)`` after each; ``checkpoint_last``: also checkpoint the last one.

        With a store: takes the run's lock first (MrtpoError, nothing changed, if a live trainer holds it), keeps
        it alive from a heartbeat thread, syncs with the store (:meth:`_sync`), steps, releases it at the end.
        """
        if not self._mu.acquire(blocking=False):
            raise MrtpoError("this run is already training in another session of this process; watch it meanwhile")
        try:
            if self.store is None:
                return self._steps(n, callback)
            with self.store.locked(self.run_id) as self._owner:
                self._sync()
                return self._steps(n, callback, checkpoint_last)
        finally:
            self._owner = None
            self._mu.release()

    def _steps(self, n: int, callback, checkpoint_last: bool = False) -> list[dict[str, float]]:
        out = []
        for i in range(n):
            m = self._one_step(checkpoint=checkpoint_last and i == n - 1)
            out.append(m)
            if callback:
                callback(self.steps_done, m)
        return out

    def _one_step(self, checkpoint: bool = False) -> dict[str, float]:
        cfg, lm = self.config, self.lm
        s = self.steps_done + 1
        self._seen = None  # until the step is stored, memory may be ahead of the store
        torch.manual_seed(self._sample_seed(s, 10_007))
        t0 = time.perf_counter()
        ro = self.rollout(s)
        t_sample = time.perf_counter() - t0
        G, N, K = cfg.group_size, ro.R.shape[0], ro.R.shape[1]
        adv = A.compute(cfg.method, ro.R, G)
        T = max(len(r) for r in ro.resp_ids)
        mask = torch.zeros(N, T, dtype=torch.bool)
        for i, r in enumerate(ro.resp_ids):
            mask[i, : len(r)] = True
        rho = torch.ones(N, K, T)
        replays = [None] * len(ro.groups)
        t1 = time.perf_counter()
        if self.method.tokens:
            for b, g in enumerate(ro.groups):
                replays[b] = rep = replay_scored(lm, g, self.template)  # current policy, eval, no grad
                for gi, rr in enumerate(rep.responses):
                    for k, rel in rr.relevance.items():
                        rho[b * G + gi, ro.names.index(k), : len(rel)] = torch.from_numpy(rel).float()
        t_replay = time.perf_counter() - t1
        beta_s = A.smoothstep_beta(cfg.beta, s - 1, cfg.warmup) if self.method.tokens else 0.0
        tok_adv = A.token_advantages(adv, rho, mask, beta=beta_s, cap=cfg.cap) if self.method.tokens else \
            A.token_advantages(adv, None, mask, beta=0.0)
        t2 = time.perf_counter()
        upd = self._update(ro, tok_adv, mask, s)
        t_update = time.perf_counter() - t2
        step_time = time.perf_counter() - t0
        self.steps_done = s

        t3 = time.perf_counter()
        probe_rows = self._probe_rows() if self.store is not None and self.probe else []
        t_probe = time.perf_counter() - t3
        metrics = self._metrics(ro, adv, tok_adv, mask, upd, beta_s)
        metrics.update({"time/step": step_time, "time/sample": t_sample, "time/replay": t_replay,
                        "time/update": t_update, "time/probe": t_probe})
        if self.store is not None:
            rows = self._sample_rows(ro, adv, tok_adv, replays)
            t4 = time.perf_counter()
            ckpt = None
            if checkpoint or s % cfg.checkpoint_every == 0:
                ckpt = self.store.save_checkpoint(self.run_id, s, self._checkpoint_state(s), owner=self._owner)
            metrics["time/checkpoint"] = time.perf_counter() - t4
            try:
                self.store.write_step(self.run_id, s, metrics, rows, probe_rows, checkpoint=ckpt, owner=self._owner)
            except BaseException:
                if ckpt is not None:  # not recorded: remove it (unless the lock is gone: then it is not ours to touch)
                    with contextlib.suppress(Exception):
                        self.store.check_owner(self.run_id, self._owner)
                        ckpt.unlink(missing_ok=True)
                raise
            self._seen = self._store_mark()
            if ckpt is not None:
                self.store.prune_checkpoints(self.run_id, owner=self._owner)
        return metrics

    def _update(self, ro: _Rollout, tok_adv: torch.Tensor, mask: torch.Tensor, step: int) -> dict[str, float]:
        """Clipped-surrogate AdamW updates: ppo_epochs passes × minibatches; old log-probs from the sampling policy."""
        cfg, model = self.config, self.lm.model
        pad = self.lm.tokenizer.pad_token_id
        N = len(ro.resp_ids)
        dev = self.lm.device
        tok_adv, mask = tok_adv.to(dev), mask.to(dev)
        multi = cfg.ppo_epochs * cfg.minibatches > 1
        old = None
        if multi:  # one no-grad forward with the sampling weights; otherwise old = logp.detach() (ratio 1)
            with torch.no_grad():
                old = token_logprobs(model, ro.prompt_ids, ro.resp_ids, pad, cfg.temperature)[0]
        ref = self._ref_logprobs(ro.prompt_ids, ro.resp_ids)
        gen = torch.Generator().manual_seed(self._sample_seed(step, 20_011))
        losses, stats, norms = [], [], []
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(N, generator=gen) if cfg.minibatches > 1 else torch.arange(N)
            for mb in torch.tensor_split(order, cfg.minibatches):
                idx = mb.tolist()
                T = max(len(ro.resp_ids[i]) for i in idx)
                logp, _ = token_logprobs(model, [ro.prompt_ids[i] for i in idx], [ro.resp_ids[i] for i in idx],
                                         pad, cfg.temperature)
                old_mb = old[idx, :T] if old is not None else logp.detach()
                ref_mb = ref[idx, :T] if ref is not None else None
                loss, st = clipped_surrogate_loss(logp, old_mb, tok_adv[idx, :T], mask[idx, :T], cfg.clip_low,
                                                  cfg.clip_high, cfg.aggregation, ref_mb, cfg.kl_coef)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.max_grad_norm > 0:
                    norms.append(float(torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)))
                self.optimizer.step()
                self._pristine = False
                losses.append(float(loss.detach()))
                stats.append(st)
        out = {"loss": float(np.mean(losses)), "grad_norm": float(np.mean(norms)) if norms else float("nan")}
        for k in stats[0]:
            out[k] = float(np.mean([s[k] for s in stats]))
        return out

    # ------------------------------------------------------------------------------------------ metrics
    def _metrics(self, ro, adv, tok_adv, mask, upd, beta_s) -> dict[str, float]:
        R = ro.R
        m: dict[str, float] = {}
        for j, k in enumerate(ro.names):
            m[f"reward/{k}"] = float(torch.nanmean(R[:, j]))
        m["reward/mean"] = float(torch.nanmean(R))
        m["reward/all_pass"] = float(np.mean([bool(np.all(row[~np.isnan(row)] >= 1)) for row in R.numpy()]))
        f = adv.final
        m.update({"adv/mean": float(f.mean()), "adv/std": float(f.std()) if f.numel() > 1 else 0.0,
                  "adv/min": float(f.min()), "adv/max": float(f.max()),
                  "adv/nonzero_frac": float((f.abs() > 1e-6).float().mean()),
                  "adv/token_abs_mean": float(tok_adv.abs().sum() / mask.sum().clamp_min(1)),
                  "beta_s": beta_s, "response_tokens": float(mask.sum(-1).float().mean())})
        m.update(upd)
        return m

    def _sample_rows(self, ro: _Rollout, adv, tok_adv, replays) -> list[dict]:
        G, rows = self.config.group_size, []
        for b, g in enumerate(ro.groups):
            for gi, s in enumerate(g.samples):
                i = b * G + gi
                T = len(s.token_ids)
                rep = replays[b].responses[gi] if replays[b] is not None else None
                offs = rep.offsets if rep is not None else token_offsets(self.lm, s.token_ids)
                rows.append({
                    "example_id": g.example.id, "prompt": g.example.prompt, "text": s.text, "token_ids": list(s.token_ids),
                    "tokens": [s.text[a:e] for a, e in offs], "ended": len(ro.resp_ids[i]) > T,
                    "rewards": {k: float(v) for k, v in zip(g.reward_names, g.rewards[gi])},
                    "reasons": g.reasons[gi],
                    "advantage": float(adv.final[i]),
                    "per_reward_advantage": {k: float(adv.per_reward[i, ro.names.index(k)] / adv.scale)
                                             for k in g.reward_names},
                    "token_advantage": [round(float(x), 5) for x in tok_adv[i, :T]],
                    "relevance": {k: [round(float(x), 5) for x in v] for k, v in rep.relevance.items()} if rep else {},
                })
        return rows

    # ------------------------------------------------------------------------------------------ probe
    def _init_probe(self) -> None:
        """Sample the fixed probe responses (first example, initial policy) and store their step-0 relevance."""
        cfg = self.config
        if cfg.probe_size <= 0:
            return
        ex = self.examples[0]
        samples = sample(self.lm, ex.prompt, n=cfg.probe_size, max_new_tokens=cfg.max_new_tokens,
                         temperature=cfg.temperature, top_p=cfg.top_p, seed=self._sample_seed(0, 7919))
        samples = [s for s in samples if s.token_ids] or samples[:0]
        g = score_group(self.family, ex, samples)
        self.probe = [{"example_id": ex.id, "prompt": g.prompt, "text": s.text, "token_ids": list(s.token_ids),
                       "tokens": [s.text[a:e] for a, e in token_offsets(self.lm, s.token_ids)],
                       "reward_names": g.reward_names,
                       "rewards": {k: float(v) for k, v in zip(g.reward_names, g.rewards[i])},
                       "verifier_info": g.verifier_info[i]} for i, s in enumerate(samples)]
        if self.probe:
            self.store.write_probe(self.run_id, self.probe, self._probe_rows(), owner=self._owner)

    def _probe_rows(self) -> list[dict]:
        """Relevance of every probe response for every reward under the current policy (all rewards replayed)."""
        p0 = self.probe[0]
        rep = replay_group(self.lm, p0["prompt"], [p["verifier_info"] for p in self.probe],
                           [p["token_ids"] for p in self.probe], self.template, rewards=None)
        return [{"idx": i, "reward": k, "js": [round(float(x), 6) for x in r.js[k]],
                 "relevance": [round(float(x), 5) for x in r.relevance[k]]}
                for i, r in enumerate(rep.responses) for k in r.relevance]

    # ------------------------------------------------------------------------------------------ checkpoints
    def _checkpoint_state(self, step: int) -> dict:
        """What an exact resume needs: what trains (the LoRA adapter, or the trainable parameters; no frozen
        weights, no buffers), the AdamW state (two moments per trained value) and the RNG state."""
        if self.config.lora:
            from peft import get_peft_model_state_dict

            weights = {k: v.detach().cpu() for k, v in get_peft_model_state_dict(self.lm.model).items()}
        else:
            weights = {k: p.detach().cpu() for k, p in self.lm.model.named_parameters() if p.requires_grad}
        return {"step": step, "lora": self.config.lora, "model": weights,
                "optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state()}

    def _load_trainable(self, weights: dict[str, torch.Tensor], path_hint: str) -> None:
        if self.config.lora:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.lm.model, weights)
            return
        named = {k: p for k, p in self.lm.model.named_parameters() if p.requires_grad}
        missing = [k for k in named if k not in weights]  # older checkpoints hold every weight: a superset
        if missing:
            raise MrtpoError(f"run '{self.run_name}': checkpoint {path_hint} lacks {len(missing)} trained "
                             f"tensor(s) ({missing[0]}, …) of model '{self.config.model}'")
        try:
            with torch.no_grad():
                for k, p in named.items():
                    p.copy_(weights[k])
        except RuntimeError as e:
            raise MrtpoError(f"run '{self.run_name}': checkpoint {path_hint} does not fit model "
                             f"'{self.config.model}': {str(e).splitlines()[0]}") from None

    def _restore(self, run: RunInfo) -> None:
        """Bring this trainer to the run's last checkpoint (weights, AdamW, RNG; the initial state when there is
        none). Reads the store only; steps stored after the checkpoint are dropped by :meth:`_sync`."""
        self._seen = None
        state = self.store.load_checkpoint(run)
        if state is None:
            if not self._pristine:
                self._setup_model(None)  # back to the initial weights and a fresh optimizer
        else:
            self._load_trainable(state["model"], str(self.store.checkpoint_file(run)))
            self.optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["torch_rng"])
            self._pristine = False
            self.log(f"run '{self.run_name}': resumed from the checkpoint of step {run.last_checkpoint}")
        self.steps_done = run.last_checkpoint
        self._seen = self._mark(run)

    @staticmethod
    def _mark(run: RunInfo) -> tuple:
        return run.steps_done, run.last_checkpoint, run.updated

    def _store_mark(self) -> tuple:
        return self._mark(self.store.require_run(self.run_name))

    def _sync(self) -> None:
        """Under the lock: if the store moved since this trainer last matched it (another trainer, or a failed
        step of this one), restore from its last checkpoint; then drop stored steps after that checkpoint."""
        run = self.store.require_run(self.run_name)
        if self._mark(run) != self._seen:
            self._restore(run)
        if run.steps_done > self.steps_done:
            self.log(f"run '{self.run_name}': steps {self.steps_done + 1}..{run.steps_done} came after the last "
                     f"checkpoint (step {self.steps_done}); dropping and recomputing them")
            self.store.truncate(self.run_id, self.steps_done, owner=self._owner)
            self._seen = self._store_mark()

    def close(self) -> None:
        """Release resources (the lock is only held while stepping)."""
        self.reference = None


def weights_digest(model: torch.nn.Module) -> float:
    """A cheap fingerprint of the trainable weights (sum of |w|), for tests and the CLI."""
    return float(sum(p.detach().abs().double().sum() for p in model.parameters() if p.requires_grad))
