"""Relevance measures (mrtpo.core.measures.MEASURES): hand-worked values, the paper's js unchanged, the log-ratio
against full log-softmaxes, and the same name reaching the replay, the stored replay and the CLI."""
import numpy as np
import pytest
import torch

from mrtpo.core.js import normalize_relevance
from mrtpo.core.measures import (
    MEASURES,
    MeasureInput,
    carry_forward,
    contrast,
    get_measure,
    lead,
    measure_relevance,
    needs_attention,
    needs_replay,
    needs_rewording,
    reworded_contrast,
    support,
    word_max,
)
from mrtpo.errors import MrtpoError
from mrtpo.replay import ReplayConfig, naive_replay_group, replay_group
from mrtpo.templates import ALL

PROMPT = "Schema: users(id, name, age). List the names of users older than 30."
INFO = {"format": "Answer with one ```sql block.", "correct": "Reference query: SELECT name FROM users WHERE age > 30"}
RESPONSES = ["```sql\nSELECT name FROM users WHERE age > 30\n```", "SELECT * FROM users;"]


def test_word_max_hand_worked():
    text = "ab cd  e"
    # tokens 'a', 'b', ' c', 'd', ' ', ' e' (the last starts with a space, overlaps word "e")
    offsets = [(0, 1), (1, 2), (2, 4), (4, 5), (5, 6), (6, 8)]
    v = np.array([0.1, 0.5, 0.2, 0.0, 0.9, 0.3])
    # words "ab" (tokens 0, 1: max 0.5), "cd" (2, 3: max 0.2), "e" (5: 0.3); token 4 (a space) keeps its own 0.9
    np.testing.assert_allclose(word_max(v, offsets, text), [0.5, 0.5, 0.2, 0.2, 0.9, 0.3])
    # a token spanning two words ('b c') belongs to both and takes the larger word maximum (not transitive:
    # word "cd" has max(0.1, 0.2) = 0.2)
    np.testing.assert_allclose(word_max(np.array([0.4, 0.1, 0.2]), [(0, 1), (1, 4), (4, 5)], "ab cd"),
                               [0.4, 0.4, 0.2])
    assert word_max(np.array([]), [], "").shape == (0,)


def test_measures_on_a_hand_made_input():
    inp = MeasureInput(js=np.array([0.0, 0.3, 0.1], np.float32), logp_all=np.log(np.array([0.5, 0.2, 0.9])),
                       logp_without=np.log(np.array([0.25, 0.2, 0.3])), offsets=[(0, 2), (2, 3), (3, 6)],
                       text="abc de")
    np.testing.assert_allclose(get_measure("js")(inp), [0.0, 0.3, 0.1])
    np.testing.assert_allclose(get_measure("js-word")(inp), [0.3, 0.3, 0.1])  # words "abc" (tokens 0, 1), "de"
    np.testing.assert_allclose(get_measure("logratio")(inp), [np.log(2), 0.0, np.log(3)], rtol=1e-6)
    rho = measure_relevance("js", inp)
    np.testing.assert_allclose(rho, [0.0, 2.25, 0.75])  # T·d/Σd
    # a zero probability under one prompt: −inf log-ratio becomes the largest finite score, never NaN
    bad = MeasureInput(inp.js, np.array([-np.inf, -1.0, -1.0]), np.array([-1.0, -1.0, -3.0]), inp.offsets, inp.text)
    rho = measure_relevance("logratio", bad)
    assert np.isfinite(rho).all() and rho.mean() == pytest.approx(1.0)
    with pytest.raises(MrtpoError, match="unknown relevance measure 'nope'.*js-word"):
        get_measure("nope")


def test_carry_forward_and_contrast_hand_worked():
    x = np.array([0.1, 0.8, 0.0, 0.05, 0.3, 0.0])
    p = np.array([0.2, 0.3, 0.9, 0.6, 0.95, 0.4])  # π(y_t|P_all): tokens 2, 3, 4 are near certain
    # t=2: max(0, 0.8) = 0.8; t=3: max(0.05, 0.8); t=4: max(0.3, 0.8); t=5 is not sure: its own 0.0
    np.testing.assert_allclose(carry_forward(x, np.log(p)), [0.1, 0.8, 0.8, 0.8, 0.8, 0.0])
    np.testing.assert_allclose(carry_forward(x, np.log(p), min_prob=0.92), [0.1, 0.8, 0.0, 0.05, 0.3, 0.0])
    d = np.array([0.3, 0.1, 0.5])
    others = np.array([[0.1, 0.2, 0.5], [0.3, 0.0, 0.1]])  # mean (0.2, 0.1, 0.3)
    np.testing.assert_allclose(contrast(d, others), [0.1, 0.0, 0.2], atol=1e-7)
    np.testing.assert_allclose(contrast(d, np.zeros((0, 3))), d)  # one reward replayed: d itself
    inp = MeasureInput(js=d.astype(np.float32), logp_all=np.log([0.1, 0.99, 0.1]), logp_without=np.zeros(3),
                       offsets=[(0, 1), (1, 2), (3, 4)], text="ab c", js_others=others)
    # contrast (0.1, 0, 0.2) → word max over "ab" (0.1, 0.1, 0.2) → carry: token 1 is sure (0.99) → same
    np.testing.assert_allclose(get_measure("js-contrast")(inp), [0.1, 0.1, 0.2], atol=1e-7)
    # js-word-carry: word max (0.3, 0.3, 0.5); carrying changes nothing here
    np.testing.assert_allclose(get_measure("js-word-carry")(inp), [0.3, 0.3, 0.5], atol=1e-7)


def test_support_hand_worked():
    d = np.array([0.3, 0.1, 0.5, 0.4], np.float32)
    others = np.array([[0.1, 0.2, 0.5, 0.0], [0.3, 0.0, 0.1, 0.0]])  # mean (0.2, 0.1, 0.3, 0.0)
    lp_all = np.log([0.5, 0.5, 0.2, 0.9])
    lp_without = np.log([0.25, 0.4, 0.4, 0.9])  # v_k raised tokens 0, 1; lowered 2; token 3 equal
    # max(0, d − ½·mean) = (0.2, 0.05, 0.35, 0.4); kept where log π(y_t|P_all) > log π(y_t|P_\k): tokens 0, 1
    np.testing.assert_allclose(support(d, others, lp_all, lp_without), [0.2, 0.05, 0.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(support(d, others, lp_all, lp_without, share=1.0), [0.1, 0.0, 0.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(support(d, None, lp_all, lp_without), [0.3, 0.1, 0.0, 0.0], atol=1e-7)
    # the measure: lead (0.2, 0.05, 0, 0) → same; word max over "ab" (tokens 0, 1); carrying over near-certain
    # tokens (token 3: 0.9) has nothing to carry
    inp = MeasureInput(js=d, logp_all=lp_all, logp_without=lp_without, offsets=[(0, 1), (1, 2), (3, 4), (5, 6)],
                       text="ab c d", js_others=others)
    np.testing.assert_allclose(get_measure("js-support")(inp), [0.2, 0.2, 0.0, 0.0], atol=1e-7)
    # the other way round v_k raised token 2 only: (0, 0, 0.35, 0); lead gives token 1 token 2's (0, 0.35, 0.35, 0),
    # word max gives token 0 its word's (0.35, 0.35, 0.35, 0), and token 3 (π = 0.9 under P_all: sure) carries it
    flip = MeasureInput(d, lp_without, lp_all, inp.offsets, inp.text, others)
    np.testing.assert_allclose(get_measure("js-support")(flip), [0.35, 0.35, 0.35, 0.35], atol=1e-7)
    # with a space between tokens 1 and 2 ("a b c d") only token 1 takes the lead: no word joins them, token 3 carries
    apart = MeasureInput(d, lp_without, lp_all, [(0, 1), (2, 3), (4, 5), (6, 7)], "a b c d", others)
    np.testing.assert_allclose(get_measure("js-support")(apart), [0.0, 0.35, 0.35, 0.35], atol=1e-7)
    # a response where v_k raised no token: every score 0, so ρ is uniform (1)
    np.testing.assert_allclose(measure_relevance("js-support", MeasureInput(d, lp_all, lp_all, inp.offsets,
                                                                            inp.text, others)), np.ones(4))


def test_reworded_contrast_hand_worked():
    d = np.array([0.3, 0.1, 0.5], np.float32)
    reworded = np.array([[0.1, 0.2, 0.1], [0.3, 0.0, 0.1]], np.float32)  # mean (0.2, 0.1, 0.1)
    np.testing.assert_allclose(reworded_contrast(d, reworded), [0.1, 0.0, 0.4], atol=1e-7)
    with pytest.raises(MrtpoError, match="needs a replay with v_k reworded"):
        reworded_contrast(d, None)
    # the measure: (0.1, 0, 0.4) → lead (0.1, 0.4, 0.4) → word max ("a b c": one token a word) → carry (nothing sure)
    inp = MeasureInput(d, np.log([0.1, 0.1, 0.1]), np.zeros(3), [(0, 1), (2, 3), (4, 5)], "a b c",
                       js_reworded=reworded)
    np.testing.assert_allclose(get_measure("js-reworded")(inp), [0.1, 0.4, 0.4], atol=1e-7)
    assert needs_rewording("js-reworded") and not any(needs_rewording(m) for m in MEASURES if m != "js-reworded")


def test_lead_hand_worked():
    # v_t = max(x_t, x_{t+1}); the last token keeps its own
    np.testing.assert_allclose(lead(np.array([0.1, 0.4, 0.0, 0.2, 0.3])), [0.4, 0.4, 0.2, 0.3, 0.3], atol=1e-7)
    np.testing.assert_allclose(lead(np.array([0.7])), [0.7])
    assert lead(np.zeros(0)).shape == (0,)


def test_js_measure_is_the_paper_relevance(tiny):
    res = replay_group(tiny, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="model"))
    for r in res.responses:
        assert r.measure == "js"
        for k in INFO:  # exactly the old computation: ρ = normalize(d)
            assert np.array_equal(r.relevance[k], normalize_relevance(torch.from_numpy(r.js[k])).numpy())


def test_sampled_token_logprobs_match_full_logsoftmax(tiny):
    """logp_all / logp_without are log π(y_t | prompt, y<t) of the response tokens, as a plain forward pass of the
    whole sequence gives them."""
    res = naive_replay_group(tiny, PROMPT, INFO, RESPONSES)
    fast = replay_group(tiny, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="model", logits_budget=500))
    for i, (r, f) in enumerate(zip(res.responses, fast.responses)):
        for variant in [ALL, *INFO]:
            p = tiny.encode(res.prompts[i][variant])
            ids = torch.tensor([p + r.token_ids])
            with torch.no_grad():
                lp = torch.log_softmax(tiny.model(input_ids=ids).logits[0].float(), -1)
            ref = lp[len(p) - 1: len(p) - 1 + len(r.token_ids)].gather(1, torch.tensor(r.token_ids)[:, None])[:, 0]
            got = r.logp_all if variant == ALL else r.logp_without[variant]
            np.testing.assert_allclose(got, ref.numpy(), atol=1e-4)
            np.testing.assert_allclose(f.logp_all if variant == ALL else f.logp_without[variant], ref.numpy(),
                                       atol=1e-4)
        np.testing.assert_allclose(r.with_measure("logratio").relevance["format"],
                                   measure_relevance("logratio", r.measure_input("format")))


def test_replay_measure_equals_stored_replay_with_measure(tiny):
    base = replay_group(tiny, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="model"))
    reworded = replay_group(tiny, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="model"), reword=True)
    looked = replay_group(tiny, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="model"), attention=True)
    for name in [m for m in MEASURES if needs_replay(m)]:  # the oracle reads evidence, not a replay
        direct = replay_group(tiny, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision="model"), measure=name)
        # a replay with the same prompts, batched the same
        src = reworded if needs_rewording(name) else looked if needs_attention(name) else base
        again = src.with_measure(name)
        assert direct.measure == again.measure == name
        for a, b, r in zip(direct.responses, again.responses, src.responses):
            for k in INFO:
                np.testing.assert_allclose(a.relevance[k], b.relevance[k], atol=1e-6)
                assert np.array_equal(a.js[k], r.js[k])  # js stays the raw d whatever the measure
                assert a.relevance[k].mean() == pytest.approx(1.0, abs=1e-5)
    assert base.with_measure("js") is base
    with pytest.raises(MrtpoError, match="'js-reworded' measure needs a replay with v_k reworded"):
        base.with_measure("js-reworded")
    inp = base.responses[0].measure_input("format")  # what js-contrast contrasts with: the other replayed rewards
    np.testing.assert_array_equal(inp.js_others, [base.responses[0].js["correct"]])
    with pytest.raises(MrtpoError, match="unknown relevance measure"):
        replay_group(tiny, PROMPT, INFO, RESPONSES, measure="bogus")
    with pytest.raises(MrtpoError, match="the 'evidence' measure reads each checker's evidence, not a replay"):
        replay_group(tiny, PROMPT, INFO, RESPONSES, measure="evidence")
    with pytest.raises(MrtpoError, match="needs what each checker read"):  # a replay of texts has no checkers
        base.with_measure("evidence")


def test_quotes_move_relevance_onto_what_the_checker_read(smol):
    """On the real default model: with v_k quoting what each checker read, js-support's relevance finds the evidence
    (mean token AUROC 0.84 over these 9 pairs when written); with the rules alone it barely does (0.64)."""
    from mrtpo.core.faith_metrics import pair_metrics
    from mrtpo.groups import template_for
    from mrtpo.tasks import get_family

    fam = get_family("sql")
    ex = fam.example("library-03")
    replies = ["```sql\nSELECT name FROM authors WHERE country = 'UK'\n```\nThis query selects the UK's authors.",
               "```sql\nSELECT title, year FROM books ORDER BY year\n```",
               "Here is the query:\n```sql\nSELECT a.name FROM authors a JOIN books b ON b.author_id = a.id\n```"]
    aurocs = {}
    for mode, regime in (("quotes", "quoted"), ("rules", "findings")):
        infos = [fam.verifier_info(ex, r, info=regime) for r in replies]
        assert all(("The checker read: " in t) == (mode == "quotes") for i in infos for t in i.values())
        rep = replay_group(smol, fam.replay_prompt(ex), infos, replies, template_for(fam)).with_measure("js-support")
        aurocs[mode] = [pair_metrics(rr.relevance[k], rr.offsets, fam.score(ex, r)[k].evidence, r).auroc
                        for r, rr in zip(replies, rep.responses) for k in rr.relevance]
    assert len(aurocs["quotes"]) == 9 and not np.isnan(aurocs["quotes"]).any()
    assert np.mean(aurocs["quotes"]) > 0.75
    assert np.mean(aurocs["quotes"]) > np.mean(aurocs["rules"]) + 0.1


# ---------------------------------------------------------------------------------------------- the oracle
def test_evidence_measure_by_hand():
    """The oracle: 1 on every token overlapping a span (a token partly inside counts; the whitespace token right
    before an evidence token counts: the tokenizer's ' 10' split), 0 elsewhere, normalized to mean 1; uniform for
    None (the whole response) and [] (nothing specific); refused where no checker says what it read."""
    from mrtpo.core.measures import NO_EVIDENCE, evidence_scores, oracle_relevance

    text = "pay 10 euros, now"
    offsets = [(0, 3), (3, 4), (4, 5), (5, 6), (6, 12), (12, 13), (13, 17)]  # pay|' '|1|0|' euros'|,|' now'
    np.testing.assert_array_equal(evidence_scores(offsets, text, [(4, 6)]), [0, 1, 1, 1, 0, 0, 0])  # ' ' before '1'
    np.testing.assert_array_equal(evidence_scores(offsets, text, [(8, 9), (12, 13)]), [0, 0, 0, 0, 1, 1, 0])
    np.testing.assert_allclose(oracle_relevance(offsets, text, [(12, 13)]), [0, 0, 0, 0, 0, 7, 0])  # T · 1 / 1
    np.testing.assert_allclose(oracle_relevance(offsets, text, [(0, 3), (13, 17)]), [3.5, 0, 0, 0, 0, 0, 3.5])
    for spans in (None, []):
        np.testing.assert_array_equal(oracle_relevance(offsets, text, spans), np.ones(7))
    with pytest.raises(MrtpoError, match="needs what each checker read"):
        evidence_scores(offsets, text, NO_EVIDENCE)
    inp = MeasureInput(np.zeros(7), np.zeros(7), np.zeros(7), offsets, text, evidence=[(4, 6)])
    np.testing.assert_allclose(measure_relevance("evidence", inp), [0, 7 / 3, 7 / 3, 7 / 3, 0, 0, 0], rtol=1e-6)


def test_evidence_measure_on_a_real_tokenization(smol):
    """On the default model's tokens of a reply: the oracle's ρ is T / n on the n tokens the checker's evidence
    touches (token AUROC 1 against that evidence), and the group's token view under it equals that."""
    from mrtpo.core.faith_metrics import pair_metrics, token_labels
    from mrtpo.core.measures import oracle_relevance
    from mrtpo.model import tokenize_response
    from mrtpo.tasks import get_family

    fam = get_family("instructions")
    ex = fam.example("tea-note")
    reply = "Tea, green tea, and a cup."
    ids, offsets = tokenize_response(smol, reply)
    ev = fam.score(ex, reply)["punctuation:no_comma"].evidence
    assert ev == [(3, 4), (14, 15)]  # the two commas
    rho = oracle_relevance(offsets, reply, ev)
    lab = token_labels(offsets, ev, reply)
    assert lab.sum() == 2 and np.allclose(rho[lab], len(ids) / 2) and np.allclose(rho[~lab], 0)
    assert pair_metrics(rho, offsets, ev, reply).auroc == 1.0


def test_attn_contrast_hand_worked():
    # a_k − mean of the others' a_j, at least 0, then word max: "ab c" = tokens a|b (one word), c
    a = np.array([0.30, 0.10, 0.05], np.float32)
    others = np.array([[0.10, 0.20, 0.10], [0.10, 0.00, 0.00]], np.float32)  # mean (0.10, 0.10, 0.05)
    inp = MeasureInput(np.zeros(3), np.zeros(3), np.zeros(3), [(0, 1), (1, 2), (3, 4)], "ab c", attn=a,
                       attn_others=others)
    np.testing.assert_allclose(get_measure("attn-contrast")(inp), [0.2, 0.2, 0.0], atol=1e-7)
    alone = MeasureInput(np.zeros(3), np.zeros(3), np.zeros(3), [(0, 1), (1, 2), (3, 4)], "ab c", attn=a,
                         attn_others=np.zeros((0, 3), np.float32))  # no other reward: a itself
    np.testing.assert_allclose(get_measure("attn-contrast")(alone), [0.3, 0.3, 0.05], atol=1e-7)
    with pytest.raises(MrtpoError, match="did not read it"):
        get_measure("attn-contrast")(MeasureInput(np.zeros(3), np.zeros(3), np.zeros(3), inp.offsets, "ab c"))
    assert needs_attention("attn-contrast")
    assert not any(needs_attention(m) for m in MEASURES if m != "attn-contrast")
