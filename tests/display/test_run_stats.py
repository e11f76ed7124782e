"""Each reward component's history over logged steps, hand-worked on small rows."""
import pytest

from mrtpo.creditlog import CreditRow, CreditStep
from mrtpo.display.run_stats import component_curves, concentration, step_components


def row(group, index, rewards, adv=None, tok=None, step=1):
    return CreditRow(step=step, group=group, index=index, prompt="p", completion="c", rewards=rewards,
                     reward_advantages=adv, reward_token_advantages=tok)


def test_concentration_hand_worked():
    assert concentration([1.0, 1.0, 1.0, 1.0]) == pytest.approx(0.25)  # uniform, T = 4: ⌈0.4⌉ = 1 token of 4
    assert concentration([0.0, 3.0, -1.0] + [0.0] * 7) == pytest.approx(0.75)  # T = 10: the top token holds 3 of 4
    assert concentration([5.0] * 11) == pytest.approx(2 / 11)  # ⌈1.1⌉ = 2 tokens
    assert concentration([0.0, 0.0]) is None and concentration([]) is None


def test_step_components_hand_worked():
    st = CreditStep(1, "f", [
        # group 0: a = (1, 0), b = (1, 1) (constant); group 1: a = (0, 0) (constant), b = (0, 1)
        row(0, 0, {"a": 1.0, "b": 1.0}, {"a": 0.7, "b": 0.0}, {"a": [2.0, 0.0], "b": [0.0, 0.0]}),
        row(0, 1, {"a": 0.0, "b": 1.0}, {"a": -0.7, "b": 0.0}, {"a": [-1.0, -1.0], "b": [0.0, 0.0]}),
        row(1, 0, {"a": 0.0, "b": 0.0}, {"a": 0.0, "b": -0.6}, {"a": [0.0, 0.0], "b": [-0.6, -0.6]}),
        row(1, 1, {"a": 0.0, "b": 1.0, "c": None}, {"a": 0.0, "b": 0.6}, {"a": [0.0, 0.0], "b": [1.2, 0.0]}),
    ])
    m = step_components(st)
    assert list(m) == ["a", "b", "c"]
    assert m["a"] == pytest.approx({"mean": 0.25, "zeros": 0.75, "constant": 0.5, "share": 1.4 / 2.6,
                                    "top10": (1.0 + 0.5) / 2})  # T = 2: the top token; rows with no credit left out
    assert m["b"] == pytest.approx({"mean": 0.75, "zeros": 0.25, "constant": 0.5, "share": 1.2 / 2.6,
                                    "top10": (0.5 + 1.0) / 2})
    assert m["c"] == {"mean": None, "zeros": None, "constant": None, "share": None, "top10": None}  # no value


def test_curves_over_steps_and_logs_without_advantages():
    s1 = CreditStep(1, "f", [row(0, 0, {"reward": 1.0}), row(0, 1, {"reward": 0.0})])
    s2 = CreditStep(2, "f", [row(0, 0, {"reward": 0.5}, step=2), row(0, 1, {"reward": 0.5}, step=2)])
    c = component_curves([s1, s2])
    assert c["reward"]["mean"] == {1: 0.5, 2: 0.5} and c["reward"]["zeros"] == {1: 0.5, 2: 0.0}
    assert c["reward"]["constant"] == {1: 0.0, 2: 1.0}
    assert c["reward"]["share"] == {1: None, 2: None} and c["reward"]["top10"] == {1: None, 2: None}  # board-like


def test_token_table_of_a_board_row_and_of_a_credit_row():
    import math

    from mrtpo.display.log_tokens import token_table

    b = CreditRow(step=1, group=0, index=0, prompt="p", completion="June.", rewards={"reward": 1.0},
                  tokens=["June", "."], logprob=[math.log(0.5), None], ref_logprob=[math.log(0.25), -1.0],
                  kl=[math.log(2), None], extra={"values": [0.1, 0.2], "ref_response": "x"})
    t = token_table(b)
    assert t[0]["token"] == "June" and t[0]["p"] == pytest.approx(0.5) and t[0]["values"] == 0.1
    assert t[1]["p"] is None and t[1]["A"] is None and t[1]["id"] is None and "ref_response" not in t[1]
    c = CreditRow(step=1, group=0, index=0, prompt="p", completion="ab", rewards={"a": 1.0}, token_ids=[5, 6],
                  tokens=["a", "b"], token_advantages=[1.5, 0.5], reward_token_advantages={"a": [1.5, 0.5]},
                  relevance={"a": [1.5, 0.5]})
    assert token_table(c)[1] == {"t": 1, "token": "b", "part": None, "id": 6, "p": None, "logprob": None,
                                 "entropy": None, "ref_logprob": None, "kl": None, "A": 0.5, "A:a": 0.5, "ρ:a": 0.5}
