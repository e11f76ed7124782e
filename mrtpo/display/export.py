"""Everything a view shows, as plain JSON (what ``explain --json`` and the app's download write).
"""
from __future__ import annotations

import math

from mrtpo.display.tables import _finite
from mrtpo.display.token_view import TokenView
from mrtpo.groups import ScoredGroup


def view_to_json(view: TokenView, group: ScoredGroup | None = None) -> dict:
    """Everything a view shows, as plain JSON.  Only numbers that were computed, as ``relevance`` writes them: per
    response ``"js"`` holds the rewards whose JS distance a replay computed (``{}`` for a measure that needs no
    replay), ``"relevance"`` the rewards whose ρ a measure computed (a reward constant in the group, not replayed, is
    in neither: its row is ρ = 1 by definition); a value computed but not kept (a log's JS) is null."""
    r6 = lambda a: [round(float(x), 6) for x in a]  # noqa: E731
    kept = lambda a: [round(float(x), 6) if math.isfinite(x) else None for x in a]  # noqa: E731
    out = {
        "method": view.method, "beta": view.beta, "measure": view.measure, "rewards": view.reward_names,
        "skipped": view.skipped, "responses": [],
        "diagnostics": view.diagnostics,
    }
    if group is not None:  # and the regime of its verifier information (mrtpo.core.info)
        out["example_id"], out["prompt"], out["info"] = group.example.id, group.prompt, group.info
    for i, text in enumerate(view.texts):
        item = {
            "response": text, "tokens": view.tokens[i],
            "reward_values": dict(zip(view.reward_names, r6(view.rewards[i]))),
            "advantage": round(float(view.final[i]), 6),
            "per_reward_advantage": dict(zip(view.reward_names, r6(view.per_reward[i]))),
            "js": {k: kept(v) for k, v in view.js[i].items()},
            "relevance": {k: r6(v) for k, v in view.relevance[i].items() if k not in view.skipped},
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
