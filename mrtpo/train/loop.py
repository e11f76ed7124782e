"""The embedded training loop: a :class:`Trainer` whose ``step()`` is one RL update.

``step()``: sample a group per prompt with the current policy → score with the task's verifiers → for MRTPO methods,
the leave-one-out replay with the current policy (:mod:`mrtpo.replay`, no grad) → the credit step
(:func:`mrtpo.core.credit.assign_credit`: the estimator's per-reward advantages, reallocated over tokens) →
clipped-surrogate update on the token advantages (:class:`mrtpo.train.policy.Policy`) → metrics.

Steps are numbered from 1. Everything random is seeded from (seed, step), so a run is deterministic for a
seed on CPU, and resuming from a checkpoint reproduces the steps a run would have taken. Two seeds:
``schedule_seed`` (default: ``seed``) drives the *schedule* — which prompts each step sees, in which order
(:meth:`Trainer.examples_for_step`), and the random stream every group and the probe are sampled from
(:meth:`Trainer._sample_seed`); ``seed`` drives the rest (the initial LoRA weights, the minibatch order). Every
draw comes from a generator of the trainer's own (:mod:`mrtpo.model.rng`), never from torch's global one, so a
trainer and the samplers beside it in one process (the app) do not change each other's results. Runs that share
the schedule seed and the initial weights are *paired*:
at step 1 they sample identical groups, and later their samples differ only because their policies do — so two
methods compared that way differ only in the estimator (:mod:`mrtpo.experiment`).

With a :class:`mrtpo.store.Store` the trainer writes every step (:class:`mrtpo.train.recorder.Recorder`: metrics,
sampled responses with their token data, probe relevance) in one transaction after the step completes, and every
``checkpoint_every`` steps (default 10) saves a checkpoint of what trains — the LoRA adapter, or the trainable
parameters — with the AdamW state (atomically: temp file, fsync, ``os.replace``), keeping only
the last one. With ``credit_log`` set, each step's first groups also go to the credit log
(:mod:`mrtpo.train.credit_writer`), a folder of this run's only: claimed when the trainer is made, continued by the
run resumed.

Resuming: ``Trainer(None, store, run)`` only reads the store (it loads the last checkpoint). ``train()`` takes
the run's lock (``Store.locked``: a heartbeat thread keeps it alive while steps run) before it changes
anything; then, if the store holds steps after the last checkpoint, it drops them and says so (they are
recomputed identically). Every write checks that this trainer still owns the lock. A step that fails (full
disk, lost lock, any error) is not stored, and the next ``train()`` restores the trainer from the store, so
memory never runs ahead of what the store has. Other trainers and viewers can read meanwhile.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Iterator

import numpy as np
import torch

from mrtpo.core.credit import MEASURE, TokenCredit, assign_credit, relevance_tensor, reward_matrix
from mrtpo.creditlog import CreditLogConfig
from mrtpo.errors import MrtpoError
from mrtpo.groups import score_group, template_for
from mrtpo.model import LoadedModel, sample, weights_fixed
from mrtpo.model.rates import busy
from mrtpo.replay import replay_groups
from mrtpo.store import RunInfo, Store, validate_run_name
from mrtpo.tasks import get_family
from mrtpo.tasks.base import TaskFamily
from mrtpo.train.config import TrainConfig, check_run_examples
from mrtpo.train.credit_writer import TrainCreditLog, log_owner, run_inputs, step_rows
from mrtpo.train.policy import Policy
from mrtpo.train.probe import probe_rows, sample_probe
from mrtpo.train.recorder import Recorder, sample_rows
from mrtpo.train.rollout import Rollout
from mrtpo.train.start import check_fit, existing_config, run_examples, store_run
from mrtpo.train.timing import PhaseClock
from mrtpo.train.tuned import check_choice_fits, run_choice
from mrtpo.tune.apply import tuned_replays


class Trainer:
    """RL on a task family with any estimator of the registry, MRTPO or not.

    ``Trainer(config)`` trains in memory; ``Trainer(config, store, run="name")`` creates the run in the store,
    or resumes it (then the stored config wins; ``config`` may be None). ``lm`` reuses an already loaded model
    (it is trained in place). ``family`` overrides the task family named by ``config.task`` (custom families).
    ``credit_log``: where this trainer writes the credit log, in place of the config's (a resumed run's included;
    not stored with the run).
    """

    def __init__(self, config: TrainConfig | None = None, store: Store | None = None, run: str | None = None,
                 lm: LoadedModel | None = None, log: Callable[[str], None] | None = None,
                 family: TaskFamily | None = None, credit_log: CreditLogConfig | None = None):
        self.log = log or (lambda msg: None)
        self.store, self.run_name, self.run_id = store, run, None
        existing, restart = self._existing_run(store, run), False
        if existing is not None:  # its own config, or (no step stored yet) the new one: it starts over
            config, restart = existing_config(store, existing, config, self.log)
        elif config is None:
            raise MrtpoError(f"no run named '{run}' and no config to create it with")
        if credit_log is not None:
            config = dataclasses.replace(config, log=credit_log)
        self.config = cfg = config
        self.credit, self.method = cfg.credit, cfg.credit.parsed
        self.family = family or get_family(cfg.task)
        self.examples = run_examples(self.family, cfg)
        if existing is not None and not restart:  # a resume reads the examples the run was created with, first
            check_run_examples(store, existing.id, run, cfg.examples, self.examples)
        self.choice = run_choice(cfg.tuned, self.family)  # a choice file: its template, wordings and measures
        self.template = self.choice.template if self.choice else template_for(self.family, cfg.template)
        self.credit_log = TrainCreditLog(cfg, log_owner(store, run, existing is not None), run_inputs(cfg, store),
                                         self.log) if cfg.log.credit_log else None  # before anything is stored
        self.policy = Policy.build(cfg, lm)
        if self.choice is not None:
            check_choice_fits(self.choice, self.lm)
        if existing is None or existing.steps_done == 0:  # what a step or the probe would fail on, refused first
            check_fit(self.lm, self.family, self.examples, cfg, self.template, bool(store and cfg.probe_size))
        self.steps_done = 0
        self.probe: list[dict] = []
        self._mu = threading.Lock()
        self._seen: tuple | None = None  # the store's mark this trainer's memory matches (None: restore first)
        self.recorder: Recorder | None = None
        if store is None:
            return
        self.run_id, existing = store_run(store, run, cfg, self.examples, existing, restart, self.log)
        if existing is None:
            check_run_examples(store, self.run_id, run, cfg.examples, self.examples)  # recorded at creation
            self.recorder = Recorder(store, self.run_id)
            with self._locked():
                self._ensure_probe()
            self._seen = self._store_mark()
        else:
            self.run_id = existing.id
            self.recorder = Recorder(store, self.run_id)
            self.probe = store.probe(self.run_id)
            try:
                self._restore(existing)  # reads only: steps after the checkpoint are dropped under the lock
            except MrtpoError:
                if store.lock_holder(self.run_id) is None:
                    raise
                self.steps_done = existing.last_checkpoint  # being trained now: train() restores under the lock

    @staticmethod
    def _existing_run(store: Store | None, run: str | None) -> RunInfo | None:
        if store is None:
            return None
        if not run:
            raise MrtpoError("a run stored in the run store needs a name")
        existing = store.get_run(run)
        if existing is None:
            validate_run_name(run)
        return existing

    @property
    def lm(self) -> LoadedModel:
        """The model being trained (in place)."""
        return self.policy.lm

    @contextlib.contextmanager
    def _locked(self, owner: str | None = None) -> Iterator[None]:
        """Hold the run's lock (the recorder's writes carry its owner token meanwhile); with ``owner``, the lock the
        caller holds already under that token (an experiment's claim: checked, kept at the end)."""
        with contextlib.ExitStack() as stack:
            if owner is None:
                owner = stack.enter_context(self.store.locked(self.run_id))
            else:
                self.store.check_owner(self.run_id, owner)
            self.recorder.owner = owner
            try:
                yield
            finally:
                self.recorder.owner = None

    def _ensure_probe(self) -> None:
        """Under the lock, before the first step: sample the probe responses and store their relevance under the
        initial policy, when the run wants some and has none yet (a new run, or one an experiment created)."""
        cfg = self.config
        if self.probe or cfg.probe_size <= 0 or self.steps_done != 0:
            return
        self.probe = self.store.probe(self.run_id)  # another trainer may have stored it meanwhile
        if self.probe:
            return
        self.probe = sample_probe(self.lm, self.family, self.examples[0], cfg.probe_size, cfg.sampling,
                                  self._sample_seed(0, 7919), cfg.credit.info)
        if self.probe:
            self.recorder.write_probe(self.probe, self._probe_rows())

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
        """A seed for what is not the schedule (the minibatch order): from ``seed``."""
        return self._seed_of(self.config.seed, step, b)

    # ------------------------------------------------------------------------------------------ a step
    def rollout(self, step: int, clock: PhaseClock | None = None) -> Rollout:
        """Sample, then score, the B groups of ``step`` with the current policy (``clock``: the phases timed)."""
        s, lm = self.config.sampling, self.lm
        clock = clock or PhaseClock(step)
        examples = self.examples_for_step(step)
        clock.start("sampling")
        sampled = [sample(lm, ex.prompt, s, seed=self._sample_seed(step, b)) for b, ex in enumerate(examples)]
        clock.start("scoring")
        groups = [score_group(self.family, ex, samples, self.credit.info) for ex, samples in zip(examples, sampled)]
        names, R = reward_matrix([dict(zip(g.reward_names, row)) for g in groups for row in g.rewards.tolist()])
        prompt_ids, resp_ids = [], []
        eos = lm.tokenizer.eos_token_id
        for g in groups:
            p = lm.encode(lm.chat_prompt(g.example.prompt))  # the prompt the responses were sampled under
            for smp in g.samples:
                ended = len(smp.token_ids) < s.max_new_tokens
                prompt_ids.append(p)
                resp_ids.append(list(smp.token_ids) + ([eos] if ended else []))
        clock.stop()
        return Rollout(groups, names, R, prompt_ids, resp_ids)

    def credit_for(self, ro: Rollout, step: int, clock: PhaseClock) -> tuple[TokenCredit, list, list[dict]]:
        """The step's credit: for MRTPO methods each group's relevance from :func:`mrtpo.replay.replay_groups` with the
        current policy (eval, no grad): the replay where the measure reads it, else what the measure reads instead (the
        checkers' evidence for the oracle, the group's rewards for ``ktae``, the sampler's entropies for ``entropy``;
        :mod:`mrtpo.replay.noreplay`) — then :func:`assign_credit` over the trained tokens (the EOS that ends a
        response is trained but not replayed: uniform credit there), at β_s = β · smoothstep((step − 1) / warmup).
        The phase ``replay`` is timed where the model runs for it.  Returns the credit, the results (None per group of
        a response-level method) and the relevance used, per response {reward: ρ (T,)}."""
        replays: list = [None] * len(ro.groups)
        relevance: list[dict] = [{}] * ro.R.shape[0]
        config = dataclasses.replace(self.config.replay, temperature=self.config.sampling.temperature)
        if self.method.tokens and self.choice is not None:  # each reward worded and measured as the choice says
            clock.start("replay")
            replays = tuned_replays(self.lm, ro.groups, self.choice, self.family, config=config)[1]
            relevance = [rr.relevance for rep in replays for rr in rep.responses]
            clock.stop()
        elif self.method.tokens:
            if self.credit.reads.model:
                clock.start("replay")
            replays = replay_groups(self.lm, ro.groups, self.template, measure=self.credit.measure, config=config)
            relevance = [rr.relevance for rep in replays for rr in rep.responses]
            clock.stop()
        rho, mask = relevance_tensor(relevance, ro.names, [len(r) for r in ro.resp_ids], pad=True)
        credit = assign_credit(ro.R, rho if self.method.tokens else None, mask, self.credit,
                               self.config.sampling.group_size, step=step - 1)
        return credit, replays, relevance

    def _update(self, ro: Rollout, tok_adv: torch.Tensor, mask: torch.Tensor, step: int) -> dict[str, float]:
        with busy():  # model work: a sampling measured beside it (the app's) shared the machine
            return self.policy.update(self.config, ro.prompt_ids, ro.resp_ids, tok_adv, mask,
                                      self._own_seed(step, 20_011))

    def _one_step(self, checkpoint: bool = False, on_phase=None) -> dict[str, float]:
        s = self.steps_done + 1
        self._seen = None  # until the step is stored, memory may be ahead of the store
        clock = PhaseClock(s, on_phase)
        with weights_fixed(self.lm):  # no update until both are done: sampling and the replays share cast copies
            ro = self.rollout(s, clock)
            credit, replays, relevance = self.credit_for(ro, s, clock)
        log_rows = step_rows(self.policy, self.config, ro, credit, relevance, s) if self.credit_log else None
        clock.start("update")
        upd = self._update(ro, credit.tokens, credit.mask, s)
        clock.stop()
        step_time = clock.elapsed()
        self.steps_done = s
        probe = []
        if self.store is not None and self.probe:
            clock.start("probe")
            probe = self._probe_rows()
            clock.stop()
        metrics = self._metrics(ro, credit, upd)
        # the groups replay jointly: each result holds the joint replay's count
        for name in ("forward_tokens", "attention_pairs"):
            counted = [getattr(r, name, 0) for r in replays if r is not None]
            metrics[f"replay/{name}"] = float(max(counted, default=0))
        metrics.update({"time/step": step_time, **clock.metrics("time/sample", "time/replay", "time/update",
                                                                  "time/probe")})
        if self.store is not None:
            clock.start("storing")
            rows = sample_rows(self.lm, ro, credit, replays, relevance)
            due = checkpoint or s % self.config.checkpoint_every == 0
            self.recorder.write_step(s, metrics, rows, probe, self.policy.state(s) if due else None, clock)
            self._seen = self._store_mark()
        if log_rows is not None:
            self.credit_log.write(s, log_rows)
        return metrics

    def _metrics(self, ro: Rollout, credit: TokenCredit, upd: dict) -> dict[str, float]:
        R, f, mask = ro.R, credit.final, credit.mask
        m: dict[str, float] = {}
        for j, k in enumerate(ro.names):
            m[f"reward/{k}"] = float(torch.nanmean(R[:, j]))
        m["reward/mean"] = float(torch.nanmean(R))
        m["reward/all_pass"] = float(np.mean([bool(np.all(row[~np.isnan(row)] >= 1)) for row in R.numpy()]))
        m.update({"adv/mean": float(f.mean()), "adv/std": float(f.std()) if f.numel() > 1 else 0.0,
                  "adv/min": float(f.min()), "adv/max": float(f.max()),
                  "adv/nonzero_frac": float((f.abs() > 1e-6).float().mean()),
                  "adv/token_abs_mean": float(credit.tokens.abs().sum() / mask.sum().clamp_min(1)),
                  "beta_s": credit.beta, "response_tokens": float(mask.sum(-1).float().mean()),
                  "prompt_tokens": float(np.mean([len(p) for p in ro.prompt_ids]))})
        m.update(upd)
        return m

    def _probe_rows(self) -> list[dict]:
        return probe_rows(self.lm, self.probe, self.template, self.probe_measure)

    @property
    def probe_measure(self) -> str:
        """The measure the probe shows: the run's where it reads the replay, else the paper's ``js``."""
        return self.credit.measure if self.credit.reads.replay else MEASURE

    # ------------------------------------------------------------------------------------------ training
    def step(self) -> dict[str, float]:
        """One update (see module docstring); returns the step's metrics. Holds the run's lock meanwhile."""
        return self.train(1)[-1]

    def train(self, n: int | None = None, callback: Callable[[int, dict], None] | None = None,
              checkpoint_last: bool = False, on_phase: Callable[[int, str, float], None] | None = None, *,
              until: int | None = None, owner: str | None = None) -> list[dict[str, float]]:
        """``n`` updates, or (``until``) as many as the run needs to have ``until`` steps, counted under the run's
        lock after syncing with the store (so trainers of one run that started together never train it past
        ``until``); ``callback(step, metrics)`` after each; ``checkpoint_last``: also checkpoint the last one.
        ``owner``: the run's lock is held already under that token (an experiment's claim).

        ``on_phase(step, phase, seconds)`` is called as each phase of a step begins, ``seconds`` after the step
        began, with phase one of :data:`mrtpo.train.timing.PHASES` in that order ("replay" only for MRTPO methods;
        "probe" and "storing" only with a store, "probe" only with probe responses): progress within a step.

        With a store: takes the run's lock first (MrtpoError, nothing changed, if a live trainer holds it), keeps
        it alive from a heartbeat thread, syncs with the store (:meth:`_sync`), steps, releases it at the end.
        """
        if (n is None) == (until is None):
            raise ValueError("give the number of steps n, or until")
        if not self._mu.acquire(blocking=False):
            raise MrtpoError("this run is already training in another session of this process; watch it meanwhile")
        try:
            if self.store is None:
                return self._steps(n if until is None else max(0, until - self.steps_done), callback,
                                   on_phase=on_phase)
            with self._locked(owner):
                self._sync()
                todo = n if until is None else max(0, until - self.steps_done)
                return self._steps(todo, callback, checkpoint_last, on_phase)
        finally:
            self._mu.release()

    def _steps(self, n: int, callback, checkpoint_last: bool = False, on_phase=None) -> list[dict[str, float]]:
        if self.credit_log and n:
            self.credit_log.resume(self.steps_done)  # logged steps past the resume point go, as stored ones do
        out = []
        for i in range(n):
            m = self._one_step(checkpoint=checkpoint_last and i == n - 1, on_phase=on_phase)
            out.append(m)
            if callback:
                callback(self.steps_done, m)
        return out

    # ------------------------------------------------------------------------------------------ resuming
    def _restore(self, run: RunInfo) -> None:
        """Bring this trainer to the run's last checkpoint (weights and AdamW; the initial state when there is
        none). Reads the store only; steps stored after the checkpoint are dropped by :meth:`_sync`."""
        self._seen = None
        state = self.store.load_checkpoint(run)
        if state is None:
            if not self.policy.pristine:
                self.policy = Policy.build(self.config)  # the initial weights (loaded again), a fresh optimizer
        else:
            try:
                self.policy.load(state)
            except MrtpoError as e:
                raise MrtpoError(f"run '{self.run_name}': checkpoint {self.store.checkpoint_file(run)} of model "
                                 f"'{self.config.model}': {e}") from None
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
            self.recorder.truncate(self.steps_done)
            self._seen = self._store_mark()
        self._ensure_probe()

    def close(self) -> None:
        """Release resources (the lock is only held while stepping)."""
        self.policy.reference = None
