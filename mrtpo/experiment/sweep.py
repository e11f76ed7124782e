"""The credit sweep's result as the app shows it: bench/credit_matters.py's table (paired Δ AUC against GDPO per K
and arm, with intervals), shipped with the package so that the Teach and Train pages can draw it, and what it says
in words (:func:`verdict`)."""
from __future__ import annotations

import json
import math
import re

from mrtpo.tasks.base import sample_data

RESULT = ("results", "credit_matters.json")  # under mrtpo/sample_data: written by bench/credit_matters.py
ORACLE = "mrtpo:measure=evidence"
#: the Train page's preset "Where credit matters": seeds × steps of GDPO against the oracle (about a quarter of the
#: sweep's runs at one K: it finishes in minutes on 2 cores, as :func:`preset_minutes` estimates)
PRESET_SEEDS, PRESET_STEPS = 3, 12
#: the sweep's settings that are TrainConfig fields (the rest: seeds, steps, ks, examples)
_RUN_FIELDS = ("task", "group_size", "prompts_per_step", "max_new_tokens", "temperature", "top_p", "lr", "beta",
               "warmup", "probe_size", "info", "bf16_update", "model")


def load_sweep() -> dict | None:
    """The shipped result ``{"settings", "rows", "cpu", "date", ...}``, or None where the sweep has not been run."""
    path = sample_data(*RESULT)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def arm_title(arm: str) -> str:
    """An arm of the sweep in words: ``mrtpo:measure=js`` → "MRTPO with `js`", the oracle → "MRTPO with the oracle
    (`evidence`)", ``mrtpo:tuned=dir/checklist.json`` → "MRTPO, tuned (`checklist`)"; any other arm as it is."""
    from mrtpo.errors import MrtpoError
    from mrtpo.experiment.arms import arm_label, parse_arm

    try:
        method, overrides = parse_arm(arm)
    except MrtpoError:
        return arm
    if method == "mrtpo" and list(overrides) == ["measure"]:
        m = overrides["measure"]
        return "MRTPO with the oracle (`evidence`)" if m == "evidence" else f"MRTPO with `{m}`"
    if method == "mrtpo" and list(overrides) == ["tuned"]:
        return f"MRTPO, tuned (`{arm_label(arm).removeprefix('mrtpo.tuned-')}`)"
    return arm


def _finite(*xs) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def gain_ks(rows: list[dict], arm: str = ORACLE) -> list[int]:
    """The K at which ``arm``'s 95 % interval of Δ AUC against GDPO lies above 0."""
    return [r["k"] for r in rows if r["arm"] == arm and _finite(*r["ci95"]) and r["ci95"][0] > 0]


def verdict(rows: list[dict], arm: str = ORACLE) -> str:
    """One sentence on ``arm`` (default: the oracle) against GDPO over K: where its interval lies above 0, or, where
    none does, the largest gain the intervals leave open."""
    mine = sorted((r for r in rows if r["arm"] == arm and _finite(r["delta"], *r["ci95"])), key=lambda r: r["k"])
    if not mine:
        return "The sweep has no result for this arm."
    shown = gain_ks(rows, arm)
    each = "; ".join(f"K = {r['k']}: {r['delta']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]" for r in mine)
    if shown:
        who = "Token credit from the checkers' evidence (the oracle)" if arm == ORACLE else arm_title(arm)
        return (f"{who} learned faster than GDPO at K = {', '.join(map(str, shown))} (Δ AUC with its 95 % "
                f"interval: {each}).")
    bound = max(r["ci95"][1] for r in mine)
    if arm != ORACLE:
        return (f"{arm_title(arm)} showed no difference from GDPO (Δ AUC with its 95 % "
                f"interval: {each}); the intervals rule out a gain above {bound:+.3f} AUC at these sizes.")
    return (f"No K showed a difference from GDPO (Δ AUC with its 95 % interval: {each}); the intervals rule out a "
            f"gain above {bound:+.3f} AUC at these sizes.")


def preset_k(rows: list[dict]) -> int | None:
    """The K of the preset: where the oracle's interval lies above 0 and its Δ AUC is largest (None: no such K)."""
    ks = gain_ks(rows)
    delta = {r["k"]: r["delta"] for r in rows if r["arm"] == ORACLE}
    return max(sorted(ks), key=lambda k: delta[k]) if ks else None


def preset(res: dict | None, model: str | None = None, device: str = "auto"):
    """The Train page's preset "Where credit matters" (:class:`mrtpo.experiment.ExperimentConfig`), or None where the
    sweep showed no K at which the oracle gained: GDPO against MRTPO with the oracle's credit at :func:`preset_k`, on
    the sweep's checklists and settings, :data:`PRESET_SEEDS` × :data:`PRESET_STEPS`, on ``model`` (default: the
    sweep's). Named after K and the model, so that each model gets its own experiment in a store."""
    from mrtpo.experiment.arms import PER_RUN_FIELDS
    from mrtpo.experiment.run import ExperimentConfig
    from mrtpo.train import TrainConfig

    rows = (res or {}).get("rows") or []
    k = preset_k(rows)
    if k is None:
        return None
    s = res.get("settings", {})
    fields = {f: s[f] for f in _RUN_FIELDS if f in s}
    fields.update(items=k, device=device, checkpoint_every=PRESET_STEPS,
                  example_ids=s["examples"].split(",") if s.get("examples") not in (None, "all") else None)
    if model:
        fields["model"] = model
    base = {f: v for f, v in TrainConfig.from_dict(fields).to_dict().items() if f not in PER_RUN_FIELDS}
    tag = re.sub(r"[^A-Za-z0-9_.+-]+", "-", str(base["model"]).rsplit("/", 1)[-1])[:40]
    return ExperimentConfig(f"credit-matters-k{k}-{tag}", ["gdpo", ORACLE], PRESET_SEEDS, PRESET_STEPS, base)


def preset_minutes(res: dict) -> float | None:
    """The preset's minutes at the sweep's own pace (``step_seconds``: its mean seconds per step of each arm, on its
    CPU); None where the sweep did not record them."""
    sec = res.get("step_seconds") or {}
    if "gdpo" not in sec or ORACLE not in sec:
        return None
    return (sec["gdpo"] + sec[ORACLE]) * PRESET_SEEDS * PRESET_STEPS / 60
