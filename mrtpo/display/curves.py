"""Training curves as the Train page shows them: metric names in words, and instruction constraints grouped per type.
Pure functions on the store's ``{key: {step: value}}`` metrics (:meth:`mrtpo.store.Store.metrics`)."""
from __future__ import annotations

TOP = ("reward/mean", "reward/all_pass")  # the curves shown first


def metric_title(key: str) -> str:
    """A panel title with the metric's full name and unit."""
    fixed = {"reward/mean": "mean reward (0–1)", "reward/all_pass": "every reward met (fraction of responses)",
             "loss": "loss (clipped surrogate)", "clip_frac": "clipped tokens (fraction)", "kl": "KL to reference (k3)",
             "grad_norm": "gradient norm (before clipping)", "ratio_mean": "probability ratio (mean)",
             "beta_s": "β_s: effective MRTPO β", "response_tokens": "response length (tokens)",
             "prompt_tokens": "prompt length (tokens)",
             "replay/forward_tokens": "replay: tokens through the model (every pass, padding included)",
             "replay/attention_pairs": "replay: (query, key) pairs its attention saw (every pass)"}
    if key in fixed:
        return fixed[key]
    group, _, name = key.partition("/")
    if group == "reward":
        return f"reward {name} (0–1)"
    if group == "type":
        return f"constraint type {name} (mean reward, 0–1)"
    if group == "time":
        return f"time: {name} (seconds)"
    if group == "adv":
        return f"response advantage: {name}"
    return key


def by_type(m: dict) -> dict:
    """``reward/<type>:<id>`` metrics averaged per constraint type (the part before ':') at each step: the mean of
    the type's constraints present at that step, as ``type/<type>``. :data:`TOP` and other reward keys pass
    through."""
    out = {k: m[k] for k in TOP if k in m}
    groups: dict[str, list[dict]] = {}
    for k, v in m.items():
        if k.startswith("reward/") and k not in TOP:
            name = k.split("/", 1)[1]
            key = f"type/{name.split(':', 1)[0]}" if ":" in name else k
            groups.setdefault(key, []).append(v)
    for key, vs in groups.items():
        steps = sorted({s for v in vs for s, x in v.items() if x is not None})
        out[key] = {s: sum(v[s] for v in vs if v.get(s) is not None) / sum(1 for v in vs if v.get(s) is not None)
                    for s in steps}
    return out


def reward_keys(series: dict[str, dict]) -> list[str]:
    """The ``reward/`` and ``type/`` keys of several runs' metrics, :data:`TOP` first, then by name."""
    keys = {k for m in series.values() for k in m if k.startswith(("reward/", "type/"))}
    return sorted(keys, key=lambda k: (k not in TOP, TOP.index(k) if k in TOP else 0, k))
