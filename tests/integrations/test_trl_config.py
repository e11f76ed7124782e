"""One config for TRL users: MRTPOGRPOConfig is TRL's GRPOConfig carrying every MRTPOConfig field (``mrtpo_<name>``,
generated from the same field metadata), and the trainer reads MRTPO's settings from it; ``mrtpo_config=`` beside a
plain GRPOConfig is still accepted."""
import copy
import dataclasses

import pytest
import torch

pytest.importorskip("trl", reason="optional extra 'trl' not installed (pip install trl==1.16.0)")

from mrtpo.errors import MrtpoError  # noqa: E402
from tests.integrations.test_trl import _inputs, _reward_len, _reward_vowels  # noqa: E402

GRPO = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=8, use_cpu=True, bf16=False,
            report_to="none", save_strategy="no", max_steps=1, disable_tqdm=True, seed=0)


def _info(prompt, completion, example):
    return {"_reward_len": f"length modulo 3 of the answer, target {example['target']}",
            "_reward_vowels": "the answer must contain a vowel"}


def _trainer(tiny, args, **kw):
    from datasets import Dataset

    from mrtpo.integrations.trl import MRTPOGRPOTrainer

    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say something {i}."}], "target": i}
                            for i in range(8)])
    return MRTPOGRPOTrainer(model=copy.deepcopy(tiny.model), reward_funcs=[_reward_len, _reward_vowels], args=args,
                            train_dataset=ds, processing_class=copy.deepcopy(tiny.tokenizer), verifier_info_fn=_info,
                            **kw)


def test_the_trl_config_carries_every_mrtpo_field(tmp_path):
    from trl import GRPOConfig

    from mrtpo.config import leaf_fields
    from mrtpo.integrations.trl import MRTPOConfig, MRTPOGRPOConfig
    from mrtpo.replay import ReplayConfig

    assert issubclass(MRTPOGRPOConfig, GRPOConfig)
    names = {f.name: f for f in dataclasses.fields(MRTPOGRPOConfig)}
    ours = [f for f, _ in leaf_fields(MRTPOConfig)]
    assert {"method", "beta", "measure", "token_budget", "precision", "credit_log"} <= {f.name for f in ours}
    assert "temperature" not in {f.name for f in ours}  # the entropy forward runs at TRL's temperature
    for f in ours:
        g = names["mrtpo_" + f.name]
        assert g.default == (None if f.name == "template" else f.default), f.name
        assert g.metadata["help"] == "MRTPO: " + f.metadata["help"]
    assert "beta" in names and names["beta"].default == GRPOConfig.beta  # TRL's KL coefficient, untouched
    args = MRTPOGRPOConfig(output_dir=str(tmp_path), **GRPO, mrtpo_method="mrtpo+dara", mrtpo_beta=0.3,
                           mrtpo_warmup=None, mrtpo_measure="js-word", mrtpo_token_budget=512,
                           mrtpo_precision="model", mrtpo_template={"separator": "; "})
    assert args.mrtpo_config() == MRTPOConfig(method="mrtpo+dara", beta=0.3, warmup=None, measure="js-word",
                                              replay=ReplayConfig(token_budget=512, precision="model"),
                                              template={"separator": "; "})
    with pytest.raises(MrtpoError, match=r"MRTPOGRPOConfig's mrtpo_\* fields: bad credit config: beta must be <= 1"):
        MRTPOGRPOConfig(output_dir=str(tmp_path), **GRPO, mrtpo_beta=1.5)
    with pytest.raises(MrtpoError, match=r"mrtpo_\* fields: bad replay config: precision must be one of auto, model"):
        MRTPOGRPOConfig(output_dir=str(tmp_path), **GRPO, mrtpo_precision="fp8")


def test_the_trl_trainer_reads_mrtpo_from_its_args(tmp_path, tiny):
    from trl import GRPOConfig

    from mrtpo.integrations.trl import MRTPOConfig, MRTPOGRPOConfig

    args = MRTPOGRPOConfig(output_dir=str(tmp_path), **GRPO, multi_objective_aggregation="normalize_then_sum",
                           mrtpo_beta=0.5, mrtpo_warmup=None, mrtpo_measure="js-word")
    tr = _trainer(tiny, args)
    assert tr.mrtpo_config == MRTPOConfig(beta=0.5, warmup=None, measure="js-word")
    torch.manual_seed(0)
    out = tr._generate_and_score_completions(_inputs())
    assert out["advantages"].ndim == 2 and tr.mrtpo_last["replay_seconds"] > 0  # token credit from the args' MRTPO
    # mrtpo_config= is still accepted, beside a plain GRPOConfig or MRTPOGRPOConfig's defaults ...
    plain = GRPOConfig(output_dir=str(tmp_path), **GRPO)
    assert _trainer(tiny, plain, mrtpo_config=MRTPOConfig(beta=0.2)).mrtpo_config.beta == 0.2
    defaults = MRTPOGRPOConfig(output_dir=str(tmp_path), **GRPO)
    assert _trainer(tiny, defaults, mrtpo_config=MRTPOConfig(beta=0.2)).mrtpo_config.beta == 0.2
    assert _trainer(tiny, defaults).mrtpo_config == MRTPOConfig()
    # ... but not both, saying different things
    with pytest.raises(MrtpoError, match="MRTPO's settings are given twice"):
        _trainer(tiny, args, mrtpo_config=MRTPOConfig(beta=0.2))
