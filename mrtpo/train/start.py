"""How a run starts: the checks that its steps or its probe would otherwise fail only after the run is stored (its
prompts against the model's positions, its measure against what the model can give: :func:`check_fit`), and the
config an existing run trains with (:func:`existing_config`: its own — but one with no step stored yet takes a new
config, so a run that a failed first step left behind is never stuck with the config that failed)."""
from __future__ import annotations

from typing import Callable

from mrtpo.errors import MrtpoError
from mrtpo.groups import template_for
from mrtpo.model import LoadedModel
from mrtpo.replay.attention import attention_problem
from mrtpo.replay.estimate import prompt_tokens
from mrtpo.store import RunInfo, Store
from mrtpo.tasks import apply_options
from mrtpo.tasks.base import TaskFamily
from mrtpo.templates import Template
from mrtpo.train.config import TrainConfig, check_run_examples
from mrtpo.wording import plural


def run_examples(family: TaskFamily, cfg: TrainConfig) -> list:
    """The examples a run of ``cfg`` trains on: the family's (or ``cfg.examples``' file), with the task's options
    (``sql_compare``, ``tools_compare``, ``items``), narrowed to ``cfg.example_ids``; MrtpoError naming missing ids."""
    exs = family.load_examples(cfg.examples) if cfg.examples else family.examples()
    exs = apply_options(family, exs, sql_compare=cfg.sql_compare, tools_compare=cfg.tools_compare, items=cfg.items)
    if cfg.example_ids:
        by_id = {e.id: e for e in exs}
        missing = [i for i in cfg.example_ids if i not in by_id]
        if missing:
            raise MrtpoError(f"task '{cfg.task}' has no example(s) {', '.join(missing)}")
        exs = [by_id[i] for i in cfg.example_ids]
    if not exs:
        raise MrtpoError(f"task '{cfg.task}' has no examples to train on")
    return exs


def check_new_run(lm: LoadedModel, family: TaskFamily, cfg: TrainConfig, probe: bool) -> None:
    """What a new run of ``cfg`` would fail on, refused before it is stored: its choice file against the task and
    ``lm`` (:mod:`mrtpo.train.tuned`), then :func:`check_fit` on its examples and template. An experiment asks this
    of each arm before it creates any run."""
    from mrtpo.train.tuned import check_choice_fits, run_choice

    choice = run_choice(cfg.tuned, family)
    if choice is not None:
        check_choice_fits(choice, lm)
    template = choice.template if choice else template_for(family, cfg.template)
    check_fit(lm, family, run_examples(family, cfg), cfg, template, probe)


def check_new_runs(configs: list[TrainConfig], family: TaskFamily | None = None) -> None:
    """:func:`check_new_run` for each of ``configs`` (an experiment's new arms, sharing one model) on one load of
    their model; ``family`` overrides the task family each names."""
    if not configs:
        return
    from mrtpo.model import load_model
    from mrtpo.tasks import get_family

    lm = load_model(configs[0].model, configs[0].device)
    for cfg in configs:
        check_new_run(lm, family or get_family(cfg.task), cfg, probe=bool(cfg.probe_size))


def check_fit(lm: LoadedModel, family: TaskFamily, examples: list, cfg: TrainConfig, template: Template,
              probe: bool) -> None:
    """MrtpoError, before anything is stored or sampled, when a step or the probe (``probe``: the run samples one
    from its first example and replays it after every step) would fail on ``lm``:

    - the measure reads what the model cannot give (``attn-contrast``, attention modules of an unknown kind);
    - an example's prompt leaves fewer than ``max_new_tokens`` of the model's positions: its sampling prompt, and
      where it is replayed (a token method whose measure replays, or the probe's example) P_all, each P_\\k (and each
      rewording) with every reward's rule as its verifier information — the ``findings`` and ``quoted`` regimes add
      what the checker found, which is not known before sampling."""
    measure, reads = cfg.credit.measure, cfg.credit.reads
    replayed = cfg.credit.tokens and reads.replay
    if (replayed or probe) and reads.attention:
        problem = attention_problem(lm)
        if problem:
            raise MrtpoError(f"measure {measure}: {problem}; pick another measure (nothing was stored)")
    rows = []  # per example: (tokens of the longest prompt it runs, its id, which prompt, of any it may run)
    for j, ex in enumerate(examples):
        sizes = {"its prompt": len(lm.encode(lm.chat_prompt(ex.prompt)))}
        if replayed or probe:  # every example's: any may be the probe's first one (example_ids)
            rules = family.rule_info(ex)
            info = {k: rules.get(k, "") for k in family.reward_names(ex)}
            sizes.update(prompt_tokens(lm, family.replay_prompt(ex), info, template, reads.rewording))
        runs = sizes if replayed or j == 0 else {"its prompt": sizes["its prompt"]}
        what = max(runs, key=runs.get)
        rows.append((runs[what], ex.id, what, max(sizes.values())))
    _check_lengths(lm, rows, cfg.sampling.max_new_tokens)


def _check_lengths(lm: LoadedModel, rows: list[tuple[int, str, str, int]], T: int) -> None:
    """MrtpoError when a prompt of ``rows`` [(tokens, example id, which prompt, tokens of any it may run)] + ``T``
    passes the model's positions: the longest named, and what fits (a lower max_new_tokens, the examples that fit)."""
    limit = lm.max_length
    over = sorted((x for x in rows if x[0] + T > limit), reverse=True)
    if not over:
        return
    n, eid, what, _ = over[0]
    head = (f"{len(over)} of {plural(len(rows), 'example')} do not fit model '{lm.name}' ({limit} positions) with "
            f"max_new_tokens {T}; the longest" if len(over) > 1 else f"model '{lm.name}' accepts {limit} tokens, and")
    fixes = [f"lower max_new_tokens to at most {limit - n}"] if n < limit else []
    fit = [e for _, e, _, k in rows if k + T <= limit]
    if fit:
        more = f" and {len(fit) - 5} more" if len(fit) > 5 else ""
        fixes.append(f"train on the examples that fit (example_ids {','.join(fit[:5])}{more})")
    raise MrtpoError(f"{head} example '{eid}': {what} is {plural(n, 'token')}, {n + T} with a response of "
                     f"max_new_tokens: {' or '.join(fixes) or 'use a model with more positions'}; nothing was stored")


def existing_config(store: Store, run: RunInfo, config: TrainConfig | None,
                    log: Callable[[str], None]) -> tuple[TrainConfig, bool]:
    """The config the existing ``run`` trains with, and whether it starts over with it: ``config`` where it differs
    from the stored one and the run has no step stored (and is no experiment's: those keep the experiment's config);
    else the stored one (said when ``config`` differs)."""
    stored = TrainConfig.from_dict(run.config)
    if config is None or config.to_dict() == stored.to_dict():
        return stored, False
    old = stored.to_dict()
    diff = ", ".join(k for k, v in config.to_dict().items() if old[k] != v)
    ours = [n for n in store.experiment_names() if run.name in store.get_experiment(n).runs]
    if run.steps_done == 0 and not ours:
        log(f"run '{run.name}' has no step stored yet: starting it over with the new values of {diff}")
        return config, True
    log(f"run '{run.name}' exists: using its stored config (ignoring new values of {diff})")
    return stored, False


def store_run(store: Store, run: str, cfg: TrainConfig, examples: list, existing: RunInfo | None, restart: bool,
              log: Callable[[str], None]) -> tuple[int | None, RunInfo | None]:
    """Store the run that starts — created, or (``restart``) started over with ``cfg`` under its lock — once its
    checks passed: (its id, None); or (None, the run to resume): ``existing``, or the run another trainer created
    meanwhile with the same config."""
    if restart:
        with store.locked(existing.id) as owner:
            store.restart_run(existing.id, cfg.to_dict(), owner=owner)
        return existing.id, None
    if existing is not None:
        return None, existing
    try:
        run_id = store.create_run(run, cfg.to_dict()).id
    except MrtpoError:
        existing = store.get_run(run)  # another trainer created it meanwhile: the same run, or refused
        if existing is None:
            raise
        if TrainConfig.from_dict(existing.config).to_dict() != cfg.to_dict():
            raise MrtpoError(f"run '{run}' was created meanwhile by another trainer, with another config; "
                             f"nothing was changed") from None
        check_run_examples(store, existing.id, run, cfg.examples, examples)
        return None, existing
    log(f"creating run '{run}' in {store.path}")  # said once the run exists
    return run_id, None
