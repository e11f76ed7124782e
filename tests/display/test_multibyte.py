"""Multi-byte characters (issue 33, item 16): a character split over several tokens (byte-level BPE, byte tokens) is
drawn once, as one cell whose advantages are the sum of its tokens' and whose relevance ρ is their mean
(mrtpo.core.spans), in every surface: token offsets, explain / rollouts heatmaps, `relevance` JSON, the credit log
and the run viewer; every per-token number stays per token.

The expected cells come from the tokens' bytes, not from the code under test: tokens that hold bytes of one
character are one cell."""
import html
import json
import re

import numpy as np
import pytest
import torch

from mrtpo.core.spans import cells, owner_spans
from mrtpo.display import render
from mrtpo.model import token_offsets, tokenize_response
from mrtpo.model.tokens import decode

# Arabic (2 bytes a character), Latin with an accent and an emoji (4 bytes), CJK (3 bytes), a lone combining accent
TEXTS = ["مرحبا", "héllo 👋 world", "日本語のテキスト、漢字。", "\u0301"]
MODELS = ["tiny", pytest.param("smol", marks=pytest.mark.model)]


@pytest.fixture(params=MODELS)
def lm(request):
    return request.getfixturevalue(request.param)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (SmolLM2's and the tiny model's tokens): character → byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


DEC = _byte_decoder()


def expected_cells(lm, ids: list[int], text: str) -> tuple[list[list[int]], list[str]]:
    """(cells, their texts) from the tokens' bytes: consecutive tokens sharing a character are one cell."""
    owner = [c for c, ch in enumerate(text) for _ in ch.encode()]  # the character of each byte of the text
    pos, chars = 0, []
    for tok in lm.tokenizer.convert_ids_to_tokens(ids):
        b = bytes(DEC[c] for c in tok)
        chars.append({owner[p] for p in range(pos, pos + len(b))})
        pos += len(b)
    assert pos == len(text.encode())
    groups = [[0]]
    for t in range(1, len(ids)):
        (groups[-1].append(t) if chars[t] & chars[t - 1] else groups.append([t]))
    return groups, ["".join(text[c] for c in sorted(set().union(*(chars[t] for t in g)))) for g in groups]


def check_spans(spans, text: str) -> None:
    """The rule: contiguous spans covering the text, each character owned by exactly one token."""
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a <= b for a, b in spans) and all(spans[t][1] == spans[t + 1][0] for t in range(len(spans) - 1))
    assert "".join(text[a:b] for a, b in spans) == text


# ---------------------------------------------------------------------------------------------- offsets
def test_offsets_give_each_character_one_owner_and_the_cells_of_its_tokens(lm):
    for text in TEXTS:
        ids, spans = tokenize_response(lm, text)
        groups, texts = expected_cells(lm, ids, text)
        check_spans(spans, text)
        assert cells(spans) == groups, text
        assert [text[spans[g[0]][0]:spans[g[-1]][1]] for g in groups] == texts
        assert spans == token_offsets(lm, ids)  # text and token ids give the same spans
    assert len(groups) == 1 and texts == ["\u0301"]  # the lone accent: its bytes are one cell


def test_a_token_ending_inside_a_character_joins_the_character(smol):
    """SmolLM2 writes ' 👋' as ' ð\\x9f' + two byte tokens: the first token holds the space and the emoji's first
    bytes, so the three are one cell ' 👋' (the old rule gave the space to the first token alone)."""
    ids, spans = tokenize_response(smol, "héllo 👋 world")
    assert smol.tokenizer.convert_ids_to_tokens(ids)[3:6] == ["ĠðŁ", "ĳ", "ĭ"]
    assert token_offsets(smol, ids)[3:6] == spans[3:6] == [(5, 5), (5, 5), (5, 7)]
    assert [c for c in cells(spans) if len(c) > 1] == [[3, 4, 5]]  # 'Ã©' (é) is one token in SmolLM2


def test_sentencepiece_byte_fallback_follows_the_rule():
    """A Llama-style tokenizer (byte fallback <0xE6> ..., a ▁ it prepends and its decoder drops): the text's spans
    equal the ids' and each character is one cell (the tokenizer's own mapping gives the three bytes of 日 and the
    prepended ▁ the character's span: '日' and 't' were drawn several times)."""
    from tests.model.test_tokens import llama_style

    lm = llama_style()
    for text, want in [("日本 text", ["日", "本", " ", "t", "e", "x", "t"]),
                       ("naïve café 👋", list("naïve café 👋")), ("the text", list("the text"))]:
        ids, spans = tokenize_response(lm, text)
        check_spans(spans, text)
        assert spans == token_offsets(lm, ids) and decode(lm, ids) == text
        assert [text[spans[g[0]][0]:spans[g[-1]][1]] for g in cells(spans)] == want
    assert lm.tokenizer.convert_ids_to_tokens(ids)[:2] == ["▁", "t"] and cells(spans)[0] == [0, 1]


def test_owner_spans_of_other_forms():
    # a tokenizer's offset mapping (each byte token has its character's span), a gap, the text's tail
    assert owner_spans([(0, 1), (1, 2), (1, 2), (3, 4)], 5) == [(0, 1), (1, 1), (1, 2), (2, 5)]
    # already in the rule's form (an EOS at the end keeps its empty span): unchanged
    assert owner_spans([(0, 1), (1, 1), (1, 3), (3, 3)], 3) == [(0, 1), (1, 1), (1, 3), (3, 3)]
    assert cells([(0, 1), (1, 1), (1, 3), (3, 3)]) == [[0], [1, 2], [3]]
    assert owner_spans([], 0) == [] and cells([]) == []


# ---------------------------------------------------------------------------------------------- heatmaps
ROW = re.compile(r'<div class="row"><div class="lab">(.*?)</div><div class="toks">(.*?)</div></div>', re.S)
TOK = re.compile(r'<span class="tok[^"]*" style="background:([^"]*)" data-i="\d+" data-tip="([^"]*)">(.*?)</span>',
                 re.S)
NEG = "rgba(%d,%d,%d," % render.NEG


def rows_of(body: str) -> list[tuple[str, list[tuple[float, str, str]]]]:
    """[(row label, [(signed alpha, tooltip, text) per drawn cell])] of a heatmap."""
    out = []
    for lab, toks in ROW.findall(body):
        drawn = []
        for bg, title, text in TOK.findall(toks):
            a = 0.0 if bg == "transparent" else float(bg.rsplit(",", 1)[1].rstrip(")"))
            drawn.append((-a if bg.startswith(NEG) else a, html.unescape(title), html.unescape(text)))
        out.append((html.unescape(re.sub(r"<.*", "", lab)), drawn))
    return out


def row(body: str, label: str) -> list[tuple[float, str, str]]:
    """The cells of the one row labelled ``label``."""
    found = [c for lab, c in rows_of(body) if lab == label]
    assert len(found) == 1, (label, [lab for lab, _ in rows_of(body)])
    return found[0]


def alpha(v: float, vmax: float, kind: str) -> float:
    """The signed alpha a value is drawn with (render's scale: 0.85 at the limit)."""
    a = min(1.0, abs(v) / vmax) * 0.85
    return -a if kind == "diverging" and v < 0 else a


def _view(lm):
    from mrtpo.display import token_view
    from mrtpo.groups import ScoredGroup
    from mrtpo.model import Sample
    from mrtpo.replay import replay_group
    from mrtpo.tasks.base import Example

    info = {"a": "Answer in Arabic.", "b": "Wave to the user."}
    R = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    group = ScoredGroup.unscored(Example("mb", "Greet me.", {}), [Sample([], t) for t in TEXTS], ["a", "b"], info, R)
    replay = replay_group(lm, group.prompt, info, TEXTS, rewards=R)
    return token_view(group, replay, "mrtpo", 0.5)


def test_heatmaps_draw_each_character_once_with_the_sum_of_its_tokens(lm):
    from mrtpo.display import view_to_json

    v = _view(lm)
    for i, text in enumerate(TEXTS):
        ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
        groups, texts = expected_cells(lm, ids, text)
        T = len(ids)
        lim = render.limits(v, "response", i, rewards=["b"])
        body = render.response_html(v, i, rewards=["b"], combined=False)
        k, j = "b", 1
        ta, rel, mv, uni = v.token_adv_per_reward[i][k], v.relevance[i][k], v.moved(i, k), float(v.per_reward[i, j])
        checks = {f"mrtpo β={v.beta:g}": (ta, "sum", lim.adv, "diverging"),
                  "relevance ρ": (rel, "mean", lim.rel, "sequential"),
                  f"moved by MRTPO: A − Â (±{lim.moved:.3g})": (mv, "sum", lim.moved, "diverging"),
                  f"GDPO (uniform) {uni:+.3f}": (np.full(T, uni), "sum", lim.adv, "diverging")}
        for label, (vals, how, vmax, kind) in checks.items():
            drawn = row(body, label)
            assert [c[2] for c in drawn] == texts and "".join(c[2] for c in drawn) == text, (label, text)
            for (a, tip, _), g in zip(drawn, groups):
                want = sum(float(vals[t]) for t in g) if how == "sum" else float(np.mean([vals[t] for t in g]))
                assert a == pytest.approx(alpha(want, vmax, kind), abs=2e-3), (label, text, g)
                if len(g) > 1:  # the hover keeps every token's number
                    assert tip.count("\ntoken ") == len(g)
                    assert all(f"relevance {rel[t]:.3f}" in tip and f"advantage {ta[t]:+.4f}" in tip for t in g)
        if any(len(g) > 1 for g in groups):
            assert "one cell" in render.response_html(v, i)  # the legend says how a split character is drawn
        # the JSON keeps one number per token and the spans of the rule
        r = view_to_json(v)["responses"][i]
        assert len(r["token_advantage"]) == len(r["relevance"]["b"]) == len(r["tokens"]) == T
        check_spans([(t["start"], t["end"]) for t in r["tokens"]], text)
        assert cells([(t["start"], t["end"]) for t in r["tokens"]]) == groups


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_relevance_and_rollouts_draw_each_character_once(tiny, tmp_path):
    from mrtpo.cli import main

    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps({"id": n, "prompt": "Greet me.", "verifier_info": {"a": "Be kind."},
                                         "response": t}) + "\n" for n, t in enumerate(TEXTS)))
    out = tmp_path / "rel.jsonl"
    assert main(["relevance", "--input", str(cases), "--output", str(out), "--model", "tiny-random", "--device",
                 "cpu", "--quiet"]) == 0
    for line, text in zip(out.read_text().splitlines(), TEXTS):
        d = json.loads(line)
        spans = [(t["start"], t["end"]) for t in d["tokens"]]
        check_spans(spans, text)
        assert [t["text"] for t in d["tokens"]] == [text[a:b] for a, b in spans]
        ids = tiny.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert cells(spans) == expected_cells(tiny, ids, text)[0] and len(d["relevance"]["a"]) == len(ids)

    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps({"input": "Greet me.", "output": t, "step": 1,
                                            "score": {"kind": float(n % 2)}}) + "\n" for n, t in enumerate(TEXTS)))
    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps({"kind": "Be kind."}))
    page = tmp_path / "o.html"
    assert main(["rollouts", "--input", str(rollouts), "--verifier-template", str(vt), "--output",
                 str(tmp_path / "o.jsonl"), "--html", str(page), "--model", "tiny-random", "--device", "cpu"]) == 0
    drawn = [[c[2] for c in r] for _, r in rows_of(page.read_text())]
    assert len(drawn) == 4 * 6  # per response: 4 rows of its reward, 2 combined
    for text in TEXTS:  # every row of a response is its cells, each character once
        ids = tiny.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert drawn.count(expected_cells(tiny, ids, text)[1]) == 6
    resp = json.loads((tmp_path / "o.jsonl").read_text().splitlines()[0])["responses"]
    for r in resp:
        check_spans([(t["start"], t["end"]) for t in r["tokens"]], r["response"])


# ---------------------------------------------------------------------------------------------- the credit log
def _log_rows(lm, texts, offsets=None):
    """A credit-log group as mrtpo's trainer writes it (completion = decode(ids), offsets = token_offsets(ids)), with
    credit from a real credit step; ``offsets``: other offsets per response (an old or another tool's log)."""
    from mrtpo.core.credit import CreditConfig, assign_credit
    from mrtpo.creditlog import credit_fields

    ids = [lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    N, T = len(ids), max(map(len, ids))
    mask = torch.tensor([[t < len(x) for t in range(T)] for x in ids])
    g = torch.Generator().manual_seed(0)
    rho = torch.rand(N, 1, T, generator=g) * 2 * mask[:, None]
    rho = rho * mask.sum(-1)[:, None, None] / rho.sum(-1, keepdim=True)  # mean 1 over each response's tokens
    R = torch.tensor([[float(i % 2)] for i in range(N)])
    credit = assign_credit(R, rho, mask, CreditConfig(method="mrtpo", beta=0.5, warmup=None), group_size=N)
    rows = []
    for i, x in enumerate(ids):
        n = len(x)
        rows.append({"step": 1, "time": 1.0, "group": 0, "index": i, "prompt": "p", "completion": decode(lm, x),
                     "token_ids": x, "offsets": [list(o) for o in (offsets[i] if offsets else token_offsets(lm, x))],
                     "reasons": None, "logprob": [-0.5] * n, "entropy": [0.25 * (t + 1) for t in range(n)],
                     "ref_logprob": None, "kl": None, **credit_fields(credit, i, ["a"], n, R[i].tolist(), ["a"])})
    return rows


def _read(tmp_path, rows):
    from mrtpo.creditlog import CreditLogWriter, read_credit_log

    CreditLogWriter(tmp_path / "log", {"source": "test", "model": "m", "method": "mrtpo", "measure": "js",
                                       "info": "rule", "group_size": len(rows), "rewards": ["a"]}).write_step(1, rows)
    return read_credit_log(tmp_path / "log").steps[0].rows


def _check_log_drawing(rows, texts, groups_of):
    """The run viewer's heatmaps and token table of logged rows: each character once, sums and means by cell."""
    from mrtpo.display.log_tokens import token_table
    from mrtpo.display.log_view import log_view, series_html

    v, lg = log_view(rows, "mrtpo")
    for i, (r, text) in enumerate(zip(rows, texts)):
        groups = groups_of(i)
        lim = render.limits(v, "response", i)
        body = render.response_html(v, i, group=lg, combined=False)
        drawn = row(body, f"mrtpo β={v.beta:g}")
        assert "".join(c[2] for c in drawn) == text and len(drawn) == len(groups)
        ta, rel = r.reward_token_advantages["a"], r.relevance["a"]
        for (a, _, _), (b, _, _), g in zip(drawn, row(body, "relevance ρ"), groups):
            assert a == pytest.approx(alpha(sum(ta[t] for t in g), lim.adv, "diverging"), abs=2e-3)
            assert b == pytest.approx(alpha(float(np.mean([rel[t] for t in g])), lim.rel, "sequential"), abs=2e-3)
        # a log's series (here the entropy: it adds up along the tokens) on the same cells, each its own scale
        series = rows_of(series_html(r))
        ent = [c for lab, c in series if lab.startswith("entropy")][0]
        assert [c[2] for c in ent] == [c[2] for c in drawn]
        sums = [sum(r.entropy[t] for t in g) for g in groups]
        assert [c[0] for c in ent] == pytest.approx([alpha(x, max(sums), "sequential") for x in sums], abs=2e-3)
        table = token_table(r)
        assert [d["A"] for d in table] == ta  # every token keeps its own number
        for g in groups:
            cell_text = "".join(r.completion[a:b] for a, b in owner_spans(r.offsets, len(r.completion))[g[0]:g[-1] + 1])
            assert [d["token"] for d in (table[t] for t in g)] == [cell_text] * len(g)
            assert [table[t]["part"] for t in g] == ([f"{k}/{len(g)}" for k in range(1, len(g) + 1)]
                                                     if len(g) > 1 else [None])


def test_credit_log_offsets_follow_the_rule_and_the_viewer_draws_cells(lm, tmp_path):
    rows = _read(tmp_path, _log_rows(lm, TEXTS))
    groups = []
    for r, text in zip(rows, TEXTS):
        assert r.completion == text
        check_spans(r.offsets, text)
        groups.append(expected_cells(lm, r.token_ids, text)[0])
        assert cells(r.offsets) == groups[-1]
    _check_log_drawing(rows, TEXTS, lambda i: groups[i])


def test_old_and_other_credit_logs_still_draw_each_character_once(smol, tmp_path):
    """A log written before this rule (the token holding ' ' and the emoji's first bytes owned the space) and one
    whose offsets are a tokenizer's offset mapping (every byte token has its character's span) draw every character
    once, each cell the sum of its tokens."""
    text = "héllo 👋 world"
    ids = smol.tokenizer(text, add_special_tokens=False)["input_ids"]
    old = [(0, 1), (1, 2), (2, 5), (5, 6), (6, 6), (6, 7), (7, 13)]  # what mrtpo wrote before
    mapping = smol.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert len(ids) == 7 and [tuple(o) for o in mapping][3:6] == [(5, 7), (6, 7), (6, 7)]
    rows = _read(tmp_path, _log_rows(smol, [text, text], offsets=[old, [tuple(o) for o in mapping]]))
    _check_log_drawing(rows, [text, text], lambda i: [[0], [1], [2], [3], [4, 5], [6]] if i == 0
                       else expected_cells(smol, ids, text)[0])
