"""Final hidden states of many token sequences that share prefixes, each shared prefix computed once.

What it computes: for every sequence, the decoder stack's final hidden states at the positions asked for — what one
forward of that sequence alone gives (``mrtpo/method.py``'s plain forward; ``tests/replay/test_architectures.py`` and
``tests/replay/test_kvtrie.py`` compare them). Why it equals that: a causal decoder's state at a position depends only
on the tokens up to it, so a prefix's keys and values are the same in every sequence that starts with it; computed
once and handed to each continuation as its cached past (at the continuation's own positions, behind masks that hide
the padding), they give the continuation the keys and values it would have computed itself.

The replay teacher-forces 1 + K variants of every response of a group: P_all + y_i and P_\\k + y_i.  Those
sequences share a lot of their beginnings: the system and task prompt (every sequence), the verifier items
before the one left out (P_all and P_\\k of a response), and response-independent verifier text (across
responses).  :func:`shared_hidden` puts the sequences in a trie of token ids, cuts it into *segments* (maximal
runs without a branch), and runs the segments level by level: every segment of a level is a row of a padded
forward pass whose past is its ancestors' KV cache.  Every trie node runs exactly once.

Row j of a pass holds [ancestors' keys (left-aligned, padded to the batch's longest past) | its own tokens
(padded)]; the attention mask hides the padding and the positions are the tokens' positions in their
sequences, so a cached key (already rotated) means the same as in a one-sequence pass.  Every layer keeps every
key, a sliding-window layer too; for a model with sliding windows the masks are made from the keys' and queries'
positions (:mod:`mrtpo.model.windows`), since a key's index in the row is not its position — or, where they cannot
be, nothing is shared and each sequence runs from position 0 in its own row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from mrtpo.model.kvcache import buffer_cache, cache_tensors, full_cache
from mrtpo.model.windows import pass_masks


@dataclass
class Segment:
    tokens: list[int]
    start: int  # position of tokens[0] in every sequence through this segment
    parent: int  # index of the parent segment, -1 at the top
    level: int  # parent's level + 1; the passes run level by level
    has_children: bool = False
    pinned: bool = False  # ends at a cut: never folded into its children (:func:`_merge_short`)


@dataclass
class Trie:
    segments: list[Segment]
    paths: list[list[int]]  # per sequence: its segments, top to bottom


def build_trie(seqs: list[list[int]], share: bool = True, min_saved: int = 64, cuts: Sequence[int] = ()) -> Trie:
    """Segments of the trie of ``seqs`` (share=False: one segment per sequence, nothing shared).

    A branching segment whose sharing saves fewer than ``min_saved`` tokens is folded into its children. ``cuts``:
    per sequence, a position at which a run of tokens it shares is cut into two segments even where nothing branches
    (the replay's prompts' beginning: :func:`mrtpo.replay.plan.cuts`; 0: none), the first never folded."""
    segs: list[Segment] = []
    paths: list[list[int]] = [[] for _ in seqs]
    if not share:
        for n, s in enumerate(seqs):
            segs.append(Segment(list(s), 0, -1, 0))
            paths[n] = [n]
        return Trie(segs, paths)
    # (sequence indices sharing tokens [0, depth), depth, parent segment)
    stack: list[tuple[list[int], int, int]] = [(list(range(len(seqs))), 0, -1)]
    while stack:
        members, depth, parent = stack.pop()
        at = {cuts[n] for n in members} if cuts else set()
        end = depth
        longer = [n for n in members if len(seqs[n]) > end]
        while (len(longer) == len(members) and len({seqs[n][end] for n in members}) == 1
               and (end == depth or end not in at)):
            end += 1
            longer = [n for n in members if len(seqs[n]) > end]
        node = parent
        if end > depth:
            level = segs[parent].level + 1 if parent >= 0 else 0
            segs.append(Segment(list(seqs[members[0]][depth:end]), depth, parent, level, pinned=end in at))
            node = len(segs) - 1
            if parent >= 0:
                segs[parent].has_children = True
            for n in members:
                paths[n].append(node)
        groups: dict[int, list[int]] = {}
        for n in longer:
            groups.setdefault(seqs[n][end], []).append(n)
        for g in groups.values():
            stack.append((g, end, node))
    return _merge_short(Trie(segs, paths), min_saved)


def _merge_short(trie: Trie, min_saved: int) -> Trie:
    """Fold every branching segment that saves fewer than ``min_saved`` tokens into its children.

    Keeping a segment with c children shared saves (c − 1) × its length in tokens, but costs a level of passes,
    and a pass has a fixed cost (:data:`PASS_COST` tokens' worth: reading the weights, the calls around them).
    Parents come before children in ``trie.segments``; a folded segment's children take its tokens and its
    parent."""
    segs = [Segment(list(s.tokens), s.start, s.parent, s.level, s.has_children, s.pinned) for s in trie.segments]
    children = [0] * len(segs)
    for s in segs:
        if s.parent >= 0:
            children[s.parent] += 1
    ends = {path[-1] for path in trie.paths if path}  # a sequence ending here needs the segment itself
    dropped = set()
    for i, s in enumerate(segs):
        while s.parent in dropped:
            p = segs[s.parent]
            s.tokens, s.start, s.parent = p.tokens + s.tokens, p.start, p.parent
        if s.has_children and not s.pinned and i not in ends and (children[i] - 1) * len(s.tokens) < min_saved:
            dropped.add(i)
            if s.parent >= 0:
                children[s.parent] += children[i] - 1
    keep = [i for i in range(len(segs)) if i not in dropped]
    new = {old: j for j, old in enumerate(keep)}
    out = []
    for i in keep:
        s = segs[i]
        parent = new[s.parent] if s.parent >= 0 else -1
        out.append(Segment(s.tokens, s.start, parent, out[parent].level + 1 if parent >= 0 else 0))
        if parent >= 0:
            out[parent].has_children = True
    return Trie(out, [[new[i] for i in path if i in new] for path in trie.paths])


@dataclass
class PassStats:
    forward_tokens: int = 0  # padded new tokens over all passes
    forward_passes: int = 0
    attention_pairs: int = 0  # (query, key) pairs the passes' queries see (:func:`pass_pairs`)
    reused_tokens: int = 0  # tokens of passes taken from a PrefixStore (not run)
    levels: list[int] = field(default_factory=list)  # passes per stage (shared levels, then the leaves)


def shared_hidden(
    decoder,
    pad_id: int,
    device: torch.device,
    seqs: list[list[int]],
    want: list[tuple[int, int]],
    token_budget: int,
    kv_budget: int,
    share: bool = True,
    own=None,
    progress: Callable[[int, int], None] | None = None,
    store=None,
    cuts: Sequence[int] = (),
) -> tuple[list[torch.Tensor], Trie, PassStats]:
    """Final hidden states of positions [lo, hi) of every sequence (want[n] = (lo, hi)), each trie node run once.

    decoder: callable like a transformers decoder stack (input_ids, attention_mask, position_ids, cache) with
    ``cache_kwarg`` naming its cache argument.  ``own``: the project's own pass over the same weights
    (:class:`mrtpo.model.llama_step.LlamaStep`), which then runs every pass instead (no cache objects, masks made
    once per pass).  A pass holds at most ``token_budget`` padded new tokens and ``kv_budget`` padded (past + new)
    tokens.  Returns per sequence (hi − lo, H), the trie and pass counts.  ``progress(forward tokens done, of
    total)`` is called after each pass (what it raises stops the passes: a Cancel); the passes are those of
    :func:`plan_passes`. ``store`` (a :class:`mrtpo.model.kvcache.PrefixStore`, given for weights that do not
    change): a pass of one shared segment alone — the prompt every sequence starts with, a verifier item's branch —
    is kept there under the tokens of every segment on its path (its ancestors' passes alone too), and a later
    replay whose plan has the same passes takes its keys, values and hidden states from there instead of running it
    (the same tensors: ``stats.reused_tokens`` counts its tokens, ``stats.forward_tokens`` does not). ``cuts``:
    :func:`build_trie`'s.
    """
    if own is None and getattr(decoder, "prefix_mode", "model") == "unshared":
        share = False  # sliding windows the passes cannot mask from positions: each sequence from position 0
    trie, batches, levels = plan_passes(seqs, token_budget, kv_budget, share, cuts)
    segs = trie.segments
    stats = PassStats(levels=levels)
    total = sum(pass_tokens(segs, b) for b in batches) if progress is not None else 0

    hidden: dict[int, torch.Tensor] = {}  # segment -> (len, H)
    kv: dict[int, torch.Tensor] = {}  # branching segment -> (layers, 2, kv_heads, len, d)
    buffer = _KVBuffer(max((len(b) * _kv_len(segs, b) for b in batches if own or _past_len(segs, b) > 0), default=0))
    alone: set[int] = set()  # segments whose every pass, theirs and their ancestors', ran alone (or came from store)
    for batch in batches:
        key = _alone_key(segs, batch, own, alone) if store is not None else None
        if key is None:
            _forward(decoder, pad_id, device, segs, batch, hidden, kv, buffer, stats, own)
        else:
            _forward_kept(store, key, decoder, pad_id, device, segs, batch, hidden, kv, buffer, stats, own)
            alone.add(batch[0])
        if progress is not None:
            progress(stats.forward_tokens + stats.reused_tokens, total)
    out = []
    for path, (lo, hi) in zip(trie.paths, want):
        if hi <= lo:
            out.append(hidden[path[-1]][:0])
            continue
        parts = [hidden[i] for i in path if segs[i].start < hi and segs[i].start + len(segs[i].tokens) > lo]
        first = next(i for i in path if segs[i].start + len(segs[i].tokens) > lo)
        h = parts[0] if len(parts) == 1 else torch.cat(parts)
        out.append(h[lo - segs[first].start : hi - segs[first].start])
    return out, trie, stats


def _alone_key(segs: list[Segment], batch: list[int], own, alone: set[int]) -> tuple | None:
    """The PrefixStore key of a pass of one shared segment alone in its batch (its keys are kept for its children)
    whose ancestors' passes ran alone too (``alone``): the tokens of every segment on its path, top first (so the
    same cuts, the same pasts), which pass runs it (the own pass or the model's layers) and the thread count; None
    for any other pass (a row's results may depend on the rows beside it, in its pass or in an ancestor's)."""
    i = batch[0]
    if len(batch) != 1 or not segs[i].has_children or (segs[i].parent >= 0 and segs[i].parent not in alone):
        return None
    path = []
    while i >= 0:
        path.append(tuple(segs[i].tokens))
        i = segs[i].parent
    return ("segment", own is not None, torch.get_num_threads(), tuple(reversed(path)))


def _forward_kept(store, key: tuple, decoder, pad_id, device, segs, batch, hidden, kv, buffer, stats, own) -> None:
    """:func:`_forward` of a pass of one segment alone: its keys, values and hidden states taken from ``store`` under
    ``key`` where it holds them (its tokens counted as reused), else run and kept there."""
    i = batch[0]
    hit = store.get(key)
    if hit is not None:
        hidden[i], kv[i] = hit
        stats.reused_tokens += len(segs[i].tokens)
        return
    _forward(decoder, pad_id, device, segs, batch, hidden, kv, buffer, stats, own)
    store.put(key, (hidden[i].clone(), kv[i]))


def plan_passes(seqs: list[list[int]], token_budget: int, kv_budget: int, share: bool = True,
                cuts: Sequence[int] = ()) -> tuple[Trie, list[list[int]], list[int]]:
    """The trie of ``seqs`` and the passes :func:`shared_hidden` runs over it, in order (each a list of segments):
    shared (branching) segments level by level, then every leaf at once, whatever its depth, so that the long leaves
    (the responses) batch by length; and the passes per stage.  A pass costs :func:`pass_tokens` forward tokens, so
    a replay's forward tokens are known before any pass runs."""
    trie = build_trie(seqs, share, cuts=cuts)
    segs = trie.segments
    depth = max((s.level for s in segs if s.has_children), default=-1)
    stages = [[i for i, s in enumerate(segs) if s.has_children and s.level == lv] for lv in range(depth + 1)]
    stages.append([i for i, s in enumerate(segs) if not s.has_children])
    batches, levels = [], []
    for stage in stages:
        split = _split(sorted(stage, key=lambda i: len(segs[i].tokens)), segs, token_budget, kv_budget)
        batches += split
        levels.append(len(split))
    return trie, batches, levels


def pass_tokens(segs: list[Segment], batch: list[int]) -> int:
    """The padded new tokens of one pass: rows × the longest row."""
    return len(batch) * max(len(segs[i].tokens) for i in batch)


def pass_pairs(segs: list[Segment], batch: list[int]) -> int:
    """The (query, key) pairs one pass's attention must compute at least: each row's n tokens see its ancestors'
    ``start`` keys and their own causally, Σ_rows n · start + n (n + 1) / 2 (padding and other rows' keys not counted:
    what masks hide costs nothing here; a sliding-window layer's queries see fewer)."""
    return sum(len(segs[i].tokens) * segs[i].start + len(segs[i].tokens) * (len(segs[i].tokens) + 1) // 2
               for i in batch)


def _past_len(segs, batch) -> int:
    return max(segs[i].start for i in batch)


def _kv_len(segs, batch) -> int:
    return _past_len(segs, batch) + max(len(segs[i].tokens) for i in batch)


PASS_COST = 128  # the fixed cost of a forward pass, in tokens' worth (on a small CPU: its weights read once)


def _split(rows: list[int], segs: list[Segment], token_budget: int, kv_budget: int) -> list[list[int]]:
    """Cut ``rows`` (sorted by length) into consecutive batches within both budgets, minimizing padded tokens
    plus PASS_COST per pass (dynamic programming over the cut points; a row alone always fits)."""
    n = len(rows)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of rows[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        L = len(segs[rows[j - 1]].tokens)  # the longest of rows[i:j]
        C = 0
        for i in range(j - 1, -1, -1):
            C = max(C, segs[rows[i]].start)
            b = j - i
            if b > 1 and (b * L > token_budget or b * (C + L) > kv_budget):
                break
            cost = best[i] + b * L + PASS_COST
            if cost < best[j]:
                best[j], cut[j] = cost, i
    out, j = [], n
    while j > 0:
        out.append(rows[cut[j] : j])
        j = cut[j]
    return out[::-1]


class _KVBuffer:
    """One allocation, reused by every pass, for the (layers, 2, batch, kv_heads, past + new, d) keys and values.

    Fresh memory costs page faults on a CPU (more than the attention over it), so the passes share one."""

    def __init__(self, tokens: int):
        self.tokens, self.flat = tokens, None

    def view(self, shape: tuple[int, int, int], like: torch.Tensor, b: int, length: int) -> torch.Tensor:
        """(layers, 2, b, kv_heads, length, d) for ``shape`` (layers, kv_heads, d), ``like``'s dtype and device."""
        n_layers, kv_heads, d = shape
        numel = n_layers * 2 * kv_heads * d * b * length
        if self.flat is None or self.flat.numel() < numel or self.flat.dtype != like.dtype:
            self.flat = like.new_empty(max(numel, n_layers * 2 * kv_heads * d * self.tokens))
        return self.flat[:numel].view(n_layers, 2, b, kv_heads, length, d)


def _forward(decoder, pad_id, device, segs, batch, hidden, kv, buffer: _KVBuffer, stats, own=None) -> None:
    b = len(batch)
    L = max(len(segs[i].tokens) for i in batch)
    C = _past_len(segs, batch)
    input_ids = torch.full((b, L), pad_id, dtype=torch.long)
    mask = torch.zeros((b, C + L), dtype=torch.bool)
    pos = torch.zeros((b, L), dtype=torch.long)
    for j, i in enumerate(batch):
        s = segs[i]
        input_ids[j, : len(s.tokens)] = torch.tensor(s.tokens)
        mask[j, : s.start] = True
        mask[j, C : C + len(s.tokens)] = True
        # a padding slot repeats the row's last position: counting on past the row's end could index past the
        # model's learned positions (GPT-2) in a row that itself fits them
        pos[j] = s.start + torch.arange(L).clamp_max(max(len(s.tokens) - 1, 0))
    keep = [j for j, i in enumerate(batch) if segs[i].has_children]
    buf = None
    if C > 0 or own is not None:  # the rows' pasts and the new keys in one preallocated buffer (no concatenation)
        if own is not None:
            shape, like = (len(own.layers), own.kv_heads, own.head_dim), own.embed
        else:  # rows with a past have a parent (start > 0); a top-level row (no past) may come first in the batch
            like = kv[next(segs[i].parent for i in batch if segs[i].parent >= 0)]
            shape = (like.shape[0], like.shape[2], like.shape[4])  # a segment's KV: (layers, 2, kv_heads, len, d)
        buf = buffer.view(shape, like, b, C + L)
        for j, i in enumerate(batch):
            buf[:, :, j, :, segs[i].start : C] = 0  # masked, but must not be NaN
            a = segs[i].parent
            while a >= 0:
                s = segs[a]
                buf[:, :, j, :, s.start : s.start + len(s.tokens)] = kv[a]
                a = s.parent
    if own is not None:
        # a row's queries see its past (mask[:, :C]) and its own keys causally (its padding comes after its tokens)
        h = own.forward(input_ids.to(device), pos.to(device), buf, C, mask[:, :C])  # (b, L, H)
        for j in keep:
            kv[batch[j]] = buf[:, :, j, :, C : C + len(segs[batch[j]].tokens)].clone()  # (layers, 2, kv_heads, n, d)
    else:
        # the layers get every key (a sliding-window layer too: its window is in the mask), so a kept segment's keys
        # are whole whatever the model's own cache would keep
        kwargs = {decoder.cache_kwarg: buffer_cache(buf, C) if C > 0 else full_cache()} if keep or C > 0 else {}
        attention_mask = mask.long().to(device)
        if getattr(decoder, "prefix_mode", "model") == "own":  # sliding windows: masks from positions
            key_pos = torch.cat([torch.arange(C).expand(b, C), pos], dim=1)  # (b, C + L)
            attention_mask = pass_masks(decoder.module.config, key_pos.to(device), mask.to(device), pos.to(device),
                                        mask[:, C:].to(device), decoder.dtype)
        out = decoder(input_ids=input_ids.to(device), attention_mask=attention_mask, position_ids=pos.to(device),
                      use_cache=bool(keep) or C > 0, **kwargs)
        h = out.last_hidden_state
        if keep:
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            layers = cache_tensors(cache)
            for j in keep:
                n = len(segs[batch[j]].tokens)
                kv[batch[j]] = torch.stack([torch.stack([K[j, :, C : C + n], V[j, :, C : C + n]]) for K, V in layers])
    for j, i in enumerate(batch):
        hidden[i] = h[j, : len(segs[i].tokens)]
    stats.forward_tokens += b * L
    stats.forward_passes += 1
    stats.attention_pairs += pass_pairs(segs, batch)
