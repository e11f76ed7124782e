"""One position shown: the two next-token distributions behind one JS value (Teach and Explore draw them)."""
from __future__ import annotations

import torch

from mrtpo.core.js import js_distance
from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel
from mrtpo.replay.engine import Response
from mrtpo.replay.plan import plan_group
from mrtpo.templates import ALL, Template


@torch.no_grad()
def next_token_topk(
    lm: LoadedModel,
    prompt: str,
    verifier_info: dict[str, str],
    response: Response,
    reward: str,
    t: int,
    k: int = 10,
    template: Template | None = None,
) -> dict:
    """The two next-token distributions that the JS distance of ``reward`` compares at response position ``t``.

    p_t = π(·|P_all, y<t) and q_t = π(·|P_\\k, y<t): each of the two sequences P_all + y<t and P_\\k + y<t runs in
    one plain forward pass of the model in its own dtype (float32 on CPU: no bf16 copies, no KV sharing), and
    log-softmax runs in float32 over the whole vocabulary.  ``t`` is 0-based (0 ≤ t < T); y_t is the token the two
    distributions predict.

    Returns a dict:

    - ``rows``: the union of the top-``k`` tokens of p_t and of q_t (so both sets of bars align), ordered by
      max(p, q) descending: ``[{"id", "text", "p", "q"}]``;
    - ``token``: y_t as ``{"id", "text", "p", "q"}`` (its probabilities under both prompts);
    - ``js``: :func:`js_distance` of the full distributions (the replay's d_kt at t, up to its precision);
    - ``p_other``, ``q_other``: the probability mass outside ``rows`` (1 − Σ rows);
    - ``prompts``: ``{"__all__": P_all text, reward: P_\\k text}`` as the model sees them.
    """
    template = template or Template()
    if reward not in verifier_info:
        raise MrtpoError(f"reward '{reward}' has no verifier information (rewards: {', '.join(verifier_info)})")
    if not isinstance(k, int) or k < 1:
        raise MrtpoError(f"k must be an integer >= 1, got {k!r}")
    plan = plan_group(lm, prompt, [verifier_info], [response], template, None)
    rid = plan.resp_ids[0]
    if not 0 <= t < len(rid):
        raise MrtpoError(f"position t = {t} is outside the response (0 ≤ t < {len(rid)})")
    logps = []
    for v in (ALL, reward):
        ids = torch.tensor([plan.prompt_ids[0][v] + rid[:t]], device=lm.device)
        logits = lm.model(input_ids=ids, use_cache=False).logits[0, -1].float()
        logps.append(torch.log_softmax(logits, dim=-1).cpu())
    lp, lq = logps
    p, q = lp.exp(), lq.exp()
    kk = min(k, p.numel())
    ids = dict.fromkeys(p.topk(kk).indices.tolist() + q.topk(kk).indices.tolist())
    order = sorted(ids, key=lambda i: -max(float(p[i]), float(q[i])))

    def row(i: int) -> dict:
        text = lm.tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return {"id": i, "text": text, "p": float(p[i]), "q": float(q[i])}

    rows = [row(i) for i in order]
    return {"rows": rows, "token": row(rid[t]), "js": float(js_distance(lp, lq, p=p)),
            "p_other": max(0.0, 1.0 - sum(r["p"] for r in rows)), "q_other": max(0.0, 1.0 - sum(r["q"] for r in rows)),
            "prompts": {ALL: plan.prompt_texts[0][ALL], reward: plan.prompt_texts[0][reward]}}
