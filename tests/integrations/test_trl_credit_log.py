"""The credit log of a TRL run: one generation on the tiny model writes a step whose token advantages are the ones
TRL's loss received, whose per-reward rows sum to them, and whose log-probs are the policy's.  Two processes:
``tests/integrations/test_trl.py::test_accelerate_two_processes`` reads the log its run writes."""

import pytest
import torch

pytest.importorskip("trl", reason="optional extra 'trl' not installed (pip install trl==1.16.0)")

from mrtpo.creditlog import read_credit_log  # noqa: E402
from tests.integrations.test_trl import _inputs  # noqa: E402
from tests.integrations.test_trl import _trainer as trl_trainer  # noqa: E402

NAMES = ["_reward_len", "_reward_vowels"]


def _trainer(tmp_path, tiny, method, beta, **cfg):
    tr = trl_trainer(tmp_path, tiny, method, beta, credit_log=str(tmp_path / "log"), **cfg)
    tr.model.train()  # as in trainer.train(): only training generations are logged
    return tr


def test_trl_step_writes_what_the_trainer_computed(tmp_path, tiny):
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    from mrtpo.integrations.trl_log import flush

    tr = _trainer(tmp_path, tiny, method="mrtpo", beta=0.5, credit_log_groups=1)
    torch.manual_seed(0)
    out = tr._generate_and_score_completions(_inputs())
    assert not (tmp_path / "log").exists()  # the rows wait for the loss forward's log-probs and entropy
    tr.current_gradient_accumulation_steps = 1  # what train() sets before a loss
    for part in split_tensor_dict(shuffle_sequence_dict(dict(out)), 2):  # as TRL does: shuffled micro-batches
        tr._compute_loss(tr.model, part)
    flush(tr)
    log = read_credit_log(tmp_path / "log")
    assert log.meta["source"] == "trl" and log.meta["rewards"] == NAMES and log.meta["method"] == "mrtpo"
    assert log.meta["model"]  # the policy's name or path, else its class
    (st,) = log.steps
    assert st.step == 1 and len(st.rows) == 4 and {r.group for r in st.rows} == {0}  # 1 group of 4 logged
    adv, mask = out["advantages"], tr.mrtpo_last["mask"]
    moved = 0
    for i, r in enumerate(st.rows):
        T = int(mask[i].sum())
        assert r.index == i and len(r.token_ids) == T == len(r.offsets) == len(r.logprob) == len(r.entropy)
        assert r.token_ids == out["completion_ids"][i, :T].tolist()
        A = torch.tensor(r.token_advantages)
        torch.testing.assert_close(A, adv[i, :T].float(), atol=2e-6, rtol=1e-6)  # what TRL's loss got
        per = torch.tensor([r.reward_token_advantages[k] for k in NAMES])
        torch.testing.assert_close(per.sum(0) - r.center / r.scale, A, atol=1e-5, rtol=0)
        assert A.mean().item() == pytest.approx(r.advantage, abs=1e-5)
        assert r.advantage == pytest.approx(float(tr.mrtpo_last["trl_advantages"][i]), abs=1e-5)  # GDPO's
        assert r.beta == 0.5 and r.ref_logprob is None and r.kl is None  # TRL's beta is 0: no reference
        assert r.reasons is None and set(r.rewards) == set(NAMES)
        moved += any(v is not None for v in r.relevance.values())
        assert all(e is not None and e >= 0 for e in r.entropy)
    assert moved  # the rewards vary in the group: it was replayed
    # the log-probs and entropies are the policy's at temperature 1: one forward here gives the same numbers
    for i in (0, 3):
        r = st.rows[i]
        ids = torch.cat([out["prompt_ids"][i][out["prompt_mask"][i].bool()], torch.tensor(r.token_ids)])
        with torch.no_grad():
            logits = tr.model(ids.unsqueeze(0)).logits[0].float()
        P = int(out["prompt_mask"][i].sum())
        logp = torch.log_softmax(logits[P - 1:-1], -1)
        lp = logp.gather(1, torch.tensor(r.token_ids).unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(torch.tensor(r.logprob), lp, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(r.entropy), -(logp.exp() * logp).sum(-1), atol=1e-4, rtol=1e-4)
    tr.state.global_step = 1
    tr._generate_and_score_completions(_inputs())  # a generation no loss reached: written without log-probs
    flush(tr)
    last = read_credit_log(tmp_path / "log").steps[-1]
    assert all(r.logprob is None and r.entropy is None for r in last.rows) and len(last.rows) == 4


def test_trl_gdpo_log_without_the_extra_forward(tmp_path, tiny):
    tr = _trainer(tmp_path, tiny, method="gdpo", beta=0.5, credit_log_groups=2, credit_log_logprobs=False)
    torch.manual_seed(0)
    out = tr._generate_and_score_completions(_inputs())
    (st,) = read_credit_log(tmp_path / "log").steps
    assert [(r.group, r.index) for r in st.rows] == [(g, i) for g in (0, 1) for i in range(4)]
    for i, r in enumerate(st.rows):  # response-level: every token gets the GDPO advantage, nothing replayed
        assert r.beta == 0.0 and all(v is None for v in r.relevance.values())
        assert r.token_advantages == pytest.approx([float(out["advantages"][i])] * len(r.token_ids), abs=1e-5)
        assert r.logprob is None and r.entropy is None  # TRL computed none (aligned steps, no vLLM)
    tr._generate_and_score_completions(_inputs())  # the same update again: its first generation stays
    assert [s.step for s in read_credit_log(tmp_path / "log").steps] == [1]
