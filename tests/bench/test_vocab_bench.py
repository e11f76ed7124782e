"""bench/vocab.py from hand-made figures and a tiny model (the benchmark itself is not run here): its table, the
head's FLOP share, the stage timers (they count the engine's calls and put the library back)."""
import pytest
import torch

from bench import vocab as B
from mrtpo.replay import ReplayConfig, engine, replay_group, vocab


def test_rows_and_ratios():
    before = {"seconds": 10.0, "vocabulary": 5.0, "projection": 3.0, "chain": 1.5}
    budget = {"seconds": 9.0, "vocabulary": 4.0, "projection": 2.0, "chain": 1.5}
    after = {"seconds": 8.0, "vocabulary": 3.0, "projection": 2.0, "chain": 0.75}
    got = B.rows([{"V": 151_936, "head_flop_share": 0.45, "before": before, "budget": budget, "after": after,
                   "d_max_diff": 6e-8}])
    assert got == [
        ["151,936", "before", "10.00", "5.00", "3.00", "1.50", "0.50", "50%", "45%", ""],
        ["151,936", "budget", "9.00", "4.00", "2.00", "1.50", "0.50", "44%", "45%", ""],
        ["151,936", "after", "8.00", "3.00", "2.00", "0.75", "0.25", "38%", "45%", ""],
        ["151,936", "budget ÷ before", "0.900", "0.800", "0.667", "1.000", "", "", "", ""],
        ["151,936", "after ÷ before", "0.800", "0.600", "0.667", "0.500", "", "", "", "6.0e-08"],
    ]
    assert len(got[0]) == len(B.HEADER)


def test_head_flop_share_by_hand(tiny):
    c = tiny.model.config
    H, V, M, L = c.hidden_size, c.vocab_size, c.intermediate_size, c.num_hidden_layers
    kv = c.num_key_value_heads * (getattr(c, "head_dim", None) or H // c.num_attention_heads)
    q = c.num_attention_heads * (getattr(c, "head_dim", None) or H // c.num_attention_heads)
    body = L * (H * q + 2 * H * kv + q * H + 3 * H * M)  # q, k, v, o; gate, up, down
    assert abs(B.head_flop_share(tiny) - V * H / (V * H + body)) < 1e-12


@pytest.mark.parametrize("fused", ["off", "auto"])  # the eager chain; where the kernel library is loaded, its chain
def test_stage_timers_count_and_restore(tiny, fused):
    saved = (engine.vocabulary_side, vocab.chain, vocab.kernel_chain, vocab.fused_chain, torch.matmul)
    with B.stage_timers() as spent:
        replay_group(tiny, "List users.", {"a": "check a", "b": "check b"}, ["SELECT 1;"],
                     config=ReplayConfig(fused=fused))
    assert spent["vocabulary"] > 0 and spent["projection"] > 0 and spent["chain"] > 0
    assert spent["vocabulary"] >= spent["projection"] + spent["chain"]
    assert (engine.vocabulary_side, vocab.chain, vocab.kernel_chain, vocab.fused_chain, torch.matmul) == saved
