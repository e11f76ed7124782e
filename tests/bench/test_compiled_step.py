"""The functional step (mrtpo.model.compiled: the buffer read-only, the new key attended beside it and returned;
what the compiled package and bench/compiled_step.py are built from) computes the own decoding step: the same hidden
states within bf16 rounding and the same new keys and values, on a random Llama with grouped-query heads (no compile
here: the math the compiled graph is built from)."""
import torch

from bench.compiled_step import seen_mask
from mrtpo.model.compiled import FunctionalStep
from mrtpo.model.decoder import Decoder, decoder_stack
from mrtpo.model.llama_step import llama_step
from mrtpo.model.zoo import random_model


def test_the_functional_step_is_the_own_step():
    lm = random_model("llama", initializer_range=0.2, hidden_size=128, layers=3)
    dec = Decoder(decoder_stack(lm.model), torch.bfloat16, few_rows=True)
    step = llama_step(dec)
    assert step is not None and step.heads > step.kv_heads  # grouped-query heads
    g = torch.Generator().manual_seed(0)
    n, tmax, pos = 3, 40, 23
    buf = torch.randn((len(step.layers), 2, n, step.kv_heads, tmax, step.head_dim), generator=g).to(torch.bfloat16)
    ids = torch.randint(0, lm.model.config.vocab_size, (n,), generator=g)
    before = buf.clone()
    h, new_k, new_v = FunctionalStep(step)(ids, torch.tensor(float(pos)), seen_mask(pos, tmax), before[:, 0],
                                           before[:, 1], torch.tensor(0))
    want = step(ids, pos, buf)  # writes its keys and values at pos
    assert torch.equal(before[:, :, :, :, :pos], buf[:, :, :, :, :pos])  # the functional step wrote nothing
    # the first layer's new key and value come before any attention: the same to the bit; later ones within rounding
    torch.testing.assert_close(new_k[0], buf[0, 0, :, :, pos], atol=0, rtol=0)
    torch.testing.assert_close(new_v[0], buf[0, 1, :, :, pos], atol=0, rtol=0)
    torch.testing.assert_close(new_k.float(), buf[:, 0, :, :, pos].float(), atol=0.15, rtol=0.05)
    torch.testing.assert_close(new_v.float(), buf[:, 1, :, :, pos].float(), atol=0.15, rtol=0.05)
    torch.testing.assert_close(h.float(), want.float(), atol=0.1, rtol=0.05)
    assert want.float().std() > 0.1
    assert seen_mask(2, 4).tolist() == [0.0, 0.0, float("-inf"), float("-inf")]
