"""bench/app.py's wait for the page (also bench/classroom.py's): a question the benchmark does not answer ("This will
take about … Continue?") or an error box ends the run with a message, and so does its timeout; tested on a stand-in
for Playwright's page (no browser)."""
import pytest

from bench import app

ASKED = "This will take about 3 min 30 s (at most 2,916 forward tokens at 14 tokens/s on this machine). Continue?"


class Found:
    def __init__(self, texts: list[str]):
        self.texts = texts

    def count(self) -> int:
        return len(self.texts)

    def nth(self, i: int) -> "Found":
        return Found(self.texts[i:i + 1])

    @property
    def first(self) -> "Found":
        return self.nth(0)

    def inner_text(self) -> str:
        return self.texts[0]


class Page:
    """What a page shows, by selector; ``later``: {selector: texts} shown after ``after`` polls."""

    def __init__(self, shown: dict[str, list[str]], later: dict[str, list[str]] | None = None, after: int = 2):
        self.shown, self.later, self.after, self.polls = dict(shown), later or {}, after, 0

    def locator(self, selector: str) -> Found:
        return Found(self.shown.get(selector, []))

    def wait_for_timeout(self, ms: float) -> None:
        self.polls += 1
        if self.polls == self.after:
            self.shown.update(self.later)


def test_the_wait_ends_when_the_heatmap_is_drawn():
    page = Page({app.QUESTION: ["The rewards are constant in this group."]}, later={".mrtpo .tok": ["a"]})
    app.wait_for(page, ".mrtpo .tok", 60, "the heatmap")  # a warning that is no question does not stop it
    assert page.polls == 2


def test_an_unexpected_question_ends_the_run_with_a_message():
    page = Page({}, later={app.QUESTION: [ASKED]})
    with pytest.raises(SystemExit) as e:
        app.wait_for(page, ".mrtpo .tok", 600, "warm session: its heatmap")
    assert str(e.value).startswith("warm session: its heatmap: the app asked a question this benchmark does not "
                                   f"answer: {ASKED!r}") and "MRTPO_ASK_ABOVE_S" in str(e.value)
    assert page.polls == 2  # at once, not after the timeout


def test_an_error_box_and_the_timeout_end_the_run_with_a_message():
    with pytest.raises(SystemExit, match=r"^the heatmap: the app showed an error: 'sampling: out of memory'$"):
        app.wait_for(Page({app.ERROR: ["sampling:\nout of memory"]}), ".mrtpo .tok", 600, "the heatmap")
    with pytest.raises(SystemExit, match=r"^the heatmap: not on the page after 0 s$"):
        app.wait_for(Page({}), ".mrtpo .tok", 0.05, "the heatmap")
    assert app.page_problem(Page({".mrtpo .tok": ["a"]})) is None


def test_the_clicks_floor_is_the_groups_sampling_and_replay_floors(monkeypatch):
    import numpy as np
    import torch

    from bench import floor
    from mrtpo.core.info import INFO
    from mrtpo.groups import score_group, template_for
    from mrtpo.model import compute_dtype, load_model, sample
    from mrtpo.replay import replay_groups
    from mrtpo.tasks import get_family

    monkeypatch.setattr(floor, "read_bandwidth", lambda: 1e9)
    monkeypatch.setattr(floor, "gemm_peak", lambda dtype: 1e10)
    got = app.click_floor("tiny-random", "sql")
    lm, fam = load_model("tiny-random"), get_family("sql")
    ex = fam.examples()[0]
    samples = sample(lm, ex.prompt, n=4, max_new_tokens=96, seed=0)  # the same group (same seed and settings)
    group = score_group(fam, ex, samples, INFO)
    ran = replay_groups(lm, [group], template_for(fam))[0]
    assert got["forward_tokens"] == ran.forward_tokens > 0  # the replay's own count, known before any pass
    steps = max(len(x.token_ids) for x in samples)
    item = torch.empty((), dtype=compute_dtype(lm, "auto")).element_size()
    P = len(lm.encode(lm.chat_prompt(ex.prompt)))
    assert got["steps"] == steps and got["sample"] == floor.sampling_floor_s(lm, item, P, 4, steps, 1e9, 1e10)
    T = sum(len(x.token_ids) for x in samples)
    heads = 1 + len(ran.rewards)  # P_all and each replayed P_\k project the responses onto the vocabulary
    assert got["attention_pairs"] == ran.attention_pairs > 0  # likewise the pairs its passes' attention saw
    want = floor.model_replay_flops(lm, ran.forward_tokens, heads * T, ran.attention_pairs) / 1e10
    assert np.isclose(got["replay"], want, rtol=1e-12)
    assert want > floor.model_replay_flops(lm, ran.forward_tokens, heads * T) / 1e10  # the attention counted
    assert got["click"] == got["sample"] + got["replay"]


def test_targets_follow_the_cpu_kind(monkeypatch):
    """The issue's targets: 8 s cold / 4 s a new session where bf16 is fast (AMX, AVX512-BF16), 15 / 10 s on AVX2."""
    from mrtpo.model import decoder

    monkeypatch.setattr(decoder, "fast_bf16_cpu", lambda: True)
    assert app.targets() == (8.0, 4.0)
    monkeypatch.setattr(decoder, "fast_bf16_cpu", lambda: False)
    assert app.targets() == (15.0, 10.0)
