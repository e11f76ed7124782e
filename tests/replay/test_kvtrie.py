"""The trie of shared prefixes: its segments, and hidden states equal to one-sequence-at-a-time passes."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrtpo.model import Decoder, decoder_stack
from mrtpo.replay.kvtrie import build_trie, pass_pairs, plan_passes, shared_hidden

SEQS = [
    [1, 2, 3, 4, 5, 6, 7],
    [1, 2, 3, 4, 9, 9],
    [1, 2, 3, 4, 5, 6, 7],  # identical to the first
    [1, 2, 3, 8],
    [1, 2],  # a prefix of the others
    [5, 5, 5, 5],  # shares nothing
]


def _path_tokens(trie, n):
    return [t for i in trie.paths[n] for t in trie.segments[i].tokens]


def test_trie_segments_rebuild_every_sequence():
    trie = build_trie(SEQS, min_saved=0)
    for n, s in enumerate(SEQS):
        assert _path_tokens(trie, n) == s
        starts = [trie.segments[i].start for i in trie.paths[n]]
        lens = [len(trie.segments[i].tokens) for i in trie.paths[n]]
        assert starts == list(np.cumsum([0] + lens[:-1]))  # contiguous, from position 0
    # trie nodes: [1 2] [3] [4] [5 6 7] [9 9] [8] [5 5 5 5], each once
    assert sum(len(s.tokens) for s in trie.segments) == 14
    top = trie.segments[trie.paths[0][0]]
    assert top.tokens == [1, 2] and top.has_children and top.level == 0


def test_pass_pairs_count_each_rows_keys_hand_worked():
    """A pass's (query, key) pairs: n · start + n (n + 1) / 2 per row. For SEQS' trie (no folding) the nodes
    [5 5 5 5] [1 2] [3] [8] [4] [9 9] [5 6 7] start at 0 0 2 3 3 4 4: 10 + 3 + 3 + 4 + 4 + 11 + 18 = 53, against
    28 + 21 + 28 + 10 + 3 + 10 = 100 with every sequence alone from position 0."""
    trie = build_trie(SEQS, min_saved=0)
    assert [(seg.tokens, seg.start) for seg in trie.segments] == [([5, 5, 5, 5], 0), ([1, 2], 0), ([3], 2), ([8], 3),
                                                                  ([4], 3), ([9, 9], 4), ([5, 6, 7], 4)]
    assert [pass_pairs(trie.segments, [i]) for i in range(len(trie.segments))] == [10, 3, 3, 4, 4, 11, 18]
    assert pass_pairs(trie.segments, list(range(len(trie.segments)))) == 53
    flat = build_trie(SEQS, share=False)
    assert pass_pairs(flat.segments, list(range(len(SEQS)))) == 100


def test_fold_short_shared_segments():
    # [3] saves (2 - 1) * 1 token, then [3 4] (2 - 1) * 2: both fold; [1 2] stays, a sequence ends there
    trie = build_trie(SEQS, min_saved=5)
    for n, s in enumerate(SEQS):
        assert _path_tokens(trie, n) == s
    shared = sorted(seg.tokens for seg in trie.segments if seg.has_children)
    assert shared == [[1, 2]]
    flat = build_trie(SEQS, share=False)
    assert all(len(p) == 1 for p in flat.paths) and sum(len(s.tokens) for s in flat.segments) == sum(map(len, SEQS))


@pytest.mark.parametrize("budgets", [(16, 32), (4096, 8192)])
def test_shared_hidden_equals_single_passes(tiny, budgets):
    g = torch.Generator().manual_seed(0)
    V = tiny.model.config.vocab_size
    prompt = torch.randint(5, V, (30,), generator=g).tolist()
    items = [torch.randint(5, V, (n,), generator=g).tolist() for n in (12, 7, 20)]
    seqs, want = [], []
    for r in range(3):
        resp = torch.randint(5, V, (9 + r,), generator=g).tolist()
        for drop in (None, 0, 1, 2):  # P_all and each leave-one-out variant
            p = prompt + [t for j, it in enumerate(items) if j != drop for t in it]
            seqs.append(p + resp)
            want.append((len(p) - 1, len(p) - 1 + len(resp)))
    backbone = decoder_stack(tiny.model)
    dec = Decoder(backbone, torch.float32)
    with torch.no_grad():
        out, trie, stats = shared_hidden(dec, 0, tiny.device, seqs, want, *budgets)
        for s, (lo, hi), h in zip(seqs, want, out):
            ref = backbone(input_ids=torch.tensor([s])).last_hidden_state[0, lo:hi]
            np.testing.assert_allclose(h.numpy(), ref.numpy(), atol=1e-5)
    seg_tokens = sum(len(seg.tokens) for seg in trie.segments)  # every trie node runs once; padding adds
    assert seg_tokens < sum(map(len, seqs)) // 2
    assert seg_tokens <= stats.forward_tokens < sum(map(len, seqs))
    # the attention's pairs: each trie node's tokens over its ancestors' keys and their own causally, once, whatever
    # the batching (padding is not counted), fewer than every sequence's own triangle
    pairs = sum(len(seg.tokens) * seg.start + len(seg.tokens) * (len(seg.tokens) + 1) // 2 for seg in trie.segments)
    assert stats.attention_pairs == pairs < sum(len(q) * (len(q) + 1) // 2 for q in seqs)
    if budgets[0] == 16:  # a tight budget: one row per pass, no padding, many passes
        assert stats.forward_tokens == seg_tokens and stats.forward_passes >= 10
    else:  # a loose one: few passes, some padding
        assert stats.forward_passes <= 4 and stats.forward_tokens > seg_tokens


def _each_equals_its_own_pass(lm, seqs, token_budget, kv_budget, share=True):
    """shared_hidden's states of every position of every sequence against a one-sequence pass; returns its stats."""
    backbone = decoder_stack(lm.model)
    want = [(0, len(s)) for s in seqs]
    with torch.no_grad():
        out, _, stats = shared_hidden(Decoder(backbone, torch.float32), 0, lm.device, seqs, want, token_budget,
                                      kv_budget, share=share)
        for s, h in zip(seqs, out):
            ref = backbone(input_ids=torch.tensor([s])).last_hidden_state[0]
            np.testing.assert_allclose(h.numpy(), ref.numpy(), atol=1e-5)
    return stats


def test_shared_hidden_prefix_and_identical_sequences(tiny):
    """Sequences that end inside another's path, duplicates and unrelated ones all get their own states."""
    _each_equals_its_own_pass(tiny, SEQS, 64, 256)


def test_top_level_row_first_in_a_batch_with_pasts(tiny):
    """A leaf with no parent (it shares nothing, or its short shared parent was folded into it) that is the
    shortest row of a pass whose other rows continue cached pasts (it crashed with KeyError: -1)."""
    V = tiny.model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(5, V, (80,), generator=g).tolist()
    seqs = [shared + torch.randint(5, V, (n,), generator=g).tolist() for n in (6, 9)] + [[3, 4]]
    trie = build_trie(seqs)
    leaves = sorted((i for i, s in enumerate(trie.segments) if not s.has_children),
                    key=lambda i: len(trie.segments[i].tokens))
    assert trie.segments[leaves[0]].parent == -1 and trie.segments[leaves[1]].parent >= 0  # the case itself
    stats = _each_equals_its_own_pass(tiny, seqs, 4096, 8192)
    assert stats.forward_passes == 2  # the shared prefix, then all three leaves in one pass


@st.composite
def _sequence_sets(draw):
    """Replay-shaped sets of sequences: a shared prompt (possibly short or empty), items left out one at a time,
    responses of any length, exact duplicates, and sequences that share nothing or end inside another's path."""
    tok = st.integers(5, 60)
    prompt = draw(st.lists(tok, max_size=90))
    items = draw(st.lists(st.lists(tok, max_size=12), min_size=0, max_size=3))
    seqs = []
    for _ in range(draw(st.integers(1, 3))):
        resp = draw(st.lists(tok, min_size=1, max_size=10))
        for drop in [None, *range(len(items))]:
            seqs.append(prompt + [t for j, it in enumerate(items) if j != drop for t in it] + resp)
    seqs += draw(st.lists(st.lists(tok, min_size=1, max_size=8), max_size=2))  # unrelated
    if draw(st.booleans()):
        seqs.append(seqs[0][: max(1, len(seqs[0]) // 2)])  # ends inside another's path
    if draw(st.booleans()):
        seqs.append(list(seqs[-1]))  # an exact duplicate
    return seqs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seqs=_sequence_sets(), budgets=st.sampled_from([(8, 16), (64, 256), (4096, 8192)]),
       share=st.booleans())
def test_shared_hidden_equals_single_passes_for_any_trie(tiny, seqs, budgets, share):
    """Whatever the trie looks like (folded parents, top-level leaves, prefixes, duplicates) and however the passes
    are cut, every sequence's states equal its own one-sequence pass."""
    _each_equals_its_own_pass(tiny, seqs, *budgets, share=share)


def test_a_cut_splits_a_shared_run_and_keeps_its_first_part():
    """The replay's prompts are cut where their verifier items begin (mrtpo.replay.plan.cuts): the run before the cut
    is a segment of its own, never folded into its children (its pass is then the same whichever rewards a group
    replays), while a short branching segment after it is folded as before."""
    A = list(range(100, 110))
    seqs = [A + [1, 2], A + [3, 4]]
    plain = build_trie(seqs)  # sharing 10 tokens saves fewer than 64: one segment per sequence
    assert [[plain.segments[i].tokens for i in path] for path in plain.paths] == [[s] for s in seqs]
    cut = build_trie(seqs, cuts=[6, 6])
    got = [[(cut.segments[i].tokens, cut.segments[i].start) for i in path] for path in cut.paths]
    assert got == [[(A[:6], 0), (A[6:] + [1, 2], 6)], [(A[:6], 0), (A[6:] + [3, 4], 6)]]
    assert cut.paths[0][0] == cut.paths[1][0] and len(cut.segments) == 3  # the first part: one shared segment
    trie, batches, levels = plan_passes(seqs, 4096, 8192, cuts=[6, 6])
    root = trie.paths[0][0]
    assert batches[0] == [root] and sorted(batches[1]) == sorted(set(range(3)) - {root}) and levels == [1, 1]
    assert build_trie(seqs, share=False, cuts=[6, 6]).paths == [[0], [1]]  # nothing shared: no cut
    C = [7] * 80  # another group's prompt (its own cut: none) is not cut at this group's position
    both = build_trie(seqs + [C + [5], C + [6]], cuts=[6, 6, 0, 0])
    c = both.paths[2][0]
    assert both.segments[c].tokens == C and both.paths[3][0] == c and len(both.segments) == 3 + 3  # C whole, 2 tails


def test_a_store_reuses_a_segment_only_where_its_whole_path_was_cut_the_same(tiny):
    """The same tokens cut into other segments are another pass (other pasts, other lengths): a PrefixStore keyed by
    the path's segments gives back nothing for them, and every result equals a replay without a store, to the bit."""
    from mrtpo.model.kvcache import PrefixStore
    from mrtpo.model.llama_step import LlamaStep

    stack = decoder_stack(tiny.model)
    dec = Decoder(stack, torch.float32)
    own = LlamaStep(stack, {k: v.detach().clone() for k, v in stack.named_parameters()})
    g = torch.Generator().manual_seed(3)
    P, X = (torch.randint(3, 250, (n,), generator=g).tolist() for n in (40, 90))
    tails = [torch.randint(3, 250, (20,), generator=g).tolist() for _ in range(2)]
    seqs = [P + X + t for t in tails]
    want = [(len(P + X), len(s)) for s in seqs]
    store = PrefixStore()
    runs = [dict(), dict(cuts=[len(P)] * 2), dict(), dict(cuts=[len(P)] * 2)]  # one root; P then X; again each way
    with torch.inference_mode():
        for i, kw in enumerate(runs):
            got, trie, st = shared_hidden(dec, 0, tiny.device, seqs, want, 4096, 8192, own=own, store=store, **kw)
            ref, _, st_ref = shared_hidden(dec, 0, tiny.device, seqs, want, 4096, 8192, own=own, **kw)
            for h, r in zip(got, ref):
                assert torch.equal(h, r)
            assert st.reused_tokens == [0, 0, 130, 130][i]  # a second time each way: all of its shared part
            assert st.forward_tokens + st.reused_tokens == st_ref.forward_tokens
    assert (store.hits, len(store)) == (3, 3)  # [P + X]; [P], [P][X] (its child's key holds both)
