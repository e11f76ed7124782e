"""Training: a run's configuration (:mod:`.config`), the loop (:mod:`.loop`), the policy and its update
(:mod:`.policy`), the probe (:mod:`.probe`), the store writes (:mod:`.recorder`), a step's sampled batch
(:mod:`.rollout`) and the phase timing (:mod:`.timing`)."""
from mrtpo.train.config import MAX_STEPS, OptimConfig, TrainConfig
from mrtpo.train.loop import Trainer
from mrtpo.train.rollout import Rollout
from mrtpo.train.timing import PHASES

__all__ = ["MAX_STEPS", "PHASES", "OptimConfig", "Rollout", "TrainConfig", "Trainer"]
