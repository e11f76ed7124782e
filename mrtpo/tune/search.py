"""``mrtpo tune``'s run: sample the tuning draw's groups, replay each under every candidate wording (one replay a
wording serves every measure), score every measure × reward by token AUROC against the checkers' evidence, choose
on the tuning draw alone (:func:`mrtpo.tune.select.choose`), then judge the choice on the held-out draw — other
examples *and* other sampling seeds, never read before the choice is made — beside today's configuration
(the family's template, the rule as written, ``js``) on the same held-out groups (:func:`run_tune`).

Every group's samples and scores are kept in a :class:`mrtpo.tune.cache.TuneCache` by what decides them, so a run
that stops is resumed where it was; ``progress(done, total)`` is called after each decoding step and forward pass
(where an app's Cancel lands), ``on_stage(text)`` after each group with the time left.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from mrtpo.core.faith_metrics import response_metrics
from mrtpo.core.measures import NO_EVIDENCE
from mrtpo.errors import MrtpoError
from mrtpo.groups import score_group, template_for
from mrtpo.model import LoadedModel, Sample, SamplingConfig, sample
from mrtpo.replay import ReplayConfig, replay_groups
from mrtpo.replay.estimate import duration_text
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo.tasks.fingerprint import example_digest
from mrtpo.templates import Template
from mrtpo.tune.apply import family_texts
from mrtpo.tune.cache import TuneCache, key
from mrtpo.tune.choice import Choice, model_identity
from mrtpo.tune.select import choose, held_out_report
from mrtpo.tune.space import (
    CHOSEN,
    DEFAULT,
    DEFAULT_LAYOUT,
    DEFAULT_MEASURE,
    DEFAULT_MEASURES,
    DEFAULT_WORDING,
    LAYOUTS,
    TUNED,
    WORDINGS,
    Variant,
    check_measure,
    check_names,
    default_variant,
    layout_template,
    measure_needs,
    relevance_of,
    variants,
)


@dataclass
class Draw:
    """Examples × sampling seeds: one group per (example, seed)."""

    examples: list[Example]
    seeds: list[int]

    def groups(self) -> list[tuple[Example, int]]:
        return [(ex, s) for s in self.seeds for ex in self.examples]


@dataclass
class TuneSpec:
    """What a tuning run searches and on which draws (checked when made)."""

    family: TaskFamily
    tuning: Draw
    held_out: Draw
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    layouts: list[str] = field(default_factory=lambda: list(LAYOUTS))
    wordings: list[str] = field(default_factory=lambda: list(WORDINGS))
    measures: list[str] = field(default_factory=lambda: list(DEFAULT_MEASURES))
    min_pairs: int = 5  # a reward kind with fewer tuning pairs gets the default entry
    boot: int = 2000
    top: int = 3
    precision: str = "auto"

    def __post_init__(self):
        self.layouts = check_names(self.layouts, list(LAYOUTS), "layout")
        self.wordings = check_names(self.wordings, list(WORDINGS), "wording")
        self.measures = [check_measure(m) for m in dict.fromkeys(self.measures)]
        if not self.measures:
            raise MrtpoError("no measures to tune over")
        check_draws(self.tuning, self.held_out)

    def candidates(self) -> list[Variant]:
        """The variants replayed (:func:`mrtpo.tune.space.variants`), less those whose prompts are an earlier one's
        (a layout that is the family's own: the sql family already names each text by its reward)."""
        base, seen, out = template_for(self.family), set(), []
        for v in variants(self.layouts, self.wordings):
            same = (tuple(layout_template(v.layout, base).to_dict().values()), v.wording)
            if same not in seen:
                seen.add(same)
                out.append(v)
        return out

    def configs(self) -> dict[str, "Config"]:
        """{variant name: its Config} of the candidates."""
        base = template_for(self.family)
        return {v.name: Config(layout_template(v.layout, base), _const(WORDINGS[v.wording].text), self.measures)
                for v in self.candidates()}

    def default_config(self) -> "Config":
        return Config(layout_template(DEFAULT_LAYOUT, template_for(self.family)),
                      _const(WORDINGS[DEFAULT_WORDING].text), [DEFAULT_MEASURE])


def check_draws(tuning: Draw, held_out: Draw) -> None:
    """MrtpoError unless the two draws share no example and no sampling seed, and each has both."""
    for what, d in (("tuning", tuning), ("held-out", held_out)):
        if not d.examples or not d.seeds:
            raise MrtpoError(f"the {what} draw needs at least one example and one seed")
    shared = sorted({e.id for e in tuning.examples} & {e.id for e in held_out.examples})
    if shared:
        raise MrtpoError(f"example {shared[0]!r} is in both draws: the held-out draw must hold other examples than the "
                         "tuning draw (it judges the choice, so nothing of it may be chosen on)")
    seeds = sorted(set(tuning.seeds) & set(held_out.seeds))
    if seeds:
        raise MrtpoError(f"seed {seeds[0]} is in both draws: the held-out draw samples with other seeds than the "
                         "tuning draw")


def _const(text: str) -> Callable[[str], str]:
    return lambda reward: text


@dataclass
class Config:
    """How one replay of a group is built and read: the template, each reward's wording text, the measures scored
    (:data:`TUNED`: each reward's own, ``measure_of``)."""

    template: Template
    text_of: Callable[[str], str]
    measures: list[str]
    measure_of: Callable[[str], str] | None = None

    def needs(self, rewards: Sequence[str]) -> dict[str, bool]:
        names = [self.measure_of(k) for k in rewards] if TUNED in self.measures else self.measures
        need = measure_needs(names)
        return {"reword": need["reword"], "attention": need["attention"]}


def chosen_config(choice: Choice) -> Config:
    return Config(choice.template, lambda k: choice.entry(k).text, [TUNED], lambda k: choice.entry(k).measure)


# ---------------------------------------------------------------------------------------------- one group
class Ticker:
    """Progress over units of work (a sampling, a replay): ``progress(done, total)`` in units, each unit's own
    progress mapped into it; :meth:`left` the time left at the pace of the units computed so far."""

    def __init__(self, total: int, progress: Callable[[float, float], None] | None):
        self.total, self.done, self.progress = max(1, total), 0, progress
        self.t0, self.computed = time.perf_counter(), 0

    def part(self) -> Callable[[float, float], None] | None:
        if self.progress is None:
            return None
        base = self.done
        return lambda d, t: self.progress(base + (min(d / t, 1.0) if t > 0 else 1.0), self.total)

    def step(self, computed: bool) -> None:
        self.done += 1
        self.computed += computed
        if self.progress is not None:
            self.progress(self.done, self.total)

    def left(self) -> str:
        if not self.computed:
            return ""
        pace = (time.perf_counter() - self.t0) / self.computed
        return f"; about {duration_text(pace * (self.total - self.done))} left"


def samples_key(lm: LoadedModel, spec: TuneSpec, ex: Example, seed: int) -> str:
    """What decides a group's responses: the model, the example's content, the seed and the sampling settings."""
    s = spec.sampling
    return key("samples", model_identity(lm), lm.name, spec.family.name, example_digest(ex), seed, s.group_size,
               s.max_new_tokens, s.temperature, s.top_p, spec.precision)


def sampled(lm: LoadedModel, spec: TuneSpec, ex: Example, seed: int, cache: TuneCache, tick: Ticker
            ) -> tuple[str, list[Sample], float]:
    """The group of ``ex`` at ``seed`` (from the cache when it holds it): (its key, the samples, seconds taken)."""
    s = spec.sampling
    k = samples_key(lm, spec, ex, seed)
    rec = cache.get("samples", k)
    if rec is None:
        t0 = time.perf_counter()
        got = sample(lm, ex.prompt, replace(s, seed=seed), precision=spec.precision, progress=tick.part())
        rec = {"samples": [{"token_ids": x.token_ids, "text": x.text, "entropy": x.entropy} for x in got],
               "seconds": time.perf_counter() - t0}
        cache.put("samples", k, rec)
        tick.step(True)
    else:
        tick.step(False)
    return k, [Sample(list(x["token_ids"]), x["text"], x.get("entropy")) for x in rec["samples"]], rec["seconds"]


def pair_scores(rep, group, cfg: Config) -> dict[str, list]:
    """{measure: [[reward, response, token AUROC], ...]} over the pairs that count (no model call)."""
    out: dict[str, list] = {}
    for m in cfg.measures:
        rows = out.setdefault(m, [])
        for i, rr in enumerate(rep.responses):
            outcomes = rep.group_outcomes(i)
            rel = {k: relevance_of(cfg.measure_of(k) if m == TUNED else m, rr.measure_input(k, NO_EVIDENCE, outcomes))
                   for k in rr.relevance}
            for k, pm in response_metrics(rel, rr.offsets, rr.text, group.evidence[i]).items():
                if pm.counts:
                    rows.append([k, i, pm.auroc])
    return out


def left_out(rep, group) -> dict[str, dict[str, int]]:
    """{reward: {"whole": n, "empty": n, "all": n}}: the pairs left out, by why (the checker read the whole reply,
    nothing specific, or every token)."""
    out: dict[str, dict[str, int]] = {k: {"whole": 0, "empty": 0, "all": 0} for k in group.reward_names}
    for i, rr in enumerate(rep.responses):
        for k, pm in response_metrics(rr.relevance, rr.offsets, rr.text, group.evidence[i]).items():
            if not pm.counts:
                out[k][pm.status] += 1
    return out


def group_record(lm: LoadedModel, spec: TuneSpec, ex: Example, seed: int, configs: dict[str, Config],
                 cache: TuneCache, tick: Ticker) -> dict:
    """One group of a draw: sampled (or read back), scored by its checkers, replayed under every config (or read
    back) and scored: {"example", "seed", "rewards", "pairs": {config: {measure: rows}}, "left_out", "seconds"}."""
    skey, samples, secs = sampled(lm, spec, ex, seed, cache, tick)
    group = score_group(spec.family, ex, samples, "rule")
    rec = {"example": ex.id, "seed": seed, "rewards": list(group.reward_names), "pairs": {}, "left_out": None,
           "seconds": {"sampling": secs}}
    for name, cfg in configs.items():
        texts = {k: cfg.text_of(k) for k in group.reward_names}
        measures = ([f"{k}={cfg.measure_of(k)}" for k in group.reward_names] if TUNED in cfg.measures
                    else cfg.measures)
        ck = key("scores", skey, cfg.template.to_dict(), texts, measures)
        got = cache.get("scores", ck)
        computed = got is None
        if computed:
            t0 = time.perf_counter()
            worded = replace(group, verifier_info=family_texts(spec.family, group, texts))
            rep = replay_groups(lm, [worded], cfg.template,
                                ReplayConfig(precision=spec.precision, temperature=spec.sampling.temperature),
                                "js", progress=tick.part(), skip_constant=False, **cfg.needs(group.reward_names))[0]
            got = {"pairs": pair_scores(rep, group, cfg), "left_out": left_out(rep, group),
                   "seconds": time.perf_counter() - t0}
            cache.put("scores", ck, got)
        tick.step(computed)
        rec["pairs"][name] = got["pairs"]
        rec["left_out"] = rec["left_out"] or got["left_out"]
        rec["seconds"][name] = got["seconds"]
    return rec


# ---------------------------------------------------------------------------------------------- the run
@dataclass
class TuneResult:
    """What :func:`run_tune` found: the choice (its ``report`` filled in) and every group's record."""

    choice: Choice
    tuning: list[dict]
    held_out: list[dict]
    seconds: float


def run_draw(lm: LoadedModel, spec: TuneSpec, draw: Draw, configs: dict[str, Config], cache: TuneCache,
             tick: Ticker, what: str, on_stage: Callable[[str], None]) -> list[dict]:
    """Every group of ``draw`` (:func:`group_record`), a stage line after each."""
    out = []
    groups = draw.groups()
    for j, (ex, seed) in enumerate(groups):
        t0 = time.perf_counter()
        out.append(group_record(lm, spec, ex, seed, configs, cache, tick))
        on_stage(f"{what} {j + 1}/{len(groups)}: {spec.family.name} {ex.id}, seed {seed} "
                 f"({time.perf_counter() - t0:.1f} s){tick.left()}")
    return out


def run_tune(lm: LoadedModel, spec: TuneSpec, cache: TuneCache | None = None,
             on_stage: Callable[[str], None] | None = None,
             progress: Callable[[float, float], None] | None = None) -> TuneResult:
    """Tune (module docstring): the tuning draw, the choice made on it alone, then the held-out draw judging the
    choice beside today's configuration.  MrtpoError when no reward's checker stated evidence in the tuning draw."""
    cache = cache if cache is not None else TuneCache(None)
    say = on_stage or (lambda s: None)
    configs = spec.configs()
    tuning_groups, held_groups = len(spec.tuning.groups()), len(spec.held_out.groups())
    tick = Ticker((tuning_groups + held_groups) * (1 + len(configs)) + 2 * held_groups, progress)
    t0 = time.perf_counter()
    tuning = run_draw(lm, spec, spec.tuning, configs, cache, tick, "tuning group", say)
    choice = choose(tuning, spec, lm)  # the tuning draw alone: nothing of the held-out one exists yet
    say(f"chosen on the tuning draw: layout '{choice.layout}', default {choice.default.wording} + "
        f"{choice.default.measure}; judging it on the held-out draw")
    held_cfgs = {**configs, CHOSEN: chosen_config(choice)}
    if default_variant(spec.layouts, spec.wordings, spec.measures) is None:  # today's: replayed for the report
        held_cfgs[DEFAULT] = spec.default_config()
    tick.total = tick.done + held_groups * (1 + len(held_cfgs))
    held = run_draw(lm, spec, spec.held_out, held_cfgs, cache, tick, "held-out group", say)
    seconds = time.perf_counter() - t0
    choice.report = held_out_report(tuning, held, choice, spec, seconds)
    return TuneResult(choice, tuning, held, seconds)


def estimate_tune(lm: LoadedModel, spec: TuneSpec, cache: TuneCache | None = None):
    """Sampling and replaying what :func:`run_tune` still has to compute (groups whose samples the cache holds
    count nothing): an upper bound, as :func:`mrtpo.replay.estimate.estimate_task_group` gives one group's."""
    from mrtpo.replay.estimate import Estimate, estimate_task_group

    cache = cache if cache is not None else TuneCache(None)
    configs = spec.configs()
    need = measure_needs(spec.measures)
    s = spec.sampling
    total = Estimate()
    for draw, extra in ((spec.tuning, 0), (spec.held_out, 2)):
        for ex, seed in draw.groups():
            if cache.has("samples", samples_key(lm, spec, ex, seed)):
                continue
            total = total + estimate_task_group(lm, spec.family, ex, s.group_size, s.max_new_tokens,
                                                next(iter(configs.values())).template, precision=spec.precision,
                                                replays=len(configs) + extra, attention=need["attention"],
                                                reword=need["reword"])
    return total
