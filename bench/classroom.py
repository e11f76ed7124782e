"""A class on one server: N students open one `mrtpo app` in their own browser context and press "Sample group" at
the same moment, each with its own seed (so nothing is served from another's cache). How long does each wait for
their first heatmap?

    python bench/classroom.py [--users 10,30] [--model default] [--family sql] [--no-doc]

The app queues the model's work (mrtpo_app/work.py: one group at a time, first come first served, each waiting page
told how many groups are ahead), so the k-th student waits about k groups' time; the first student's wait is what
one user alone gets. Printed per class size: the time one group takes alone (measured first, on the same warm
server), then each student's click → heatmap wait: the fastest, the median, the slowest, and the slowest divided by
(N × one group alone): about 1.0 means the queue adds nothing to the work itself. Needs Debian's chromium and
Playwright for Python (``make test-setup``). A student's page that asks a question ("This will take about …
Continue?") or shows an error ends the run with a message naming it. The figures also go to docs/benchmarks.md,
section ``class``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

try:  # with the repository on the path (PYTHONPATH=$PWD), or run as bench/classroom.py
    from bench import report
    from bench.app import CHROMIUM, CHROMIUM_ARGS, IDLE, free_port, page_problem, start_server, wait_health
except ImportError:
    import report

    from app import CHROMIUM, CHROMIUM_ARGS, IDLE, free_port, page_problem, start_server, wait_health

HEAT = ".mrtpo .legend"  # on screen once a group's heatmap is drawn


def open_student(browser, url: str, family: str, seed: int):
    """A fresh browser context (its own Streamlit session) on Explore, its Seed box set to ``seed``."""
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.goto(f"{url}/?family={family}", wait_until="domcontentloaded")
    page.wait_for_selector(IDLE, timeout=300_000)
    box = page.get_by_role("spinbutton", name="Seed")  # (the box; its help is a button)
    box.fill(str(seed))
    box.press("Enter")
    page.wait_for_timeout(300)
    page.wait_for_selector(IDLE, timeout=300_000)
    return page


def waits(browser, url: str, family: str, seeds: list[int], timeout_s: float) -> list[float]:
    """Open one student per seed, click all their "Sample group" buttons at once, and return each student's seconds
    from the clicks to their heatmap on screen (polled every 0.2 s, in click order)."""
    pages = [open_student(browser, url, family, s) for s in seeds]
    t0 = time.perf_counter()
    for page in pages:
        page.get_by_role("button", name="Sample group").click(no_wait_after=True)
    done: dict[int, float] = {}
    while len(done) < len(pages):
        if time.perf_counter() - t0 > timeout_s:
            left = len(pages) - len(done)
            raise SystemExit(f"{left} of {len(pages)} students had no heatmap after {timeout_s:.0f} s")
        for i, page in enumerate(pages):
            if i not in done and page.locator(HEAT).count():
                done[i] = time.perf_counter() - t0
            elif i not in done and (problem := page_problem(page)) is not None:
                raise SystemExit(f"student {i + 1} of {len(pages)} (seed {seeds[i]}): {problem}")
        time.sleep(0.2)
    for page in pages:
        page.context.close()
    return [done[i] for i in range(len(pages))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", default="10,30", help="class sizes, comma-separated (each a fresh set of students)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--family", default="sql")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a class may take before the run fails")
    report.add_doc_flag(ap)
    a = ap.parse_args()
    sizes = [int(x) for x in a.users.split(",") if x.strip()]
    if not sizes or min(sizes) < 1:
        ap.error("--users: class sizes >= 1, e.g. 10,30")
    import torch
    from playwright.sync_api import sync_playwright

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(a.model, port)
    rows = []
    try:
        wait_health(url, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            waits(browser, url, a.family, [10_000], a.timeout)  # warm: the model loaded, the first group's costs paid
            one = waits(browser, url, a.family, [10_001], a.timeout)[0]
            print(f"model={a.model} family={a.family} G=4 max_new_tokens=96 (the app's defaults); "
                  f"{report.machine(torch.get_num_threads())}")
            print(f"one group alone (warm server)  {one:6.1f} s")
            seed = 20_000
            for n in sizes:
                w = waits(browser, url, a.family, list(range(seed, seed + n)), a.timeout)
                seed += n
                row = dict(n=n, fastest=min(w), median=statistics.median(w), slowest=max(w),
                           ratio=max(w) / (n * one))
                rows.append(row)
                print(f"{n:3d} students at once: fastest {row['fastest']:6.1f} s · median {row['median']:6.1f} s · "
                      f"slowest {row['slowest']:6.1f} s · slowest / ({n} × one alone) {row['ratio']:.2f}")
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001 (a server that does not stop is killed)
            proc.kill()
    if not a.no_doc:
        text = (f"Model {a.model}, family {a.family}, G = 4, 96 new tokens (the app's defaults); one server, each "
                f"student a fresh browser context with its own seed, all clicking at once. One group alone on the warm "
                f"server: {one:.1f} s.\n\n" + report.table(
                    ["students", "fastest wait", "median wait", "slowest wait", "slowest / (N × alone)"],
                    [[r["n"], f"{r['fastest']:.1f} s", f"{r['median']:.1f} s", f"{r['slowest']:.1f} s",
                      f"{r['ratio']:.2f}"] for r in rows]))
        path = report.update_section("class", report.section("bench/classroom.py", text))
        print(f"written to {path} (section class)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
