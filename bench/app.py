"""Speed of the app: from a cold start (a fresh ``mrtpo app``, model not loaded in the process) to the first
per-reward heatmap, in a real headless Chromium, default model on CPU, text-to-SQL, G = 4, 96 tokens.

    python bench/app.py [--model default] [--family sql] [--shots /tmp/shots] [--no-doc]

Prints the figures measured in this one run against their targets (with the model already converted in the cache;
with an empty cache the GGUF conversion adds about 12 s), then the warm figure: on the same server, a new browser
session samples another seed (no result cached; the model keeps the prompt's passes from the first session, as
it does for every student of a class on the same example: :class:`mrtpo.model.kvcache.PrefixStore`) — page load to
its heatmap. The targets, cold and warm, depend on
whether this CPU has fast bf16 (:func:`targets`).
With ``--shots`` it also saves screenshots of every page (Explore, Templates, Methods, Teach) to that folder.
A question the app asks before work it estimates long ("This will take about … Continue?"), or an error box, ends
the run with a message (:func:`wait_for`), never a wait without end. Needs Debian's chromium and Playwright for
Python (``make test-setup``). The figures also go to docs/benchmarks.md, section ``app`` (``--no-doc``: printed
only).
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as bench/app.py
    from bench import floor, report
except ImportError:
    import floor
    import report

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"
QUESTION = "[data-testid='stAlertContentWarning']"  # the app's "This will take about … Continue?" (ask_first)
ERROR = "[data-testid='stAlertContentError']"
TARGETS_S = {True: (8.0, 4.0), False: (15.0, 10.0)}  # (cold start, a new session), by whether bf16 is fast here


def targets() -> tuple[float, float]:
    """(cold start → first heatmap, a new session → its heatmap) targets in seconds for this CPU: the row of
    :data:`TARGETS_S` for whether bf16 is fast here (the app then samples and replays on bf16 copies) or not (it
    computes in float32)."""
    from mrtpo.model.decoder import fast_bf16_cpu

    return TARGETS_S[fast_bf16_cpu()]
CAPTION = re.compile(r"model ([\d.]+ s|cached) · sample")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int) -> subprocess.Popen:
    env = dict(os.environ, MRTPO_MODEL=model)
    return subprocess.Popen(
        [sys.executable, "-m", "mrtpo", "app", "--port", str(port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT)


def wait_health(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit("streamlit exited before it was healthy")
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("streamlit did not become healthy")


def page_problem(page) -> str | None:
    """Why ``page`` will not go on by itself: a question the benchmarks do not answer (the app asks "This will take
    about … Continue?" before work it estimates above ``$MRTPO_ASK_ABOVE_S``) or an error box; None when it shows
    neither."""
    asked = [t for t in (page.locator(QUESTION).nth(i).inner_text() for i in range(page.locator(QUESTION).count()))
             if "Continue?" in t]
    if asked:
        return (f"the app asked a question this benchmark does not answer: {' '.join(asked[0].split())!r} (the "
                "estimate comes from $MRTPO_CACHE/rates.json; MRTPO_ASK_ABOVE_S=100000 in the environment asks "
                "only above that many seconds)")
    if page.locator(ERROR).count():
        return f"the app showed an error: {' '.join(page.locator(ERROR).first.inner_text().split())!r}"
    return None


def wait_for(page, selector: str, timeout_s: float, what: str) -> None:
    """Wait until ``selector`` is on ``page`` (polled every 0.2 s); SystemExit naming ``what`` and the reason when the
    page shows a question or an error instead (:func:`page_problem`), or after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not page.locator(selector).count():
        problem = page_problem(page)
        if problem is not None:
            raise SystemExit(f"{what}: {problem}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not on the page after {timeout_s:.0f} s")
        page.wait_for_timeout(200)


def shoot(page, shots: Path, name: str) -> None:
    page.wait_for_selector(IDLE, timeout=120_000)
    page.wait_for_timeout(600)
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--family", default="sql", help="the sidebar's family (must be the default one: sql)")
    ap.add_argument("--shots", default=None, help="folder for screenshots of every page")
    report.add_doc_flag(ap)
    a = ap.parse_args()
    print(report.machine(), flush=True)
    from playwright.sync_api import sync_playwright

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = start_server(a.model, port)
    try:
        wait_health(url, proc)
        t_health = time.perf_counter()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(f"{url}/?family={a.family}", wait_until="domcontentloaded")
            page.wait_for_selector(IDLE, timeout=60_000)
            t_page = time.perf_counter()
            page.get_by_role("button", name="Sample group").click()
            wait_for(page, ".mrtpo .tok", 900, "cold start: the first heatmap")
            t_heat = time.perf_counter()
            page.wait_for_selector(IDLE, timeout=60_000)
            caption = page.get_by_text(CAPTION).first.inner_text()
            n_tok = page.locator(".mrtpo .tok").count()
            errors = page.locator("[data-testid='stAlertContentError']").count()
            if a.shots:
                shots = Path(a.shots)
                shots.mkdir(parents=True, exist_ok=True)
                shoot(page, shots, "explore")
                page.locator(".mrtpo").first.screenshot(path=str(shots / "explore_heatmap.png"))
                for title, name in (("Templates", "templates"), ("Methods", "methods"), ("Teach", "teach")):
                    page.get_by_role("link", name=title).first.click()
                    shoot(page, shots, name)
                    if name == "templates":
                        page.get_by_role("button", name="Re-run replay (same responses)").click()
                        shoot(page, shots, "templates_after")
            warm, warm_caption, warm_parts = warm_session(browser, f"{url}/?family={a.family}")
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    cold = t_heat - t0
    cold_target, warm_target = targets()
    print(f"model={a.model} family={a.family} G=4 max_new_tokens=96 device=auto")
    print(f"server healthy      {t_health - t0:6.2f} s")
    print(f"page ready          {t_page - t0:6.2f} s")
    print(f"click → heatmap     {t_heat - t_page:6.2f} s   (in-app: {caption})")
    print(f"cold start → first heatmap {cold:6.2f} s   target ≤ {cold_target:.0f} s   "
          f"ratio {cold / cold_target:.2f} of target")
    print(f"heatmap spans {n_tok}, error boxes {errors}")
    print(f"warm: new session → heatmap {warm:6.2f} s   target ≤ {warm_target:.0f} s   (in-app: {warm_caption})")
    print(f"   of which {warm_parts}")
    fl = click_floor(a.model, a.family)
    print(f"click → heatmap ÷ its floor = {(t_heat - t_page) / fl['click']:.2f}; new session ÷ that floor = "
          f"{warm / fl['click']:.2f}   (floor {fl['click']:.2f} s: sampling {fl['sample']:.2f} s — {fl['steps']} steps "
          f"at {fl['bandwidth'] / 1e9:.1f} GB/s —, replay {fl['replay']:.2f} s — {fl['forward_tokens']} tokens at "
          f"{fl['peak'] / 1e9:.0f} GFLOPS)")
    if not a.no_doc:
        f = dict(model=a.model, family=a.family, health=t_health - t0, page=t_page - t0, click=t_heat - t_page,
                 cold=cold, caption=caption, spans=n_tok, errors=errors, warm=warm, warm_caption=warm_caption,
                 floor=fl, targets=(cold_target, warm_target))
        path = report.update_section("app", report.section("bench/app.py", doc_text(f)))
        print(f"written to {path} (section app)")
    return 0 if cold <= cold_target and warm <= warm_target and errors == 0 else 1


def click_floor(model: str, family: str) -> dict[str, float]:
    """The least time from the click to the first heatmap on this machine: the app's first group (the family's first
    example, the default sampling settings, seed 0, G = 4 × 96) sampled at its floor (:func:`floor.sampling_floor_s`:
    as many decoding steps as its longest response, each reading the weights at this machine's bandwidth) and
    replayed at the GEMM peak (the replay's forward tokens as :func:`mrtpo.replay.estimate.estimate_scored` counts
    them, the responses under P_all and every replayed P_\\k onto the vocabulary, the attention over the pairs
    :func:`mrtpo.replay.estimate.replay_pairs` counts). Sampled here, after the browser
    run (the same seed and settings give the app's group). Page, import, load, scoring and drawing are not counted."""
    import numpy as np
    import torch

    from mrtpo.core.info import INFO
    from mrtpo.groups import score_group, template_for
    from mrtpo.model import compute_dtype, load_model, sample
    from mrtpo.replay import GroupInput
    from mrtpo.replay.estimate import estimate_scored, replay_pairs
    from mrtpo.tasks import get_family

    lm = load_model(model)
    lm.frozen = True  # as the app's: it samples with its compiled step, whose weight copies the floor reads
    fam = get_family(family)
    ex = fam.examples()[0]
    samples = sample(lm, ex.prompt, n=4, max_new_tokens=96, seed=0)
    group = score_group(fam, ex, samples, INFO)
    fwd = estimate_scored(lm, [group], template_for(fam)).parts.get("replay", 0)
    pairs = replay_pairs(lm, [GroupInput(group.prompt, group.verifier_info, group.samples, group.rewards)],
                         template_for(fam))  # (as estimate_scored replays it: constant rewards skipped)
    dtype = compute_dtype(lm, "auto")
    bw, peak = floor.read_bandwidth(), floor.gemm_peak(dtype)
    steps = max(len(x.token_ids) for x in samples)
    T = sum(len(x.token_ids) for x in samples)
    R = np.asarray(group.rewards, dtype=float)  # (G, K): the rewards that vary are replayed
    varied = int(np.sum(np.nan_to_num(np.nanmax(R, axis=0) - np.nanmin(R, axis=0)) > 0)) if R.size else 0
    sampling = floor.sampling_floor_s(lm, torch.empty((), dtype=dtype).element_size(),
                                      len(lm.encode(lm.chat_prompt(ex.prompt))), 4, steps, bw, peak,
                                      floor.sampling_weight_itemsize(lm))
    replay = floor.model_replay_flops(lm, fwd, (1 + varied) * T, pairs) / peak
    return {"sample": sampling, "replay": replay, "click": sampling + replay, "bandwidth": bw, "peak": peak,
            "steps": steps, "forward_tokens": fwd, "attention_pairs": pairs}


def warm_session(browser, url: str) -> tuple[float, str, str]:
    """A second student on the warm server: a new browser context opens the page, sets seed 1 (a group nobody
    sampled: no result comes from the app's caches; the model's kept prompt passes do) and samples; seconds from
    opening the page to its heatmap, the in-app
    timings, and the parts (page open, seed set, click → heatmap)."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 2400})
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(IDLE, timeout=60_000)
    t_open = time.perf_counter()
    seed = page.get_by_role("spinbutton", name="Seed")  # (the box; its help is a button)
    seed.fill("1")
    seed.press("Enter")
    page.wait_for_selector(IDLE, timeout=60_000)
    t_seed = time.perf_counter()
    page.get_by_role("button", name="Sample group").click()
    wait_for(page, ".mrtpo .tok", 900, "warm session: its heatmap")
    t_heat = time.perf_counter()
    page.wait_for_selector(IDLE, timeout=60_000)
    caption = page.get_by_text(CAPTION).first.inner_text()
    ctx.close()
    parts = f"page open {t_open - t0:.2f} s, seed set {t_seed - t_open:.2f} s, click → heatmap {t_heat - t_seed:.2f} s"
    return t_heat - t0, caption, parts


def doc_text(f: dict) -> str:
    """The figures printed above as markdown for docs/benchmarks.md (``f``: what :func:`main` measured)."""
    cold_target, warm_target = f["targets"]
    return (f"Model {f['model']}, family {f['family']}, G = 4, 96 new tokens, device auto; a fresh `mrtpo app` "
            "and headless Chromium.\n\n" + report.table(["", "time", "target"], [
                ["start → server healthy", f"{f['health']:.2f} s", ""],
                ["start → page ready", f"{f['page']:.2f} s", ""],
                ["click → first heatmap", f"{f['click']:.2f} s", ""],
                ["**cold start → first heatmap**",
                 f"**{f['cold']:.2f} s** ({f['cold'] / cold_target:.2f} of the target)", f"≤ {cold_target:.0f} s"],
                ["**warm: a new session → its heatmap** (seed 1: no result cached; the prompt's passes kept from "
                 "the first session)",
                 f"**{f['warm']:.2f} s** ({f['warm'] / warm_target:.2f} of the target)", f"≤ {warm_target:.0f} s"]]
                + ([["the click's floor: sampling at its memory floor + the replay at the GEMM peak",
                     f"{f['floor']['click']:.2f} s (sampling {f['floor']['sample']:.2f} + replay "
                     f"{f['floor']['replay']:.2f})", ""],
                    ["click → first heatmap ÷ that floor", f"{f['click'] / f['floor']['click']:.2f}",
                     "≤ 1.2 only where a target lies below the floor"],
                    ["a new session → its heatmap ÷ that floor", f"{f['warm'] / f['floor']['click']:.2f}", ""]]
                   if f.get("floor") else []))
            + f"\n\nIn the app: {f['caption']}; {f['spans']} heatmap spans, {f['errors']} error boxes. Warm session: "
              f"{f['warm_caption']}.")


if __name__ == "__main__":
    sys.exit(main())
