"""What a replay runs, known before it runs: each group's :class:`Plan` (its responses tokenized —
:func:`response_tokens`, :func:`text_and_offsets` —, the rewards replayed, every variant prompt; :func:`plan_group`),
the sequences of the plans (:func:`sequences`), the rows of their vocabulary side (:func:`vocab_rows`), and the
replay's progress in forward tokens over both (:func:`replay_progress`). :mod:`mrtpo.replay.engine` runs them;
:mod:`mrtpo.replay.estimate` counts them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from mrtpo.core.advantages import active_rewards
from mrtpo.model import LoadedModel, Sample, check_length, decode, token_offsets, tokenize_response
from mrtpo.model.rates import head_share
from mrtpo.templates import ALL, REWORDINGS, Template, TemplateError, reworded_key, variant_label


def response_tokens(lm: LoadedModel, r) -> tuple[str | None, list[int], list[tuple[int, int]] | None]:
    """(text, token ids, character offsets) of a response (text, :class:`Sample` or token ids); for token ids the text
    and offsets are None (filled by :func:`text_and_offsets` once the length is checked: a response too long for the
    model fails fast)."""
    if isinstance(r, str):
        ids, offs = tokenize_response(lm, r)
        return r, ids, offs
    ids = list(r.token_ids) if isinstance(r, Sample) else [int(t) for t in r]
    return None, ids, None


def text_and_offsets(lm: LoadedModel, text: str | None, ids: list[int], offs) -> tuple[str, list[tuple[int, int]]]:
    """(text, character offsets) of a response: as given for a text, decoded from the token ids otherwise."""
    return (text, offs) if text is not None else (decode(lm, ids), token_offsets(lm, ids))


def group_rewards(verifier_info, responses: Sequence, rewards) -> tuple[list[dict[str, str]], list[str], list[str]]:
    """(each response's {reward: v_k}, the rewards replayed, the rewards skipped): ``verifier_info`` one dict for the
    group or one per response; a reward is skipped when it is constant in the group's ``rewards`` (G, K), None: none
    is."""
    G = len(responses)
    infos = list(verifier_info) if isinstance(verifier_info, (list, tuple)) else [verifier_info] * G
    if len(infos) != G:
        raise ValueError(f"verifier_info has {len(infos)} entries for {G} responses")
    act, skip = active_rewards(list(infos[0]) if infos else [], rewards)
    return infos, act, skip


@dataclass
class Plan:
    """What a replay runs for one group, known before it runs: per response its text, token ids and offsets, every
    variant prompt's text and token ids; the rewards replayed and skipped, and each reward's rewordings."""

    texts: list[str]
    resp_ids: list[list[int]]
    offsets: list[list[tuple[int, int]]]
    prompt_texts: list[dict[str, str]]
    prompt_ids: list[dict[str, list[int]]]
    rewards: list[str]
    skipped: list[str]
    reworded: dict[str, list[str]]  # reward -> the variant keys of its rewordings (P_k′; empty without rewording)
    shared: int = 0  # P_all's first tokens that every variant of every reward shares (the text before v_1)

    @property
    def variants(self) -> list[str]:
        """Every prompt variant's key: P_all, each P_\\k, each P_k′."""
        return [ALL] + self.rewards + [v for vs in self.reworded.values() for v in vs]


def plan_group(lm, prompt, verifier_info, responses, template, rewards, reword: bool = False,
               offsets: bool = True) -> Plan:
    """A group's :class:`Plan`: its responses tokenized (:func:`response_tokens`), the rewards to replay (the others
    constant in the group), every variant prompt filled by ``template`` and tokenized, and every (prompt, response)
    checked against the model's context before any pass; ``offsets`` False: no character offsets (an estimate)."""
    template = template or Template()
    infos, act, skip = group_rewards(verifier_info, responses, rewards)
    texts, ids, offs, ptexts, pids = [], [], [], [], []
    enc_cache: dict[str, list[int]] = {}
    for i, (r, info) in enumerate(zip(responses, infos)):
        text, rid, off = response_tokens(lm, r)
        try:  # each message's length is checked before it is built (at most MAX_FILLED_CHARS characters) ...
            msgs = template.variants(prompt, info, act, reworded=reword)
        except TemplateError as e:
            raise TemplateError(f"the prompts for response {i}: {e}") from None
        full = {v: lm.chat_prompt(m) for v, m in msgs.items()}
        toks = {}
        for v, t in full.items():
            if t not in enc_cache:
                enc_cache[t] = lm.encode(t)
            toks[v] = enc_cache[t]
            # ... and in tokens against the model's context here, before any forward pass (P_all, the longest, first)
            check_length(lm, len(toks[v]) + len(rid), f"{variant_label(v, act)} + response {i}", response=i)
        texts.append(text), ids.append(rid), offs.append(off), ptexts.append(full), pids.append(toks)
    for i, (text, rid, off) in enumerate(zip(texts, ids, offs)):  # every length checked: the offsets now
        if offsets:  # (an estimate needs only the token ids)
            texts[i], offs[i] = text_and_offsets(lm, text, rid, off)
    reworded = {k: [reworded_key(k, j) for j in range(len(REWORDINGS))] if reword else [] for k in act}
    return Plan(texts, ids, offs, ptexts, pids, act, skip, reworded,
                _shared_tokens(lm, template, prompt, infos, enc_cache))


def _shared_tokens(lm, template: Template, prompt: str, infos: list[dict[str, str]], enc_cache: dict) -> int:
    """How many first tokens of the first response's P_all every P_\\k shares, over every reward of the group —
    replayed or not —: the prompt's text before the first verifier item, the same whichever rewards a group replays
    (the replay's passes cut there: :func:`cuts`)."""
    if not infos or not infos[0]:
        return 0
    try:
        msgs = template.variants(prompt, infos[0], list(infos[0]))
    except TemplateError:
        return 0
    toks = []
    for m in msgs.values():
        t = lm.chat_prompt(m)
        if t not in enc_cache:
            enc_cache[t] = lm.encode(t)
        toks.append(enc_cache[t])
    first = toks[0]
    return min(next((j for j, (a, b) in enumerate(zip(first, t)) if a != b), min(len(first), len(t))) for t in toks)


def cuts(plans: Sequence) -> list[int]:
    """Per sequence of :func:`sequences` (in its order), where the replay's passes cut the prompts' shared beginning
    (:func:`mrtpo.replay.kvtrie.build_trie`): its plan's :attr:`Plan.shared`, so that the pass of that beginning is
    the same whichever rewards a group replays, and a model whose weights do not change reuses it across groups of
    the same prompt."""
    return [plan.shared for plan in plans for _ in plan.resp_ids for _ in plan.variants]




def sequences(plans: Sequence) -> tuple[list[tuple[int, int, str]], list[list[int]], list[tuple[int, int]]]:
    """Every (group, response, variant) of ``plans``, its sequence (variant prompt + response) and the positions
    whose final hidden states the replay reads: the state before response token t predicts it, S − 1 … S + T − 2."""
    keys = [(g, i, v) for g, plan in enumerate(plans) for i in range(len(plan.resp_ids)) for v in plan.variants]
    seqs = [plans[g].prompt_ids[i][v] + plans[g].resp_ids[i] for g, i, v in keys]
    starts = [len(plans[g].prompt_ids[i][v]) - 1 for g, i, v in keys]
    want = [(s, s + len(plans[g].resp_ids[i])) for s, (g, i, _) in zip(starts, keys)]
    return keys, seqs, want


def vocab_rows(plans: Sequence) -> int:
    """Rows the vocabulary side projects at most: 1 + K′ per response token (P_all and every other variant; a variant
    whose state equals P_all's is skipped)."""
    return sum(len(rid) * len(plan.variants) for plan in plans for rid in plan.resp_ids)


def replay_progress(lm, plans: Sequence, progress: Callable[[float, float], None] | None):
    """(the passes' callback ``(done, total)``, the vocabulary side's ``tick(rows)``), both reporting
    ``progress(done, total)`` in forward tokens over the whole replay: the passes' padded tokens, then each row of
    the vocabulary side as :func:`mrtpo.model.rates.head_share` of a token.  ``done`` grows to ``total``.
    (None, None) without ``progress``: nothing is called."""
    if progress is None:
        return None, None
    share, rows_total = head_share(lm), vocab_rows(plans)
    state = {"fwd": 0, "rows": 0}

    def on_pass(done: int, total: int) -> None:
        state["fwd"] = total
        progress(done, total + share * rows_total)

    def tick(rows: int) -> None:
        state["rows"] += rows
        progress(state["fwd"] + share * state["rows"], state["fwd"] + share * rows_total)

    return on_pass, tick
