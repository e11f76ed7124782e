"""The embedded training loop: one config dataclass and a :class:`Trainer` whose ``step()`` is one RL update.

``step()``: sample a group per prompt with the current policy → score with the task's verifiers → per-reward
advantages from the estimator registry (``mrtpo.advantages``) → for MRTPO methods, the leave-one-out replay
with the current policy (``mrtpo.relevance``, no grad) and the token reallocation → clipped-surrogate update
on the token advantages (METHOD.md "The policy update") → metrics.

Steps are numbered from 1. Everything random is seeded from (seed, step), so a run is deterministic for a
seed on CPU, and resuming from a checkpoint reproduces the steps a run would have taken. Two seeds:
``schedule_seed`` (default: ``seed``) drives the *schedule* — which prompts each step sees, in which order
(:meth:`Trainer.examples_for_step`), and the random stream every group and the probe are sampled from
(:meth:`Trainer._sample_seed`); ``seed`` drives the rest (the initial LoRA weights, the minibatch order, the
global torch RNG at the start of a step). Runs that share the schedule seed and the initial weights are *paired*:
at step 1 they sample identical groups, and later their samples differ only because their policies do — so two
methods compared that way differ only in the estimator (``mrtpo.experiment``).

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
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from mrtpo import advantages as A
from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel, load_model, sample, token_offsets
from mrtpo.pipeline import ScoredGroup, replay_scored, score_group, template_for
from mrtpo.policy import AGGREGATIONS, clipped_surrogate_loss, load_trainable_state, token_logprobs, trainable_state
from mrtpo.relevance import measure_names, relevance_tensor, replay_group
from mrtpo.store import RunInfo, Store, validate_run_name
from mrtpo.tasks import get_family
from mrtpo.tasks.base import TaskFamily
from mrtpo.templates import Template


def _opt(default, help: str, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
         choices: tuple[str, ...] | None = None):
    """A TrainConfig field: its default, help text and allowed values (checked by ``__post_init__``; the CLI's
    ``train`` flags are generated from the same metadata)."""
    return field(default=default, metadata={"help": help, "lo": lo, "hi": hi, "lo_open": lo_open, "choices": choices})


@dataclass
class TrainConfig:
    """Everything a run needs; stored with the run as JSON."""

    model: str = _opt("default", "default | tiny-random | HF id | local folder")
    device: str = _opt("auto", "auto | cpu | cuda | cuda:N")
    task: str = _opt("instructions", "task family: instructions | tools | sql")
    examples: str | None = _opt(None, "examples JSONL in the family's format (default: built-in)")
    example_ids: list[str] | None = _opt(None, "train on these example ids only")
    method: str = _opt("mrtpo", "a name from mrtpo.advantages.method_names()")
    beta: float = _opt(0.5, "MRTPO reallocation strength β", lo=0.0, hi=1.0)
    warmup: int = _opt(10, "β smoothstep warmup in steps (0: none)", lo=0)
    cap: float | None = _opt(None, "optional cap on mean ρ² (>= 1)", lo=1.0)
    relevance_measure: str = _opt("js", "relevance measure ρ comes from (mrtpo.relevance.MEASURES; js = the "
                                        "paper's per-token JS distance)", choices=tuple(measure_names()))
    group_size: int = _opt(8, "responses per prompt G", lo=1)
    prompts_per_step: int = _opt(2, "prompts per step B (N = B·G responses)", lo=1)
    lr: float = _opt(1e-5, "AdamW learning rate", lo=0.0, lo_open=True)
    weight_decay: float = _opt(0.0, "AdamW weight decay", lo=0.0)
    clip_low: float = _opt(0.2, "ε_low: ratio clipped below at 1 − ε_low", lo=0.0, hi=0.999)
    clip_high: float = _opt(0.2, "ε_high: ratio clipped above at 1 + ε_high", lo=0.0)
    kl_coef: float = _opt(0.0, "β_KL for the k3 KL to the reference (0: no reference)", lo=0.0)
    aggregation: str = _opt("token-mean", "token-mean (over all tokens) | seq-mean", choices=AGGREGATIONS)
    ppo_epochs: int = _opt(1, "passes over each batch", lo=1)
    minibatches: int = _opt(1, "optimizer steps per pass (<= B·G)", lo=1)
    max_grad_norm: float = _opt(1.0, "gradient clipping (0: none)", lo=0.0)
    max_new_tokens: int = _opt(64, "longest sampled response", lo=1)
    temperature: float = _opt(1.0, "sampling temperature (0: greedy)", lo=0.0)
    top_p: float = _opt(1.0, "nucleus sampling", lo=0.0, hi=1.0, lo_open=True)
    seed: int = _opt(0, "seed of the initialization (LoRA) and minibatch order; of the schedule too unless "
                        "schedule_seed is given", lo=0, hi=2 ** 31 - 1)
    schedule_seed: int | None = _opt(None, "seed of the prompt order and of every sampling stream (default: seed); "
                                           "runs that share it see the same prompts and sample from the same "
                                           "streams", lo=0, hi=2 ** 31 - 1)
    lora: bool = _opt(False, "train a LoRA adapter (peft) instead of all weights")
    lora_rank: int = _opt(8, "LoRA rank", lo=1)
    lora_alpha: int = _opt(16, "LoRA alpha", lo=1)
    template: dict | None = _opt(None, "verifier-info template {prompt,item,separator}")
    checkpoint_every: int = _opt(10, "save a checkpoint every N steps (store only; the last one is kept)", lo=1)
    probe_size: int = _opt(4, "probe responses whose relevance is tracked (0: none)", lo=0)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            problem = _field_problem(f, getattr(self, f.name))
            if problem:
                raise MrtpoError(f"bad training config: {f.name} {problem}")
        A.parse_method(self.method)  # a clear MrtpoError for an unknown method
        if self.minibatches > self.group_size * self.prompts_per_step:
            raise MrtpoError(f"bad training config: minibatches ({self.minibatches}) is more than the responses "
                             f"of a step (group_size × prompts_per_step = {self.group_size * self.prompts_per_step})")
        if self.template is not None:
            Template.from_dict(self.template)  # TemplateError names the problem

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise MrtpoError(f"unknown training config field(s): {', '.join(unknown)}")
        return cls(**d)


def field_kind(f: dataclasses.Field) -> str:
    """A TrainConfig field's value type: "int", "float", "str", "bool", "list" or "dict" (None may be allowed too)."""
    return str(f.type).replace(" | None", "").split("[")[0]


def _field_problem(f: dataclasses.Field, v) -> str:
    """Why ``v`` is not a valid value of field ``f`` ('' when it is)."""
    kind, meta = field_kind(f), f.metadata
    if v is None:
        return "" if "None" in str(f.type) else "must be given"
    if kind == "bool":
        return "" if isinstance(v, bool) else f"must be true or false, not {v!r}"
    if kind in ("int", "float"):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind == "int" and not isinstance(v, int)):
            return f"must be {'an integer' if kind == 'int' else 'a number'}, not {v!r}"
        if not math.isfinite(v):
            return f"must be finite, not {v!r}"
        lo, hi = meta.get("lo"), meta.get("hi")
        if lo is not None and (v <= lo if meta.get("lo_open") else v < lo):
            return f"must be {'>' if meta.get('lo_open') else '>='} {lo:g}, not {v:g}"
        if hi is not None and v > hi:
            return f"must be <= {hi:g}, not {v:g}"
        return ""
    if kind == "str":
        if not isinstance(v, str):
            return f"must be a string, not {v!r}"
        choices = meta.get("choices")
        return f"must be one of {', '.join(choices)}, not {v!r}" if choices and v not in choices else ""
    if kind == "list":
        return "" if isinstance(v, list) and all(isinstance(x, str) for x in v) else "must be a list of strings"
    if kind == "dict":
        return "" if isinstance(v, dict) else "must be an object"
    return ""


# ---------------------------------------------------------------------------------------------- trainer
# The phases of a step, in order, as :meth:`Trainer.train` reports them to ``on_phase``.
PHASES = ("sampling", "scoring", "replay", "update", "probe", "storing")


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
        model, dtype = lm.model, lm.dtype
        if not cfg.lora and dtype != torch.float32:
            # Full fine-tuning keeps float32 master weights: AdamW steps at lr ~1e-5 are below bfloat16's resolution
            # for most weights (one bf16 step at lr 1e-5 changed 2 % of them). Sampling and the replay still decode
            # on bf16 copies (compute_dtype "auto"), and on CUDA the update's forward runs under bf16 autocast.
            model, dtype = model.float(), torch.float32
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
        self.lm = LoadedModel(model=model, tokenizer=lm.tokenizer, name=lm.name, device=lm.device, dtype=dtype)
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
    @property
    def schedule_seed(self) -> int:
        """The seed of the schedule: ``config.schedule_seed``, or ``config.seed`` when that is None."""
        c = self.config
        return c.seed if c.schedule_seed is None else c.schedule_seed

    def examples_for_step(self, step: int) -> list:
        """The B examples of ``step`` (1-based): a permutation of the examples per epoch, seeded by
        (schedule seed, epoch)."""
        B, n = self.config.prompts_per_step, len(self.examples)
        out = []
        for j in range((step - 1) * B, step * B):
            epoch, pos = divmod(j, n)
            perm = np.random.default_rng([self.schedule_seed, epoch]).permutation(n)
            out.append(self.examples[int(perm[pos])])
        return out

    @staticmethod
    def _seed_of(seed: int, step: int, b: int) -> int:
        return (seed * 1_000_003 + step * 1009 + b) % (2 ** 31)

    def _sample_seed(self, step: int, b: int) -> int:
        """The seed of sampling stream ``b`` of ``step`` (group b; the probe is step 0): from the schedule seed."""
        return self._seed_of(self.schedule_seed, step, b)

    def _own_seed(self, step: int, b: int) -> int:
        """A seed for what is not the schedule (minibatch order, the step's global RNG): from ``seed``."""
        return self._seed_of(self.config.seed, step, b)

    # ------------------------------------------------------------------------------------------ a step
    def rollout(self, step: int, on_scoring: Callable[[], None] | None = None) -> _Rollout:
        """Sample, then score, the B groups of ``step`` with the current policy (``on_scoring()`` in between)."""
        cfg, lm = self.config, self.lm
        examples = self.examples_for_step(step)
        sampled = [sample(lm, ex.prompt, n=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, top_p=cfg.top_p, seed=self._sample_seed(step, b))
                   for b, ex in enumerate(examples)]
        if on_scoring:
            on_scoring()
        groups = [score_group(self.family, ex, samples) for ex, samples in zip(examples, sampled)]
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
              checkpoint_last: bool = False,
              on_phase: Callable[[int, str, float], None] | None = None) -> list[dict[str, float]]:
        """``n`` updates; ``callback(step, metrics)`` after each; ``checkpoint_last``: also checkpoint the last one.

        ``on_phase(step, phase, seconds)`` is called as each phase of a step begins, ``seconds`` after the step
        began, with phase one of :data:`PHASES` in that order ("replay" only for MRTPO methods; "probe" and
        "storing" only with a store, "probe" only with probe responses): progress within a step.

        With a store: takes the run's lock first (MrtpoError, nothing changed, if a live trainer holds it), keeps
        it alive from a heartbeat thread, syncs with the store (:meth:`_sync`), steps, releases it at the end.
        """
        if not self._mu.acquire(blocking=False):
            raise MrtpoError("this run is already training in another session of this process; watch it meanwhile")
        try:
            if self.store is None:
                return self._steps(n, callback, on_phase=on_phase)
            with self.store.locked(self.run_id) as self._owner:
                self._sync()
                return self._steps(n, callback, checkpoint_last, on_phase)
        finally:
            self._owner = None
            self._mu.release()

    def _steps(self, n: int, callback, checkpoint_last: bool = False, on_phase=None) -> list[dict[str, float]]:
        out = []
        for i in range(n):
            m = self._one_step(checkpoint=checkpoint_last and i == n - 1, on_phase=on_phase)
            out.append(m)
            if callback:
                callback(self.steps_done, m)
        return out

    def _one_step(self, checkpoint: bool = False, on_phase=None) -> dict[str, float]:
        cfg, lm = self.config, self.lm
        s = self.steps_done + 1
        self._seen = None  # until the step is stored, memory may be ahead of the store
        torch.manual_seed(self._own_seed(s, 10_007))
        t0 = time.perf_counter()
        phase = (lambda name: on_phase(s, name, time.perf_counter() - t0)) if on_phase else (lambda name: None)
        phase("sampling")
        ro = self.rollout(s, on_scoring=lambda: phase("scoring"))
        t_sample = time.perf_counter() - t0
        G, N = cfg.group_size, ro.R.shape[0]
        adv = A.compute(cfg.method, ro.R, G)
        replays = [None] * len(ro.groups)
        t1 = time.perf_counter()
        if self.method.tokens:  # the current policy, eval, no grad
            phase("replay")
            replays = [replay_scored(lm, g, self.template, measure=cfg.relevance_measure) for g in ro.groups]
        t_replay = time.perf_counter() - t1
        # (N, K, T) relevance and (N, T) mask over the trained tokens; the EOS that ends a response is trained but
        # not replayed (uniform credit there), and so are methods without a replay
        lengths = [len(r) for r in ro.resp_ids]
        relevance = [{}] * N
        if self.method.tokens:
            flat = [rr for rep in replays for rr in rep.responses]
            relevance = [{k: np.pad(v, (0, n - len(v)), constant_values=1.0) for k, v in rr.relevance.items()}
                         for rr, n in zip(flat, lengths)]
        rho, mask = relevance_tensor(relevance, ro.names, lengths)
        beta_s = A.smoothstep_beta(cfg.beta, s - 1, cfg.warmup) if self.method.tokens else 0.0
        tok_adv = A.token_advantages(adv, rho, mask, beta=beta_s, cap=cfg.cap) if self.method.tokens else \
            A.token_advantages(adv, None, mask, beta=0.0)
        t2 = time.perf_counter()
        phase("update")
        upd = self._update(ro, tok_adv, mask, s)
        t_update = time.perf_counter() - t2
        step_time = time.perf_counter() - t0
        self.steps_done = s

        t3 = time.perf_counter()
        if self.store is not None and self.probe:
            phase("probe")
        probe_rows = self._probe_rows() if self.store is not None and self.probe else []
        t_probe = time.perf_counter() - t3
        metrics = self._metrics(ro, adv, tok_adv, mask, upd, beta_s)
        metrics.update({"time/step": step_time, "time/sample": t_sample, "time/replay": t_replay,
                        "time/update": t_update, "time/probe": t_probe})
        if self.store is not None:
            phase("storing")
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
        gen = torch.Generator().manual_seed(self._own_seed(step, 20_011))
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
                    "example_id": g.example.id, "prompt": g.example.prompt, "text": s.text,
                    "token_ids": list(s.token_ids),
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
                           [p["token_ids"] for p in self.probe], self.template, rewards=None,
                           measure=self.config.relevance_measure)
        return [{"idx": i, "reward": k, "js": [round(float(x), 6) for x in r.js[k]],
                 "relevance": [round(float(x), 5) for x in r.relevance[k]]}
                for i, r in enumerate(rep.responses) for k in r.relevance]

    # ------------------------------------------------------------------------------------------ checkpoints
    def _checkpoint_state(self, step: int) -> dict:
        """What an exact resume needs: what trains (:func:`mrtpo.policy.trainable_state`), the AdamW state and the
        RNG state."""
        return {"step": step, "lora": self.config.lora, "model": trainable_state(self.lm.model, self.config.lora),
                "optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state()}

    def _restore(self, run: RunInfo) -> None:
        """Bring this trainer to the run's last checkpoint (weights, AdamW, RNG; the initial state when there is
        none). Reads the store only; steps stored after the checkpoint are dropped by :meth:`_sync`."""
        self._seen = None
        state = self.store.load_checkpoint(run)
        if state is None:
            if not self._pristine:
                self._setup_model(None)  # back to the initial weights and a fresh optimizer
        else:
            try:
                load_trainable_state(self.lm.model, state["model"], self.config.lora)
            except MrtpoError as e:
                raise MrtpoError(f"run '{self.run_name}': checkpoint {self.store.checkpoint_file(run)} of model "
                                 f"'{self.config.model}': {e}") from None
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
