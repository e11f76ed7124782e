"""Meet users where they train.

- :mod:`mrtpo.integrations.trl`: ``MRTPOGRPOTrainer``, a small ``trl.GRPOTrainer`` subclass that puts any registry
  estimator (GDPO, DARA, GD²PO, ...) and MRTPO token advantages into TRL's loss (optional extra ``trl``).
- :mod:`mrtpo.integrations.rollouts`: import TRL completions logs (parquet) and verl-style JSONL rollout dumps,
  group them by prompt, attach verifier information from a user template, and explain them with heatmaps.

Neither is imported here, so ``import mrtpo.integrations`` never needs TRL.
"""
