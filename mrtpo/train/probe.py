"""The probe: a few fixed responses, sampled once from the initial policy, whose relevance the trainer replays after
every step, so the Train page can show how training shifted it."""
from __future__ import annotations

from mrtpo.core.info import INFO
from mrtpo.groups import score_group
from mrtpo.model import LoadedModel, SamplingConfig, sample, token_offsets
from mrtpo.replay import replay_group
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo.templates import Template


def sample_probe(lm: LoadedModel, family: TaskFamily, example: Example, size: int, sampling: SamplingConfig,
                 seed: int, info: str = INFO) -> list[dict]:
    """``size`` responses to ``example`` (empty ones dropped), scored, as the store keeps them: example, prompt, text,
    token ids and texts, reward names and values, verifier information."""
    if size <= 0:
        return []
    samples = sample(lm, example.prompt, sampling, n=size, seed=seed)
    samples = [s for s in samples if s.token_ids] or samples[:0]
    g = score_group(family, example, samples, info)
    return [{"example_id": example.id, "prompt": g.prompt, "text": s.text, "token_ids": list(s.token_ids),
             "tokens": [s.text[a:e] for a, e in token_offsets(lm, s.token_ids)], "reward_names": g.reward_names,
             "rewards": {k: float(v) for k, v in zip(g.reward_names, g.rewards[i])},
             "verifier_info": g.verifier_info[i]} for i, s in enumerate(samples)]


def probe_rows(lm: LoadedModel, probe: list[dict], template: Template, measure: str) -> list[dict]:
    """Relevance of every probe response for every reward under the current policy (all rewards replayed), as
    store rows {idx, reward, js, relevance}; ``measure`` reads the replay (the measures that need none — the oracle,
    ``ktae``, ``entropy`` — are not what a probe of fixed responses shows: their runs' probe shows the paper's ``js``,
    :meth:`mrtpo.train.Trainer.probe_measure`)."""
    rep = replay_group(lm, probe[0]["prompt"], [p["verifier_info"] for p in probe], [p["token_ids"] for p in probe],
                       template, rewards=None, measure=measure)
    return [{"idx": i, "reward": k, "js": [round(float(x), 6) for x in r.js[k]],
             "relevance": [round(float(x), 5) for x in r.relevance[k]]}
            for i, r in enumerate(rep.responses) for k in r.relevance]
