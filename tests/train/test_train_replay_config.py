"""The replay's settings are TrainConfig's ``replay`` part (ReplayConfig's fields through opt(): flags of ``train``
and ``experiment``, the flat form a run stores), and the trainer replays with them at its sampling temperature."""
import mrtpo.train.loop as train_mod
from mrtpo.replay import ReplayConfig
from mrtpo.train import TrainConfig, Trainer
from tests.train.test_train import ToyFamily, cfg


def test_the_replay_settings_are_flags_and_stored_fields():
    from mrtpo.cli import build_parser
    from mrtpo.cli.train import config_from_args

    a = build_parser().parse_args(["train", "--steps", "1", "--token-budget", "256", "--no-share-prefix",
                                   "--precision", "model", "--fused", "off"])
    config, given = config_from_args(a)
    assert given == {"token_budget": 256, "share_prefix": False, "precision": "model", "fused": "off"}
    assert config.replay == ReplayConfig(token_budget=256, share_prefix=False, precision="model", fused="off")
    flat = config.to_dict()
    assert flat["token_budget"] == 256 and flat["share_prefix"] is False and "temperature" in flat  # the sampling's
    assert TrainConfig.from_dict(flat).replay == config.replay
    assert TrainConfig.from_dict({}).replay == ReplayConfig()  # a run stored before: the defaults
    assert build_parser().parse_args(["train", "--steps", "1"]).share_prefix is None  # not given: the config's


def test_the_trainer_replays_with_its_replay_config(monkeypatch):
    seen = []
    real = train_mod.replay_groups

    def spy(*args, **kwargs):
        seen.append(kwargs["config"])
        return real(*args, **kwargs)

    monkeypatch.setattr(train_mod, "replay_groups", spy)
    Trainer(cfg(token_budget=256, share_prefix=False, precision="model", temperature=0.7, probe_size=0),
            family=ToyFamily()).train(1)
    assert seen == [ReplayConfig(token_budget=256, share_prefix=False, precision="model", temperature=0.7)]
