"""One group end to end: sample → score with the verifiers → replay → advantages per token.

Shared by the CLI (``explain``, ``sample``), the app and the trainer, so each step has one implementation.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from mrtpo import advantages as adv_mod
from mrtpo.errors import MrtpoError
from mrtpo.faithfulness import group_summary, pair_metrics, response_metrics, summarize
from mrtpo.model import LoadedModel, Sample, sample
from mrtpo.relevance import (
    ReplayConfig,
    ReplayResult,
    ResponseRelevance,
    active_rewards,
    relevance_tensor,
    replay_group,
)
from mrtpo.tasks.base import Example, Span, TaskFamily
from mrtpo.templates import Template


@dataclass
class ScoredGroup:
    """A group of responses to one example with every reward's score, reason and verifier information."""

    example: Example
    prompt: str  # fills the template's {prompt} for the replay (family.replay_prompt; usually example.prompt)
    samples: list[Sample]
    reward_names: list[str]
    rewards: np.ndarray  # (G, K)
    reasons: list[dict[str, str]]  # per response: {reward: reason}
    verifier_info: list[dict[str, str]]  # per response: {reward: text}
    # per response: {reward: the character spans its checker read (Score.evidence; None = the whole response)};
    # [] when no verifier scored the group (typed rewards)
    evidence: list[dict[str, list[Span] | None]] = field(default_factory=list)

    @classmethod
    def unscored(cls, example: Example, samples: Sequence[Sample], reward_names: Sequence[str],
                 verifier_info: dict[str, str] | Sequence[dict[str, str]], rewards=None) -> "ScoredGroup":
        """A group no verifier scored: rewards given (G, K) or all 0 (typed later), no reasons, the example's prompt.

        verifier_info: one {reward: text} shared by the group, or one per response."""
        G, names = len(samples), list(reward_names)
        infos = [dict(verifier_info) for _ in samples] if isinstance(verifier_info, dict) else \
            [dict(v) for v in verifier_info]
        R = np.zeros((G, len(names))) if rewards is None else np.asarray(rewards, dtype=float).reshape(G, len(names))
        return cls(example, example.prompt, list(samples), names, R, [{k: "" for k in names} for _ in samples], infos)

    def subset(self, idx: Sequence[int]) -> "ScoredGroup":
        """The same group restricted to the responses ``idx`` (in that order)."""
        idx = list(idx)
        return ScoredGroup(self.example, self.prompt, [self.samples[i] for i in idx], self.reward_names,
                           self.rewards[idx], [self.reasons[i] for i in idx], [self.verifier_info[i] for i in idx],
                           [self.evidence[i] for i in idx] if self.evidence else [])


def score_group(family: TaskFamily, example: Example, samples: Sequence[Sample]) -> ScoredGroup:
    names = family.reward_names(example)
    R = np.zeros((len(samples), len(names)))
    reasons, infos, evidence = [], [], []
    for i, s in enumerate(samples):
        sc = family.score(example, s.text)
        R[i] = [sc[k].value for k in names]
        reasons.append({k: sc[k].reason for k in names})
        evidence.append({k: sc[k].evidence for k in names})
        info = family.verifier_info(example, s.text, sc)
        infos.append({k: info[k] for k in names})
    return ScoredGroup(example, family.replay_prompt(example), list(samples), names, R, reasons, infos, evidence)


def sample_group(lm: LoadedModel, family: TaskFamily, example: Example, n: int = 8, max_new_tokens: int = 96,
                 temperature: float = 1.0, seed: int | None = 0) -> ScoredGroup:
    samples = sample(lm, example.prompt, n=n, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    return score_group(family, example, samples)


def varied_rewards(group: ScoredGroup) -> list[str]:
    """The rewards that vary within the group (the others are constant: advantage 0 for every response)."""
    return active_rewards(group.reward_names, group.rewards)[0]


@dataclass
class SampleTry:
    """One try of :func:`sample_until_varied`: its seed, the rewards that varied and those that did not, the group's
    mean of each reward, the seconds it took (sampling and scoring) and whether its group is the one returned."""

    index: int  # 1-based
    seed: int
    varied: list[str]
    constant: list[str]
    means: dict[str, float]
    seconds: float
    kept: bool = False  # set on the try whose group sample_until_varied returns


def sample_until_varied(lm: LoadedModel | None, family: TaskFamily, example: Example, tries: int, n: int = 8,
                        max_new_tokens: int = 96, temperature: float = 1.0, seed: int = 0,
                        on_try: Callable[[SampleTry], None] | None = None,
                        sample_fn: Callable[[int], Sequence[Sample]] | None = None, want: int = 1
                        ) -> tuple[ScoredGroup, list[SampleTry]]:
    """Sample and score groups with seeds ``seed``, ``seed + 1``, … — at most ``tries`` of them — until **at least
    ``want`` rewards vary** within the group (default one; ``want`` is capped at the number of rewards). A reward
    constant in the group gives every response advantage 0, so a group where every reward is constant has nothing
    to show or learn; the app asks for more varying rewards than its current group has.

    Returns the first group in which ``want`` rewards vary, else the one tried where the most rewards varied (the
    latest of equals: the last one when none varied), and the list of tries; ``on_try(SampleTry)`` is called
    after each.  ``sample_fn(seed) -> samples`` replaces sampling from ``lm`` (the app passes its cached sampler;
    ``lm`` may then be None).  Greedy sampling (``temperature`` 0) gives the same group for every seed, so it makes
    one try only.
    """
    if not isinstance(tries, int) or isinstance(tries, bool) or tries < 1:
        raise MrtpoError(f"tries must be an integer >= 1, got {tries!r}")
    if not isinstance(want, int) or isinstance(want, bool) or want < 1:
        raise MrtpoError(f"want must be an integer >= 1, got {want!r}")
    if sample_fn is None:
        def sample_fn(s: int) -> list[Sample]:
            return sample(lm, example.prompt, n=n, max_new_tokens=max_new_tokens, temperature=temperature, seed=s)
    out: list[SampleTry] = []
    best = None
    for j in range(1 if temperature == 0 else tries):
        t0 = time.perf_counter()
        group = score_group(family, example, sample_fn(seed + j))
        varied, constant = active_rewards(group.reward_names, group.rewards)
        means = {k: float(np.nanmean(group.rewards[:, c])) if np.isfinite(group.rewards[:, c]).any() else float("nan")
                 for c, k in enumerate(group.reward_names)}
        out.append(SampleTry(j + 1, seed + j, varied, constant, means, time.perf_counter() - t0))
        if on_try:
            on_try(out[-1])
        if best is None or len(varied) >= len(best[1]):
            best = (group, varied, out[-1])
        if len(varied) >= min(want, len(group.reward_names)) and varied:
            break
    best[2].kept = True
    return best[0], out


def template_for(family: TaskFamily | None, override: Template | dict | None = None) -> Template:
    if isinstance(override, Template):
        return override
    if override is not None:
        return Template.from_dict(override)
    return Template.from_dict(family.template) if family is not None and family.template else Template()


def replay_scored(lm: LoadedModel, group: ScoredGroup, template: Template, skip_constant: bool = True,
                  config: ReplayConfig | None = None, measure: str = "js") -> ReplayResult:
    """Replay a scored group; rewards constant in the group are skipped when ``skip_constant``; relevance from the
    measure named ``measure`` (:data:`mrtpo.relevance.MEASURES`)."""
    return replay_group(lm, group.prompt, group.verifier_info, group.samples, template,
                        rewards=group.rewards if skip_constant else None, config=config, measure=measure)


@dataclass
class TokenView:
    """Everything the heatmaps show for a group under one method and β (all numpy, per response)."""

    method: str
    beta: float
    reward_names: list[str]
    rewards: np.ndarray  # (G, K)
    per_reward: np.ndarray  # (G, K) response-level per-reward advantage (uniform over tokens)
    final: np.ndarray  # (G,) response-level advantage
    tokens: list[list[dict]]  # per response: [{text, start, end}]
    texts: list[str]
    relevance: list[dict[str, np.ndarray]]  # per response: reward -> (T,) (ones for skipped rewards)
    js: list[dict[str, np.ndarray]]
    token_adv_per_reward: list[dict[str, np.ndarray]]  # per response: reward -> (T,) A_ikt (weighted)
    token_adv: list[np.ndarray]  # per response: (T,) combined A_it after batch normalization
    diagnostics: dict = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # rewards constant in the group: not replayed, advantage 0
    measure: str = "js"  # the relevance measure ρ comes from
    # per response: {reward: evidence spans (None = whole response)}; [] when the group has no verifier evidence
    evidence: list[dict[str, list[Span] | None]] = field(default_factory=list)

    def moved(self, i: int, reward: str) -> np.ndarray:
        """(T,) what the token method moved of ``reward``'s advantage in response ``i``: its token row minus the
        estimator's uniform share, A'_ikt − Â_ik / scale = f_i · w_k Â_ik β_s (ρ_ikt − 1)
        (:func:`mrtpo.advantages.token_advantages_per_reward`). Its token sum is 0 (ρ has mean 1): MRTPO only
        moves a reward's advantage between the response's tokens. All 0 for a response-level method or β = 0."""
        return self.token_adv_per_reward[i][reward] - float(self.per_reward[i, self.reward_names.index(reward)])

    def faithfulness(self, i: int, reward: str):
        """:class:`mrtpo.faithfulness.PairMetrics` of response ``i``'s relevance for ``reward`` against its evidence
        (None without evidence, or for a reward not replayed)."""
        if not self.evidence or reward in self.skipped:
            return None
        spans = self.evidence[i].get(reward)
        offsets = [(t["start"], t["end"]) for t in self.tokens[i]]
        return pair_metrics(self.relevance[i][reward], offsets, spans, self.texts[i])


def token_view(group: ScoredGroup, replay: ReplayResult, method: str = "mrtpo", beta: float = 0.5,
               weights=None, cap: float | None = None, measure: str | None = None) -> TokenView:
    """Advantages of ``method`` for one group, spread over tokens by the replay's relevance (no model calls).

    measure: re-derive relevance with this measure first (:meth:`ReplayResult.with_measure`; default: the replay's).
    """
    if measure is not None:
        replay = replay.with_measure(measure)
    G, K = group.rewards.shape
    adv = adv_mod.compute(method, torch.tensor(group.rewards, dtype=torch.float32), G, weights)
    m = adv_mod.parse_method(method)
    rho, mask = relevance_tensor([r.relevance for r in replay.responses], group.reward_names,
                                 [len(r.token_ids) for r in replay.responses])  # (G, K, T), (G, T)
    b = beta if m.tokens else 0.0
    if cap is not None:  # cap once, so the per-reward rows and the combined row use the same relevance
        rho = adv_mod.cap_second_moment(rho, mask.unsqueeze(1).expand_as(rho), cap)
    tok = adv_mod.token_advantages(adv, rho, mask, beta=b)  # (G, T)
    per_tok = adv_mod.token_advantages_per_reward(adv, rho, mask, beta=b)  # (G, K, T): Σ_k − center/scale = tok
    view = TokenView(
        method=method, beta=b, reward_names=group.reward_names, rewards=group.rewards,
        per_reward=(adv.per_reward / adv.scale).numpy(), final=adv.final.numpy(),
        tokens=[r.tokens() for r in replay.responses], texts=[r.text for r in replay.responses],
        relevance=[{k: (r.relevance[k] if k in r.relevance else np.ones(len(r.token_ids))) for k in group.reward_names}
                   for r in replay.responses],
        js=[{k: (r.js[k] if k in r.js else np.zeros(len(r.token_ids))) for k in group.reward_names}
            for r in replay.responses],
        token_adv_per_reward=[{k: per_tok[i, j, : len(r.token_ids)].numpy() for j, k in enumerate(group.reward_names)}
                              for i, r in enumerate(replay.responses)],
        token_adv=[tok[i, : len(r.token_ids)].numpy() for i, r in enumerate(replay.responses)],
        diagnostics={k: (v.tolist() if hasattr(v, "tolist") else v)
                     for k, v in adv.diagnostics.items() if k != "zscore"},
        skipped=list(replay.skipped), measure=replay.measure, evidence=list(group.evidence),
    )
    return view


def stored_step_view(rows: Sequence[dict], method: str, group_size: int, beta_s: float,
                     cap: float | None = None) -> TokenView:
    """The token view of one stored training step, from what the trainer stored (``Store.samples(run, step)``:
    every response of the step, group by group, with its rewards, tokens, ``ended`` flag and relevance).

    The advantages are recomputed with ``method`` from the stored rewards, as :meth:`mrtpo.train.Trainer.rollout`
    builds its (N, K) matrix (the union of reward names in order of appearance, NaN where a reward does not apply
    to a prompt), and reallocated with the stored relevance and the step's β_s (``metrics["beta_s"]``) and the
    run's ``cap``, over the trained tokens (the response and its EOS, whose relevance is 1).  So
    ``token_adv_per_reward`` holds each reward's MRTPO row A'_ikt = Â_ik / scale + f · Â_ik β_s (ρ_ikt − 1)
    (:func:`mrtpo.advantages.token_advantages_per_reward`), ``per_reward`` GDPO's uniform Â_ik / scale, and
    ``token_adv`` the trainer's token advantages.  Rewards not replayed (constant in their group, or a
    response-level method) have ρ = 1.  The JS distances are not stored: ``js`` is NaN.
    """
    names: list[str] = []
    for r in rows:
        names += [k for k in r["rewards"] if k not in names]
    N, K = len(rows), len(names)
    R = torch.full((N, K), float("nan"))
    for i, r in enumerate(rows):
        for k, v in r["rewards"].items():
            R[i, names.index(k)] = float("nan") if v is None else float(v)
    adv = adv_mod.compute(method, R, group_size)
    m = adv_mod.parse_method(method)
    T = [len(r["token_ids"]) for r in rows]
    lengths = [t + bool(r.get("ended")) for t, r in zip(T, rows)]
    rel = [{k: list(v) + [1.0] * (n - len(v)) for k, v in r.get("relevance", {}).items()}
           for r, n in zip(rows, lengths)]
    rho, mask = relevance_tensor(rel, names, lengths)
    b = float(beta_s) if m.tokens else 0.0
    tok = adv_mod.token_advantages(adv, rho, mask, beta=b, cap=cap)  # (N, T)
    per_tok = adv_mod.token_advantages_per_reward(adv, rho, mask, beta=b, cap=cap)  # (N, K, T)
    if cap is not None:  # what the reallocation used
        rho = adv_mod.cap_second_moment(rho, mask.unsqueeze(1).expand_as(rho), cap)
    toks = [[{"text": t} for t in r["tokens"]] for r in rows]
    return TokenView(
        method=method, beta=b, reward_names=names, rewards=R.numpy(), per_reward=(adv.per_reward / adv.scale).numpy(),
        final=adv.final.numpy(), tokens=toks, texts=[r["text"] for r in rows],
        relevance=[{k: rho[i, j, :t].numpy() for j, k in enumerate(names)} for i, t in enumerate(T)],
        js=[{k: np.full(t, np.nan) for k in names} for t in T],
        token_adv_per_reward=[{k: per_tok[i, j, :t].numpy() for j, k in enumerate(names)} for i, t in enumerate(T)],
        token_adv=[tok[i, :t].numpy() for i, t in enumerate(T)],
        diagnostics={"center": float(adv.center), "scale": float(adv.scale)},
    )


def view_to_json(view: TokenView, group: ScoredGroup | None = None) -> dict:
    """Everything a view shows, as plain JSON."""
    r6 = lambda a: [round(float(x), 6) for x in a]  # noqa: E731
    out = {
        "method": view.method, "beta": view.beta, "measure": view.measure, "rewards": view.reward_names,
        "skipped": view.skipped, "responses": [],
        "diagnostics": view.diagnostics,
    }
    if group is not None:
        out["example_id"], out["prompt"] = group.example.id, group.prompt
    for i, text in enumerate(view.texts):
        item = {
            "response": text, "tokens": view.tokens[i],
            "reward_values": dict(zip(view.reward_names, r6(view.rewards[i]))),
            "advantage": round(float(view.final[i]), 6),
            "per_reward_advantage": dict(zip(view.reward_names, r6(view.per_reward[i]))),
            "js": {k: r6(v) for k, v in view.js[i].items()},
            "relevance": {k: r6(v) for k, v in view.relevance[i].items()},
            "token_advantage_per_reward": {k: r6(v) for k, v in view.token_adv_per_reward[i].items()},
            "token_advantage": r6(view.token_adv[i]),
        }
        if view.evidence:  # the characters each checker read ([start, end) pairs; null = the whole response)
            item["evidence"] = {k: None if v is None else [[int(s), int(e)] for s, e in v]
                                for k, v in view.evidence[i].items()}
            item["faithfulness"] = {}
            for k in view.reward_names:
                m = view.faithfulness(i, k)
                if m is not None:
                    item["faithfulness"][k] = {"auroc": _finite(m.auroc), "lift": _finite(m.lift),
                                               "span_auroc": _finite(m.span_auroc), "left_out": m.status or None}
        if group is not None:
            item["reasons"] = group.reasons[i]
            item["verifier_info"] = group.verifier_info[i]
        out["responses"].append(item)
    return out


def faithfulness_table(view: TokenView) -> list[dict]:
    """Per replayed reward, over the group's responses (:func:`mrtpo.faithfulness.group_summary`): pairs that count,
    mean token AUROC, share above 0.5, mean lift, mean span-peak AUROC and the pairs left out (evidence = whole
    response, nothing specific, every token). [] when the group has no verifier evidence."""
    if not view.evidence:
        return []
    rewards = [k for k in view.reward_names if k not in view.skipped]
    offsets = [[(t["start"], t["end"]) for t in toks] for toks in view.tokens]
    rows = group_summary(view.relevance, offsets, view.texts, view.evidence, rewards)
    return [{"reward": r["reward"], "measure": view.measure, "pairs": r["pairs"], "token AUROC": _finite(r["auroc"]),
             "AUROC > 0.5": _finite(r["above_chance"]), "lift": _finite(r["lift"]),
             "span-peak AUROC": _finite(r["span_auroc"]),
             "left out (whole / none / all)": "{whole} / {empty} / {all}".format(**r["left_out"])} for r in rows]


def _finite(x: float) -> float | None:
    return round(float(x), 6) if np.isfinite(x) else None


def group_table(group: ScoredGroup, replay: ReplayResult, method: str = "mrtpo") -> list[dict]:
    """One row per response: its text, each reward's value and GDPO's per-reward z-score Â, GDPO's advantage and,
    when ``method`` is another one, that method's response-level advantage (the token mean of its token advantages)."""
    G = len(group.samples)
    gd = adv_mod.compute("gdpo", torch.tensor(group.rewards, dtype=torch.float32), G)
    mv = token_view(group, replay, method=method, beta=0.0)
    z = gd.diagnostics["zscore"]
    rows = []
    for i, s in enumerate(group.samples):
        row = {"#": i, "response": s.text}
        for j, k in enumerate(group.reward_names):
            row[k] = float(group.rewards[i, j])
            row[f"Â {k}"] = round(float(z[i, j]), 3)
        row["GDPO A"] = round(float(gd.final[i]), 3)
        if method != "gdpo":
            row[f"{method} A"] = round(float(mv.final[i]), 3)
        rows.append(row)
    return rows


def relevance_change(before: ResponseRelevance, after: ResponseRelevance, rewards: Sequence[str]) -> list[dict]:
    """Per reward, how a template edit moved one response's relevance: mean JS before / after, max |Δρ| and the
    correlation of ρ before and after (NaN when either is constant). A reward not replayed counts as uniform."""
    T = len(before.token_ids)
    out = []
    for k in rewards:
        rb, ra = before.relevance.get(k, np.ones(T)), after.relevance.get(k, np.ones(T))
        jb, ja = before.js.get(k, np.zeros(T)), after.js.get(k, np.zeros(T))
        out.append({"reward": k, "mean JS before": float(jb.mean()) if T else 0.0,
                    "mean JS after": float(ja.mean()) if T else 0.0,
                    "max |Δρ|": float(np.abs(ra - rb).max()) if T else 0.0,
                    "corr(ρ before, ρ after)": float(np.corrcoef(rb, ra)[0, 1])
                    if T > 1 and rb.std() > 0 and ra.std() > 0 else float("nan")})
    return out


def faithfulness_report(lm: LoadedModel, family: TaskFamily, examples: Sequence[Example], template: Template,
                        measures: Sequence[str], group: int = 4, max_new_tokens: int = 96, temperature: float = 1.0,
                        seed: int = 0, progress: Callable[[str], None] | None = None) -> dict:
    """Sample ``group`` responses per example, score them (with evidence), replay every reward once, and measure
    each relevance measure's faithfulness to the evidence, per reward (a repeat ``id#2`` counts under ``id``).

    Returns {"rewards": {reward: {measure: summary}}, "all": {measure: summary}, "pairs": {measure: {reward:
    [(example index, PairMetrics), ...]}}, "seconds": {...}}, a summary being
    :func:`mrtpo.faithfulness.summarize`'s dict (pairs, auroc, above_chance, lift, span_auroc, left_out)."""
    pairs: dict[str, dict[str, list]] = {m: {} for m in measures}
    secs = {"sample": 0.0, "replay": 0.0, "metrics": 0.0}
    for n, ex in enumerate(examples):
        t0 = time.perf_counter()
        g = sample_group(lm, family, ex, n=group, max_new_tokens=max_new_tokens, temperature=temperature,
                         seed=seed)
        t1 = time.perf_counter()
        rep = replay_scored(lm, g, template, skip_constant=False)
        t2 = time.perf_counter()
        for m in measures:
            rm = rep.with_measure(m)
            for rr, ev in zip(rm.responses, g.evidence):
                for k, pm in response_metrics(rr.relevance, rr.offsets, rr.text, ev).items():
                    pairs[m].setdefault(k.split("#")[0], []).append((n, pm))
        t3 = time.perf_counter()
        secs["sample"] += t1 - t0
        secs["replay"] += t2 - t1
        secs["metrics"] += t3 - t2
        if progress:
            progress(f"{n + 1}/{len(examples)} {ex.id}: sample {t1 - t0:.1f} s, replay {t2 - t1:.1f} s")
    rewards = sorted({k for m in measures for k in pairs[m]})
    return {"rewards": {k: {m: summarize(p for _, p in pairs[m].get(k, [])) for m in measures} for k in rewards},
            "all": {m: summarize(p for ps in pairs[m].values() for _, p in ps) for m in measures},
            "pairs": pairs, "seconds": {k: round(v, 2) for k, v in secs.items()}}
