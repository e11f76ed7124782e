"""What the heatmaps show for a group, as numbers: a :class:`TokenView` per (group, method, β), from a replay
(:func:`token_view`) or from a stored training step (:func:`stored_step_view`). No model calls: the credit comes
from :func:`mrtpo.core.credit.assign_credit`, the relevance from the replay or the store.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from mrtpo.core.advantages import Method, parse_method
from mrtpo.core.credit import BETA, CreditConfig, TokenCredit, assign_credit, relevance_tensor, reward_matrix
from mrtpo.core.faith_metrics import pair_metrics
from mrtpo.groups import ScoredGroup
from mrtpo.replay.results import ReplayResult
from mrtpo.tasks.base import Span


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
    # per response: reward -> (T,) JS distance d_kt, for the rewards whose JS the replay computed (none where no
    # replay ran, none for a reward not replayed: "not computed"); NaN where it was computed but not kept (a log)
    js: list[dict[str, np.ndarray]]
    token_adv_per_reward: list[dict[str, np.ndarray]]  # per response: reward -> (T,) A_ikt (weighted)
    token_adv: list[np.ndarray]  # per response: (T,) combined A_it after batch normalization
    diagnostics: dict = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # rewards constant in the group: not replayed, advantage 0
    measure: str = "js"  # the relevance measure ρ comes from
    # per response: {reward: evidence spans (None = whole response)}; [] when the group has no verifier evidence
    evidence: list[dict[str, list[Span] | None]] = field(default_factory=list)
    # (G,) what each response's per-reward shares were divided by: the batch scale s = std + ε (GRPO: its group's
    # std + ε); below the scale floor they are amplified (mrtpo.display.render.floor_note); None: not known
    divisor: np.ndarray | None = None
    # ``method`` parsed (its estimator, whether it moves credit over tokens, its label), once per view: the credit
    # step's where the view is built from it; parsed here when not given (or given for another name)
    parsed: Method | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.parsed is None or self.parsed.name != self.method:
            self.parsed = parse_method(self.method)

    def moved(self, i: int, reward: str) -> np.ndarray:
        """(T,) what the token method moved of ``reward``'s advantage in response ``i``: its token row minus the
        estimator's uniform share, A'_ikt − Â_ik / scale = f_i · w_k Â_ik β_s (ρ_ikt − 1)
        (:func:`mrtpo.core.credit.token_advantages_per_reward`). Its token sum is 0 (ρ has mean 1): MRTPO only
        moves a reward's advantage between the response's tokens. All 0 for a response-level method or β = 0."""
        return self.token_adv_per_reward[i][reward] - float(self.per_reward[i, self.reward_names.index(reward)])

    def faithfulness(self, i: int, reward: str):
        """:class:`mrtpo.core.faith_metrics.PairMetrics` of response ``i``'s relevance for ``reward`` against its
        evidence (None without evidence, or for a reward not replayed)."""
        if not self.evidence or reward in self.skipped:
            return None
        spans = self.evidence[i].get(reward)
        offsets = [(t["start"], t["end"]) for t in self.tokens[i]]
        return pair_metrics(self.relevance[i][reward], offsets, spans, self.texts[i])


def _divisor(credit: TokenCredit) -> np.ndarray:
    """(N,) what each response's per-reward shares were divided by (:attr:`TokenView.divisor`)."""
    adv = credit.adv
    scale = adv.scale.detach().float().cpu()
    d = scale.expand(adv.per_reward.shape[0]) if adv.divisor is None else adv.divisor.detach().float().cpu() * scale
    return d.numpy().astype(float)


def _rows(rho: torch.Tensor, credit: TokenCredit, names: Sequence[str], lengths: Sequence[int]
          ) -> tuple[list, list, list]:
    """Per response i, cut to its T_i tokens: {reward: ρ} from ``rho`` (N, K, T), {reward: A'_ikt} and A_it."""
    cut = [(i, n) for i, n in enumerate(lengths)]
    return ([{k: rho[i, j, :n].numpy() for j, k in enumerate(names)} for i, n in cut],
            [{k: credit.per_reward[i, j, :n].numpy() for j, k in enumerate(names)} for i, n in cut],
            [credit.tokens[i, :n].numpy() for i, n in cut])


def group_credit(group: ScoredGroup, replay: ReplayResult, method: str = "mrtpo", beta: float = BETA,
                 weights=None, cap: float | None = None, relevance: tuple[torch.Tensor, torch.Tensor] | None = None
                 ) -> TokenCredit:
    """The credit step (:func:`mrtpo.core.credit.assign_credit`) of one group: ``method`` on its rewards (G, K), spread
    over its tokens by the replay's relevance at ``beta`` (no warmup: the explorer's β is the effective one).  What
    :func:`token_view` shows, and what the Teach page lays out step by step (:func:`mrtpo.core.credit.credit_steps`).
    ``relevance``: the replay's (ρ (G, K, T), mask (G, T)) where the caller has it already (:func:`group_relevance`)."""
    rho, mask = relevance if relevance is not None else group_relevance(group, replay)
    cfg = CreditConfig(method=method, beta=beta, cap=cap)
    return assign_credit(torch.tensor(group.rewards, dtype=torch.float32), rho, mask, cfg, group.rewards.shape[0],
                         weights=weights)


def group_relevance(group: ScoredGroup, replay: ReplayResult) -> tuple[torch.Tensor, torch.Tensor]:
    """The replay's relevance as the credit step takes it: ρ (G, K, T) and the mask (G, T)
    (:func:`mrtpo.core.credit.relevance_tensor`, once per view)."""
    lengths = [len(r.token_ids) for r in replay.responses]
    return relevance_tensor([r.relevance for r in replay.responses], group.reward_names, lengths)


def token_view(group: ScoredGroup, replay: ReplayResult, method: str = "mrtpo", beta: float = BETA,
               weights=None, cap: float | None = None, measure: str | None = None) -> TokenView:
    """Advantages of ``method`` for one group, spread over tokens by the replay's relevance at ``beta`` (no warmup: the
    explorer's β is the effective one; :func:`group_credit`); no model calls.

    measure: re-derive relevance with this measure first (:meth:`ReplayResult.with_measure`; default: the replay's;
    the oracle ``evidence`` reads the group's evidence, and is an MrtpoError for a group without it; ``ktae`` the
    group's rewards; ``entropy`` the entropies its samples carry, an MrtpoError where they carry none).
    """
    if measure is not None:  # ktae reads the group's rewards, entropy the sampler's entropies (no model call)
        replay = replay.with_context(group.samples, group.reward_names, group.rewards)
        replay = replay.with_measure(measure, group.evidence or None)
    lengths = [len(r.token_ids) for r in replay.responses]
    rho, mask = group_relevance(group, replay)  # (G, K, T), once for the view
    credit = group_credit(group, replay, method, beta, weights, cap, (rho, mask))
    rel, per_tok, tok = _rows(rho, credit, group.reward_names, lengths)  # ρ as the replay gave it
    adv = credit.adv
    return TokenView(
        method=method, beta=credit.beta, reward_names=group.reward_names, rewards=group.rewards,
        per_reward=credit.uniform.numpy(), final=adv.final.numpy(),
        tokens=[r.tokens() for r in replay.responses], texts=[r.text for r in replay.responses],
        relevance=rel,
        js=[{k: r.js[k] for k in group.reward_names if k in r.js} for r in replay.responses],  # only those computed
        token_adv_per_reward=per_tok, token_adv=tok,
        diagnostics={k: (v.tolist() if hasattr(v, "tolist") else v)
                     for k, v in adv.diagnostics.items() if k != "zscore"},
        skipped=list(replay.skipped), measure=replay.measure, evidence=list(group.evidence), divisor=_divisor(credit),
        parsed=credit.method,
    )


def stored_step_view(rows: Sequence[dict], method: str, group_size: int, beta_s: float,
                     cap: float | None = None) -> TokenView:
    """The token view of one stored training step, from what the trainer stored (``Store.samples(run, step)``:
    every response of the step, group by group, with its rewards, tokens, ``ended`` flag and relevance).

    The credit is recomputed as the trainer computed it (:func:`mrtpo.core.credit.assign_credit`): the rewards as
    one (N, K) matrix over the union of reward names (:func:`~mrtpo.core.credit.reward_matrix`: NaN where a reward
    does not apply to a prompt), the stored relevance, the step's β_s (``metrics["beta_s"]``) and the run's
    ``cap``, over the trained tokens (the response and its EOS, whose relevance is 1).  So
    ``token_adv_per_reward`` holds each reward's MRTPO row A'_ikt, ``per_reward`` the estimator's uniform
    Â_ik / scale, and ``token_adv`` the trainer's token advantages.  Rewards not replayed (constant in their group,
    or a response-level method) have ρ = 1.  The JS distances are not stored: ``js`` is NaN.
    """
    names, R = reward_matrix([r["rewards"] for r in rows])
    T = [len(r["token_ids"]) for r in rows]
    lengths = [t + bool(r.get("ended")) for t, r in zip(T, rows)]
    rho, mask = relevance_tensor([r.get("relevance", {}) for r in rows], names, lengths, pad=True)
    cfg = CreditConfig(method=method, beta=float(beta_s), warmup=0, cap=cap)
    credit = assign_credit(R, rho, mask, cfg, group_size)
    rel, per_tok, tok = _rows(credit.rho, credit, names, T)  # ρ as the reallocation used it (capped)
    return TokenView(
        method=method, beta=credit.beta, reward_names=names, rewards=R.numpy(), per_reward=credit.uniform.numpy(),
        final=credit.final.numpy(), tokens=[[{"text": t} for t in r["tokens"]] for r in rows],
        texts=[r["text"] for r in rows],
        relevance=rel, js=[{k: np.full(t, np.nan) for k in names} for t in T], token_adv_per_reward=per_tok,
        token_adv=tok,
        diagnostics={"center": float(credit.adv.center), "scale": float(credit.adv.scale)}, divisor=_divisor(credit),
        parsed=credit.method,
    )
