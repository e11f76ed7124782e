"""MRTPO inside TRL: a small ``trl.GRPOTrainer`` subclass (optional extra ``trl``; tested with trl 1.16).

What it changes, and nothing else: after TRL has generated and scored a batch
(``_generate_and_score_completions``), the advantages are recomputed with mrtpo's estimator registry from TRL's
gathered per-reward-function rewards (N, K) and, for MRTPO methods, spread over the tokens by relevance:

1. for ``mrtpo`` / ``mrtpo+<estimator>`` (when β_s > 0): each local completion is replayed with the policy being
   trained (:func:`mrtpo.replay.replay_groups`, every group of the batch at once, no gradient) under P_all / P_\\k
   built from a user callback ``verifier_info_fn(prompt, completion, example) -> {reward function name: text}``,
   giving ρ (B, K, T) from the relevance measure ``MRTPOConfig.measure`` (:data:`mrtpo.core.measures.MEASURES`;
   default ``"js"``, the paper's); ``"ktae"`` (the group's rewards) and ``"entropy"`` (one forward under the prompt
   at TRL's temperature) need no replay and no ``verifier_info_fn``;
2. the credit step, :func:`mrtpo.core.credit.assign_credit`: the estimator of ``method`` on TRL's gathered rewards
   (N, K) (every process' rows, as TRL does), with ``reward_weights``, and the token advantages of this process'
   rows at β_s = β · smoothstep(global_step / warmup);
3. ``inputs["advantages"]`` becomes those (B, T) token advantages, which TRL's ``_compute_loss`` accepts as is (it
   only unsqueezes 1-D advantages). Response-level methods (``gdpo``, ``dara``, ...), and MRTPO while β_s = 0,
   keep TRL's (B,) shape.

With ``MRTPOConfig(credit_log=DIR)`` each training generation's first ``credit_log_groups`` groups are written to
the credit log (:mod:`mrtpo.creditlog.trl_writer`, format :mod:`mrtpo.creditlog.format`), a folder of this run's
only: claimed when ``train()`` starts, continued by ``train(resume_from_checkpoint=...)``.

β = 0 (or ``method="gdpo"``) reproduces TRL's ``multi_objective_aggregation="normalize_then_sum"``; the token mean
of MRTPO's advantages always equals GDPO's response advantage. Rewards the callback leaves out get uniform credit.
Multi-process (accelerate / DDP) behaviour is TRL's own: generation, reward gathering and slicing are untouched.

Limits: the replay prompt is the last user turn of a conversational prompt (or the plain prompt text), wrapped in
the tokenizer's chat template; DeepSpeed ZeRO-3 is supported through TRL's ``unwrap_model_for_generation``;
completions for which every reward function returned None get advantage 0 but, unlike TRL, still count in the
batch statistics.
"""
from __future__ import annotations

import inspect
import time
from dataclasses import replace
from pathlib import PurePath
from typing import Any, Callable

import torch

from mrtpo.core.advantages import active_rewards
from mrtpo.core.credit import assign_credit, relevance_tensor
from mrtpo.core.info import INFO
from mrtpo.creditlog.trl_writer import (
    CreditLogRun,
    TrlCreditLog,
    capture,
    check_folder,
    flush,
    log_step,
    model_name,
    open_log,
)
from mrtpo.errors import MrtpoError
from mrtpo.integrations.trl_config import MRTPOConfig, MRTPOGRPOConfig
from mrtpo.integrations.trl_text import completion_text as completion_text  # noqa: F401 - kept importable from here
from mrtpo.integrations.trl_text import prompt_text
from mrtpo.model import SamplingConfig
from mrtpo.replay import GroupInput, replay_groups
from mrtpo.tune.apply import choice_relevance, replay_inputs, tuned_texts

try:
    from trl import GRPOTrainer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "mrtpo.integrations.trl needs TRL: pip install 'trl==1.16.0' (the optional extra 'trl')"
    ) from e

VerifierInfoFn = Callable[[Any, Any, dict], dict[str, str]]


def _mrtpo_config(args, given: MRTPOConfig | None) -> MRTPOConfig:
    """The trainer's MRTPOConfig: ``given`` (``mrtpo_config=``), else the one ``args`` carries (an
    :class:`MRTPOGRPOConfig`), else the defaults."""
    carried = args.mrtpo_config() if isinstance(args, MRTPOGRPOConfig) else None
    if given is not None and carried is not None and carried not in (given, MRTPOConfig()):
        raise MrtpoError("MRTPO's settings are given twice, saying different things: in args (MRTPOGRPOConfig's "
                         "mrtpo_* fields) and as mrtpo_config; give them once")
    return given or carried or MRTPOConfig()


def grpo_sampling(sampling: SamplingConfig) -> dict[str, Any]:
    """TRL's ``GRPOConfig`` sampling fields from one :class:`mrtpo.model.SamplingConfig` (the settings mrtpo's own
    sampling, CLI and app use): ``num_generations`` = group size, ``max_completion_length`` = max new tokens,
    ``temperature``, ``top_p``, and ``seed`` (TRL's run seed: its generation draws from the global generators it
    seeds).  MrtpoError for a seed TRL cannot take (numpy's: 0 to 2**32 − 1)."""
    if sampling.seed is None or not 0 <= sampling.seed < 2 ** 32:
        raise MrtpoError(f"seed {sampling.seed}: TRL seeds numpy too, which takes 0 to {2 ** 32 - 1}")
    return {"num_generations": sampling.group_size, "max_completion_length": sampling.max_new_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed}


def _takes_info(fn: Callable) -> bool:
    """Whether ``fn`` accepts a keyword ``info`` (the verifier-information regime, :mod:`mrtpo.core.info`)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "info" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class MRTPOGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with mrtpo advantages (any registry estimator, MRTPO token credit).

    Extra arguments: ``verifier_info_fn(prompt, completion, example) -> {reward function name: text}`` (needed by
    MRTPO methods; ``example`` is the dataset row; a function that also takes a keyword ``info`` gets
    ``MRTPOConfig.info``, the regime to build: ``rule``, ``findings`` or ``quoted``, else its texts are the rule by
    construction), ``replay_prompt_fn(prompt, example) -> str`` (what fills the template's ``{prompt}`` when a
    completion is replayed; default: the prompt's text, :func:`mrtpo.integrations.trl_text.prompt_text`; a task
    family's: :mod:`mrtpo.integrations.trl_tasks`). MRTPO's settings come with TRL's in ``args`` when it is an
    :class:`MRTPOGRPOConfig` (one config: ``mrtpo_method``, ``mrtpo_beta``, ...), or as ``mrtpo_config``
    (:class:`MRTPOConfig`) beside a plain ``GRPOConfig``; both at once, saying different things, is an MrtpoError.
    After each generation ``self.mrtpo_last`` holds this process' ``trl_advantages`` (B,) as TRL computed them,
    ``advantages`` ((B,) or (B, T)), ``mask`` (B, T) and the replay statistics.
    """

    def __init__(self, *args, verifier_info_fn: VerifierInfoFn | None = None,
                 mrtpo_config: MRTPOConfig | None = None,
                 replay_prompt_fn: Callable[[Any, dict], str] | None = None, **kwargs):
        self.mrtpo_config = cfg = _mrtpo_config(kwargs.get("args", args[2] if len(args) > 2 else None), mrtpo_config)
        if cfg.tokens and verifier_info_fn is None and cfg.reads.replay:
            raise MrtpoError(f"method '{cfg.method}' reallocates over tokens and needs "
                             "verifier_info_fn(prompt, completion, example) -> {reward: text} (the measures 'ktae' "
                             "and 'entropy' need none)")
        if cfg.tokens and cfg.reads.evidence:
            raise MrtpoError(f"measure '{cfg.measure}' (the oracle) needs what each checker read; TRL's reward "
                             "functions return numbers: pick another measure (js, js-contrast, ktae, entropy, ...)")
        if cfg.tokens and cfg.choice is not None and verifier_info_fn is None:
            raise MrtpoError(f"tuned={cfg.tuned!r} words each reward's verifier information: give verifier_info_fn")
        self._pass_info = verifier_info_fn is not None and _takes_info(verifier_info_fn)
        if cfg.info != INFO and cfg.tokens and not self._pass_info and cfg.reads.replay:
            raise MrtpoError(f"info='{cfg.info}': verifier_info_fn(prompt, completion, example) gives its own texts "
                             f"(the '{INFO}' regime); to build the '{cfg.info}' one, let it take a keyword 'info'")
        self.verifier_info_fn = verifier_info_fn
        self.replay_prompt_fn = replay_prompt_fn
        self.mrtpo_last: dict = {}
        self._mrtpo_batch: tuple | None = None
        run = None
        if cfg.credit_log:
            check_folder(cfg.credit_log)
            run = CreditLogRun()
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), run]
        super().__init__(*args, **kwargs)
        if cfg.choice is not None:  # a choice tuned on another model is stale (a model without a name: not checked)
            path = str(getattr(getattr(self.model, "config", None), "_name_or_path", "") or "").rstrip("/")
            cfg.choice.check(PurePath(path).name if path else None)
        # the credit log's record (mrtpo.creditlog.trl_writer): what it needs of this trainer, and its own state
        self.mrtpo_credit_log = None if run is None else TrlCreditLog(
            cfg.credit_log, cfg.credit_log_groups, cfg.credit_log_logprobs, cfg, list(self.reward_func_names),
            self._tokenizer, self.accelerator, self.args.output_dir,
            model_name(self.accelerator.unwrap_model(self.model)), self.num_generations, run)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """TRL's ``train``.  With a credit log, its folder is claimed for this run first, before any step — a run
        resumed from a checkpoint continues the log of the run that saved it, another run's log is refused
        (:func:`mrtpo.creditlog.trl_writer.open_log`) — and the log's last waiting step is written at the end
        (:func:`mrtpo.creditlog.trl_writer.flush`)."""
        if self.mrtpo_credit_log is not None:
            open_log(self.mrtpo_credit_log, resume_from_checkpoint)
        result = super().train(resume_from_checkpoint, *args, **kwargs)
        if self.mrtpo_credit_log is not None:
            flush(self.mrtpo_credit_log)
        return result

    def _compute_loss(self, model, inputs):
        self._mrtpo_capture = inputs.get("mrtpo_row")  # the credit log takes this forward's log-probs and entropy
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._mrtpo_capture = None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        idx, self._mrtpo_capture = getattr(self, "_mrtpo_capture", None), None  # the loss' first forward only
        if idx is not None and self.mrtpo_credit_log is not None:
            capture(self.mrtpo_credit_log, idx, out[0], out[1])
        return out

    # TRL calls this once per generation batch with the local rows; it returns rewards gathered over processes.
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._mrtpo_batch = (inputs, prompts, completions, completion_ids_list, rewards)
        return rewards

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        local_inputs, prompts, completions, ids_list, rewards = self._mrtpo_batch
        self._mrtpo_batch = None
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        cfg = self.mrtpo_config
        B = len(prompts)
        lo = self.accelerator.process_index * B
        mask = out["completion_mask"].bool()
        if "tool_mask" in out:
            mask = mask & out["tool_mask"].bool()
        step = self.state.global_step
        stats = {"beta": cfg.beta_at(step), "replay_seconds": 0.0, "replay_forward_tokens": 0}
        rho, replayed = None, [set()] * B
        if stats["beta"] > 0:
            rho, replayed = self._relevance(local_inputs, prompts, completions, ids_list, rewards, lo, G,
                                            mask.shape[1], stats)
        credit = assign_credit(rewards, None if rho is None else rho.to(mask.device), mask, cfg, G, step=step,
                               weights=self.reward_weights.to(rewards.device), rows=slice(lo, lo + B))
        new = (credit.final if rho is None else credit.tokens).to(out["advantages"].dtype)
        self.mrtpo_last = {"trl_advantages": out["advantages"].detach().clone(), "advantages": new.detach(),
                           "mask": mask, **stats}
        if self.mrtpo_credit_log is not None and mode == "train":
            log_step(self.mrtpo_credit_log, out, credit, rewards, prompts, ids_list, replayed, lo, G, step)
        out["advantages"] = new
        for k, v in stats.items():
            self._metrics[mode][f"mrtpo/{k}"].append(float(v))
        return out

    @torch.no_grad()
    def _relevance(self, inputs, prompts, completions, ids_list, rewards, lo: int, G: int, T: int,
                   stats: dict) -> tuple[torch.Tensor, list[set]]:
        """ρ (B, K, T) for this process' completions (replays grouped by prompt group, ones where not replayed) and
        per completion the rewards replayed."""
        from trl.models import unwrap_model_for_generation

        from mrtpo.model import LoadedModel

        names = list(self.reward_func_names)
        B = len(prompts)
        relevance: list[dict] = [{} for _ in range(B)]  # per completion {reward: (T_i,)}; missing = uniform
        by_group: dict[int, list[int]] = {}
        for i in range(B):
            if len(ids_list[i]):
                by_group.setdefault((lo + i) // G, []).append(i)
        t0 = time.perf_counter()
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                         gather_deepspeed3_params=self.args.ds3_gather_for_generation) as model:
            was_training = model.training
            model.eval()
            param = next(model.parameters())
            lm = LoadedModel(model=model, tokenizer=self._tokenizer, name="policy", device=param.device,
                             dtype=param.dtype)
            try:
                todo: list[tuple[list[int], GroupInput]] = []
                for g, rows in by_group.items():
                    infos = [self._verifier_info(prompts[i], completions[i], inputs[i], names) if self.verifier_info_fn
                             else dict.fromkeys(names, "") for i in rows]  # ktae, entropy: no texts needed
                    keys = [k for k in names if all(k in info for info in infos)]  # others: uniform credit
                    if not keys:
                        continue
                    cols = [names.index(k) for k in keys]
                    R = rewards[g * G:(g + 1) * G][:, cols].float().cpu().numpy()  # the whole group, for skipping
                    if not active_rewards(keys, R)[0]:
                        continue  # every reward constant in the group: Â = 0, nothing to reallocate
                    x = (self.replay_prompt_fn(prompts[rows[0]], inputs[rows[0]]) if self.replay_prompt_fn
                         else prompt_text(prompts[rows[0]]))
                    todo.append((rows, GroupInput(x,
                                                  [{k: info[k] for k in keys} for info in infos],
                                                  [list(ids_list[i]) for i in rows], R,
                                                  sampling_prompt=prompt_text(prompts[rows[0]]))))
                results = self._replay(lm, [gi for _, gi in todo])
                stats["replay_forward_tokens"] += results[0].forward_tokens if results else 0
                for (rows, _), res in zip(todo, results):
                    for i, r in zip(rows, res.responses):
                        relevance[i] = r.relevance
            finally:
                model.train(was_training)
        stats["replay_seconds"] = time.perf_counter() - t0
        lengths = [len(next(iter(r.values()))) if r else T for r in relevance]  # not replayed: uniform (ρ = 1)
        return relevance_tensor(relevance, names, lengths, T)[0], [set(r) for r in relevance]  # (B, K, T)

    def _replay(self, lm, inputs: list[GroupInput]) -> list:
        """Every group of the batch through one joint replay (fewer, larger passes; ``ktae``, ``entropy``: no replay,
        the entropy under the prompt at TRL's sampling temperature); with a choice file its template, and each reward
        function's ρ from its own measure."""
        cfg, choice = self.mrtpo_config, self.mrtpo_config.choice
        results = replay_groups(lm, inputs, choice.template if choice else cfg.template,
                                config=replace(cfg.replay, temperature=self.temperature),
                                measure="js" if choice else cfg.measure, **(replay_inputs(choice) if choice else {}))
        return [choice_relevance(r, choice) for r in results] if choice else results

    def _verifier_info(self, prompt, completion, example, names: list[str]) -> dict[str, str]:
        kw = {"info": self.mrtpo_config.info} if self._pass_info else {}
        info = self.verifier_info_fn(prompt, completion, example, **kw)
        if not isinstance(info, dict):
            raise MrtpoError(f"verifier_info_fn must return a dict {{reward: text}}, got {type(info).__name__}")
        unknown = [k for k in info if k not in names]
        if unknown:
            raise MrtpoError(f"verifier_info_fn returned unknown reward name(s) {unknown}; the reward functions are "
                             f"{names}")
        bad = [k for k, v in info.items() if not isinstance(v, str)]
        if bad:
            raise MrtpoError(f"verifier_info_fn must return text for every reward; not a string: {bad}")
        choice = self.mrtpo_config.choice
        return tuned_texts(choice, info) if choice is not None else info
