"""Cost of showing a long group: a synthetic group of G responses × T tokens × K rewards (no
model: random ρ and advantages over real-looking text, multi-byte characters split over several tokens), then

- the HTML export (``page_html``, what ``mrtpo explain --html`` and the app's "Download HTML page" write;
  ``mrtpo rollouts --html`` writes the same sections): its size and the seconds to build it;
- the app's views: the group's overview (every response × reward: strip and hottest spans) and one response × one
  reward in full, their sizes and the seconds to build them; β re-coloring (a new token view, overview and full
  view);
- optionally (``--app``) Explore through AppTest (in-process, no browser): the first run with the group in the
  session, a β change, a response change;
- pages of many medium responses (unless ``--no-pages``): ``explain --input`` of 64 responses × 290 tokens × 3
  rewards and ``rollouts --html`` of 4 groups × 64 × 280 tokens × 3 rewards (each response under the long threshold,
  so each alone would be drawn in full), their sizes against the page budget and what they draw.

    python bench/views.py [--G 8] [--T 2000] [--K 3] [--app] [--no-pages]

Prints the figures measured in this one run (targets for 8 × 2,000 × 3: export ≤ 5 MB; overview and full view
≤ 3 s; β re-colors ≤ 1 s; every page ≤ 10 MB). Times depend on what else runs on the machine: say so when you quote
them.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as bench/views.py
    sys.path.insert(0, str(ROOT))

WORDS = ("the of and to in is that for it as with was on by be this are from at or an which have not but they "
         "one all their has were more when can there we so if what about into than them some would could only "
         "other these two may first then do any like my now over such our man me even most made after also did "
         "many before must through back years where much your way well down should because each just those "
         "people how too little state good very make world still own see men work long get here between both "
         "life being under never day same another know while last might us great old year off come since against "
         "go came right used take three query table select count where group order join value result answer "
         "therefore consider suppose compute check verify function return").split()
SPLIT = ("é", "日本", "👋", "ü", "—")  # characters whose UTF-8 bytes a byte-level BPE spreads over several tokens


def synthetic_text(T: int, rng: np.random.Generator) -> tuple[str, list[tuple[int, int]], list[int]]:
    """(text, token spans in the form of :mod:`mrtpo.core.spans`, token ids) of about ``T`` tokens of English-like
    prose: words cut into pieces of 1–6 characters (a space joins the word's first piece), punctuation, line
    breaks, and now and then a multi-byte character spread over one token per UTF-8 byte (the first bytes' spans
    empty: the last byte's token owns the character)."""
    text, spans = [], []
    pos = 0
    n_words = 0
    while len(spans) < T:
        if rng.random() < 0.015:
            ch = SPLIT[int(rng.integers(len(SPLIT)))]
            for c in ch:  # each character: one token per UTF-8 byte
                n = len(c.encode())
                spans += [(pos, pos)] * (n - 1) + [(pos, pos + 1)]
                text.append(c)
                pos += 1
            continue
        w = WORDS[int(rng.integers(len(WORDS)))]
        w = (" " if n_words and text and not text[-1].endswith("\n") else "") + w
        n_words += 1
        while w:
            cut = int(rng.integers(1, 7))
            piece, w = w[:cut], w[cut:]
            spans.append((pos, pos + len(piece)))
            text.append(piece)
            pos += len(piece)
        r = rng.random()
        if r < 0.08:
            p = "." if r < 0.05 else ","
            spans.append((pos, pos + 1))
            text.append(p)
            pos += 1
            if r < 0.012:
                spans.append((pos, pos + 2))
                text.append("\n\n")
                pos += 2
    while spans[T - 1][0] == spans[T - 1][1]:  # end on a complete character
        T -= 1
    spans, text = spans[:T], "".join(text)[: spans[T - 1][1]]
    return text, spans, list(range(len(spans)))


def synthetic_relevance(T: int, rng: np.random.Generator, bursts: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """(JS distances d (T,), relevance ρ = T d / Σd (T,), mean 1): log-normal noise with a few bursts where d is
    3–15 times larger (what a checker's reward usually looks like: a few places decide it)."""
    d = rng.lognormal(-5.0, 0.8, T)
    for _ in range(bursts):
        s, w = int(rng.integers(0, max(1, T - 20))), int(rng.integers(3, 20))
        d[s:s + w] *= rng.uniform(3, 15)
    return d, T * d / d.sum()


def synthetic_group(G: int = 8, T: int = 2000, K: int = 3, seed: int = 0, constant: bool = False):
    """(ScoredGroup, ReplayResult) of ``G`` responses of ``T`` tokens and ``K`` rewards, without a model: rewards
    0/1 that vary in the group (``constant``: but the last, so that one reward is "not replayed"), reasons,
    evidence spans for the first reward, and synthetic JS / ρ (:func:`synthetic_relevance`)."""
    from mrtpo.groups import ScoredGroup
    from mrtpo.model import Sample
    from mrtpo.replay.results import ReplayResult, ResponseRelevance
    from mrtpo.tasks.base import Example

    rng = np.random.default_rng(seed)
    names = [f"reward_{k}" for k in range(K)]
    R = (rng.random((G, K)) < 0.5).astype(float)
    R[0, :], R[1, :] = 1.0, 0.0  # every reward varies ...
    if constant:
        R[:, -1] = 1.0  # ... but the last: constant in the group, not replayed
    replayed, skipped = (names[:-1], names[-1:]) if constant else (names, [])
    samples, responses, evidence = [], [], []
    for _ in range(G):
        text, spans, ids = synthetic_text(T, rng)
        js, rel = {}, {}
        for k in replayed:
            js[k], rel[k] = synthetic_relevance(len(ids), rng)
        samples.append(Sample(ids, text))
        responses.append(ResponseRelevance(text, ids, spans, js, rel, skipped=list(skipped)))
        starts = sorted(rng.integers(0, max(1, len(text) - 40), 3).tolist())
        evidence.append({names[0]: [(int(s), int(s) + 30) for s in starts], **{k: None for k in names[1:]}})
    infos = [{k: f"Check {k} of the reply." for k in names} for _ in range(G)]
    reasons = [{k: ("ok" if R[i, j] else "failed") for j, k in enumerate(names)} for i in range(G)]
    group = ScoredGroup(Example("long-synthetic", "Write a long answer."), "Write a long answer.", samples, names, R,
                        reasons, infos, evidence)
    prompts = [{"__all__": "", **{k: "" for k in replayed}} for _ in range(G)]
    return group, ReplayResult(responses, prompts, list(replayed), list(skipped))


def timed(fn, *args, **kwargs):
    """(result, seconds) of one call."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def measure(G: int, T: int, K: int) -> dict:
    """The figures of the module docstring, without the app (name → value)."""
    from mrtpo.display import overview as O
    from mrtpo.display import token_view
    from mrtpo.display.page import page_html

    group, replay = synthetic_group(G, T, K)
    out: dict = {"group": f"{G} × {T} tokens × {K} rewards"}
    view, s = timed(token_view, group, replay, "mrtpo", 0.5)
    out["token view (s)"] = s
    page, s = timed(page_html, view, group)
    out["export size (MB)"], out["export build (s)"] = len(page.encode()) / 1e6, s
    body, s = timed(O.group_overview_html, view)
    out["overview size (MB)"], out["overview build (s)"] = len(body.encode()) / 1e6, s
    k = view.reward_names[0]
    full, s = timed(O.full_html, view, 0, k, group=group)
    out["full view size (MB)"], out["full view build (s)"] = len(full.encode()) / 1e6, s
    t0 = time.perf_counter()
    v2 = token_view(group, replay, "mrtpo", 0.9)
    O.group_overview_html(v2)
    O.full_html(v2, 0, k, group=group)
    out["β re-color: view + overview + full (s)"] = time.perf_counter() - t0
    return out


def measure_pages() -> dict:
    """The two pages of many medium responses (module docstring): size (MB), seconds to lay out, what they draw."""
    from mrtpo.display import page as P
    from mrtpo.display import token_view
    from mrtpo.integrations import rollout_explain as rx
    from mrtpo.integrations.rollouts import RolloutGroup, RolloutRow

    out: dict = {}
    group, replay = synthetic_group(64, 290, 3)
    view = token_view(group, replay, "mrtpo", 0.5)
    lay, s = timed(P.page_layout, view, group)
    out["page: explain 64 × 290 × 3 (MB)"], out["page: explain, layout (s)"] = len(lay.html.encode()) / 1e6, s
    out["page: explain draws"] = lay.summary() if not lay.complete else "every response as without a budget"
    items = []
    for n in range(4):
        group, replay = synthetic_group(64, 280, 3, seed=n)
        rows = [RolloutRow("r.jsonl", 64 * n + i + 1, 1, group.prompt, x.text, {}, {}) for i, x in
                enumerate(group.samples)]
        items.append(rx.ExplainedGroup(RolloutGroup(1, group.prompt, rows), group,
                                       token_view(group, replay, "mrtpo", 0.5)))
    lay, s = timed(rx.page_layout, items)
    out["page: rollouts 4 × 64 × 280 × 3 (MB)"], out["page: rollouts, layout (s)"] = len(lay.html.encode()) / 1e6, s
    out["page: rollouts draws"] = lay.summary() if not lay.complete else "every response as without a budget"
    return out


def measure_app(G: int, T: int, K: int) -> dict:
    """Explore under AppTest with the synthetic group in the session (in-process, no browser: Python's share of
    the time; the browser's drawing is not in it)."""
    from streamlit.testing.v1 import AppTest

    from tests.app.long_group import explore_with  # the synthetic group as a session's current group

    out: dict = {}
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    t0 = time.perf_counter()
    explore_with(at, synthetic_group(G, T, K))
    out["app: first run with the group (s)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    at.slider(key="explore_beta").set_value(0.9).run()
    out["app: β change (s)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    at.selectbox(key=[w.key for w in at.selectbox if w.key.startswith("explore_response_")][0]).set_value(3).run()
    out["app: another response in full (s)"] = time.perf_counter() - t0
    body = "".join(h.proto.body for h in at.get("html"))
    out["app: HTML sent (MB)"] = len(body.encode()) / 1e6
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--T", type=int, default=2000)
    p.add_argument("--K", type=int, default=3)
    p.add_argument("--app", action="store_true", help="also time Explore through AppTest")
    p.add_argument("--no-pages", action="store_true", help="leave out the pages of many medium responses")
    p.add_argument("--no-doc", action="store_true", help="print only (do not write docs/benchmarks.md)")
    a = p.parse_args(argv)
    from bench import report

    print(report.machine())
    figures = measure(a.G, a.T, a.K)
    if a.app:
        figures.update(measure_app(a.G, a.T, a.K))
    if not a.no_pages:
        figures.update(measure_pages())
    for name, v in figures.items():
        print(f"{name:45s} {v:.3f}" if isinstance(v, float) else f"{name:45s} {v}")
    if not a.no_doc:
        rows = [(name, f"{v:.3f}" if isinstance(v, float) else v) for name, v in figures.items()]
        text = (f"G = {a.G} responses × T = {a.T:,} tokens × K = {a.K} rewards (synthetic, no model)"
                f"{'; Explore through AppTest' if a.app else ''}"
                f"{'' if a.no_pages else '; pages of many medium responses (synthetic)'}. Targets: export ≤ 5 MB; "
                f"overview and full view ≤ 3 s; β re-colors ≤ 1 s{'' if a.no_pages else '; every page ≤ 10 MB'}."
                "\n\n" + report.table(("figure", "value"), rows))
        path = report.update_section("views", report.section("bench/views.py", text))
        print(f"written to {path} (section views)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
