"""A class on one server, in a real headless Chromium: three students on one `mrtpo app` (tiny model) press "Sample
group" at once, with seeds 2, 3 and 4; each gets the group its seed gives a user alone (the fingerprint of its
responses' tokens), and a fourth who asks for seed 2 afterwards gets that same group from the
cache.

Issue 26: the sampler drew from torch's process-wide generator, so simultaneous users got each other's draws and the
wrong group was cached for everyone."""
from __future__ import annotations

import re

import pytest

from mrtpo.groups import score_group
from mrtpo.model import GROUP_SIZE, MAX_NEW_TOKENS, load_model, sample
from mrtpo.tasks import get_family
from tests.e2e.test_e2e_browser import CHROMIUM, CHROMIUM_ARGS, IDLE, running_app

pytestmark = pytest.mark.skipif(not __import__("pathlib").Path(CHROMIUM).exists(),
                                reason="Debian chromium is not installed")

FAMILY, EXAMPLE, SEEDS = "instructions", "tea-note", (2, 3, 4)
FINGERPRINT = re.compile(r"fingerprint ([0-9a-f]{8})")


def alone(seed: int) -> str:
    """The fingerprint (:attr:`mrtpo.groups.ScoredGroup.fingerprint`: its responses' tokens) of the group one user
    alone gets for ``seed`` (the app's defaults: G, 96 tokens, temperature 1), computed by the library here."""
    fam = get_family(FAMILY)
    ex = fam.example(EXAMPLE)
    samples = sample(load_model("tiny-random", "cpu"), ex.prompt, n=GROUP_SIZE, max_new_tokens=MAX_NEW_TOKENS,
                     temperature=1.0, seed=seed)
    return score_group(fam, ex, samples).fingerprint


def _set_seed(page, seed: int) -> None:
    box = page.get_by_role("spinbutton", name="Seed")  # (the box; its help is a button)
    box.fill(str(seed))
    box.press("Enter")
    page.wait_for_timeout(300)
    page.wait_for_selector(IDLE, timeout=60_000)


def _shown(page) -> str:
    page.wait_for_selector(".mrtpo .legend", state="visible", timeout=180_000)
    page.wait_for_selector(IDLE, timeout=120_000)
    head = page.get_by_text(FINGERPRINT).first.inner_text()
    return FINGERPRINT.search(head).group(1)


def test_three_students_sampling_at_once_each_get_their_seeds_group():
    want = {s: alone(s) for s in SEEDS}
    assert len(set(want.values())) == len(SEEDS)  # three different groups: the test can tell them apart
    sync_api = pytest.importorskip("playwright.sync_api")
    with running_app() as (url, _), sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            pages = {}
            for s in SEEDS:  # one browser context per student: separate cookies, separate Streamlit sessions
                page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
                page.goto(f"{url}/?family={FAMILY}&example={EXAMPLE}", wait_until="domcontentloaded")
                page.wait_for_selector(IDLE, timeout=60_000)
                _set_seed(page, s)
                pages[s] = page
            for s in SEEDS:  # the three clicks within a fraction of a second
                pages[s].get_by_role("button", name="Sample group").click(no_wait_after=True)
            got = {s: _shown(pages[s]) for s in SEEDS}
            assert got == want
            for s in SEEDS:
                assert pages[s].locator("[data-testid='stException']").count() == 0
            later = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            later.goto(f"{url}/?family={FAMILY}&example={EXAMPLE}", wait_until="domcontentloaded")
            later.wait_for_selector(IDLE, timeout=60_000)
            _set_seed(later, SEEDS[0])
            later.get_by_role("button", name="Sample group").click()
            assert _shown(later) == want[SEEDS[0]]
            assert later.get_by_text("Group ready (cached)").count() >= 1
        finally:
            browser.close()
