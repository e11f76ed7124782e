"""An experiment's outputs: ``summary.json`` (strict JSON), ``curves.png`` (matplotlib: seed-mean curves with
min–max bands) and ``report.html`` (self-contained: the PNG inlined, the tables, the definitions).
"""
from __future__ import annotations

import base64
import html
import io
import math
import time
from pathlib import Path

import numpy as np

from mrtpo.errors import MrtpoError
from mrtpo.jsonl import dumps, write_text
from mrtpo.wording import plural

SUMMARY_FILE, PNG_FILE, HTML_FILE = "summary.json", "curves.png", "report.html"


PALETTE = ["#2166ac", "#b2182b", "#1b7837", "#762a83", "#e08214", "#4d4d4d"]


def panel_keys(summary: dict) -> list[str]:
    keys = {k for c in summary["curves"].values() for k in c}
    return ["mean"] + sorted(keys - {"mean"}, key=lambda k: (k != "reward/all_pass", k))


def _curve_panel(ax, summary: dict, key: str, first: bool) -> None:
    """One curve's panel: each method's seed mean with its min–max band (``first``: the legend and the threshold)."""
    from matplotlib.ticker import MaxNLocator

    for mi, m in enumerate(summary["methods"]):
        c = summary["curves"][m].get(key)
        if not c:
            continue
        x = np.arange(1, len(c["mean"]) + 1)
        f = lambda v: np.array([np.nan if a is None else a for a in v], dtype=float)  # noqa: E731
        color = PALETTE[mi % len(PALETTE)]
        ax.fill_between(x, f(c["lo"]), f(c["hi"]), color=color, alpha=0.18, linewidth=0)
        # a reward's curve has gaps (steps whose prompts lack it): markers keep lone points visible
        ax.plot(x, f(c["mean"]), color=color, label=m, linewidth=1.6, marker="o", markersize=2.5)
    ax.set_title("mean reward (per prompt)" if key == "mean" else key.split("/", 1)[-1], fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=7)
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    if first:
        ax.legend(fontsize=7, loc="best")
        if summary.get("threshold") is not None:
            ax.axhline(summary["threshold"], color="#888", linestyle=":", linewidth=1)


def _paired_panel(ax, summary: dict) -> None:
    """Each paired AUC difference with its 95 % interval, 0 in the middle."""
    methods, others = list(summary["methods"]), list(summary["paired"])
    for i, m in enumerate(others):
        p = summary["paired"][m]
        d, (lo, hi) = p["auc_diff"], p["ci95"]
        if d is None or lo is None or not all(map(math.isfinite, (d, lo, hi))):
            continue
        color = PALETTE[(methods.index(m)) % len(PALETTE)]
        ax.errorbar([d], [i], xerr=[[d - lo], [hi - d]], fmt="o", color=color, capsize=4)
    ax.axvline(0, color="#444", linewidth=1)
    ends = [abs(v) for p in summary["paired"].values() for v in (p["auc_diff"], *p["ci95"])
            if v is not None and math.isfinite(v)]
    ax.set_xlim(-1.15 * max(ends + [1e-3]), 1.15 * max(ends + [1e-3]))  # 0 in the middle
    ax.set_yticks(range(len(others)), [f"{m} − {summary['paired'][m]['against']}" for m in others], fontsize=8)
    ax.set_ylim(-0.7, len(others) - 0.3)
    ax.set_title("paired Δ AUC (95 % cluster bootstrap)", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, axis="x")


def plot_png(summary: dict) -> bytes:
    """The curves as a PNG (matplotlib, Agg): one panel per curve (mean reward, then each ``reward/<name>``),
    each method's seed mean with its min–max band, and a last panel with each paired AUC difference and its 95 %
    interval."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    keys = panel_keys(summary)
    panels = len(keys) + 1
    cols = min(3, panels)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    flat = axes.ravel()
    for i, key in enumerate(keys):
        _curve_panel(flat[i], summary, key, first=i == 0)
    _paired_panel(flat[len(keys)], summary)
    for a in flat[panels:]:
        a.set_visible(False)
    fig.suptitle(f"{summary['experiment']}: {summary['task']}, {plural(summary['seeds'], 'seed')} × "
                 f"{plural(summary['steps'], 'step')} (band: min–max over seeds)", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _num(v, fmt: str = "{:.3f}") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def report_html(summary: dict, png: bytes) -> str:
    """A self-contained HTML page: the PNG inlined (base64), the per-method and paired tables, the definitions."""
    e = html.escape
    rows = "".join(f"<tr><td>{e(m)}</td><td>{_num(v['auc'])}</td><td>{_num(v['final'])}</td>"
                   f"<td>{_num(v['steps_to_threshold'], '{}')}</td></tr>" for m, v in summary["methods"].items())
    prow = "".join(f"<tr><td>{e(m)} − {e(p['against'])}</td><td>{_num(p['auc_diff'], '{:+.4f}')}</td>"
                   f"<td>[{_num(p['ci95'][0], '{:+.4f}')}, {_num(p['ci95'][1], '{:+.4f}')}]</td><td>{p['n']}</td>"
                   f"<td>{p['n_seeds']}</td><td>{_num(p.get('detectable'), '{:.4f}')}</td></tr>"
                   for m, p in summary["paired"].items())
    defs = "".join(f"<li><b>{e(k)}</b>: {e(v)}</li>" for k, v in summary["definitions"].items())
    cfg = summary["config"]
    shared = ", ".join(f"{k}={v}" for k, v in cfg["base"].items() if v is not None and k != "template")
    img = base64.b64encode(png).decode("ascii")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{e(summary['experiment'])}</title>
<style>body{{font-family:ui-sans-serif,system-ui,sans-serif;margin:24px;color:#222;max-width:1300px}}
table{{border-collapse:collapse;margin:8px 0 16px 0;font-size:14px}}td,th{{border:1px solid #ccc;padding:3px 9px;
text-align:right}}td:first-child,th:first-child{{text-align:left}}img{{max-width:100%}}
.small{{font-size:12px;color:#555}}</style></head><body>
<h1>Experiment {e(summary['experiment'])}</h1>
<p>Task <b>{e(summary['task'])}</b>, model <b>{e(str(summary['model']))}</b>, {summary['seeds']} seeds ×
{summary['steps']} steps{'' if summary['complete'] else ' (incomplete: statistics over the steps stored)'};
methods {e(', '.join(summary['methods']))}. Threshold {_num(summary['threshold'])}.</p>
<img alt="curves" src="data:image/png;base64,{img}">
<h2>Per method</h2><table><tr><th>method</th><th>AUC</th><th>final</th><th>steps to threshold</th></tr>{rows}</table>
<h2>Paired against {e(cfg['methods'][0])}</h2>
<table><tr><th>comparison</th><th>Δ AUC</th><th>95 % interval</th><th>n units</th><th>seeds</th>
<th>smallest detectable Δ</th></tr>{prow}</table>
<h2>Definitions</h2><ul class="small">{defs}</ul>
<p class="small">Shared config: {e(shared)}</p></body></html>
"""


def write_outputs(summary: dict, out_dir: str | Path) -> dict[str, Path]:
    """``summary.json``, ``curves.png`` and ``report.html`` in ``out_dir`` (created; each file replaced atomically)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MrtpoError(f"cannot create the output folder {out}: {e.strerror or e}") from None
    png = plot_png(summary)
    paths = {"summary": out / SUMMARY_FILE, "png": out / PNG_FILE, "html": out / HTML_FILE}
    write_text(paths["summary"], dumps(summary) + "\n")
    write_text(paths["html"], report_html(summary, png))
    tmp = out / f".{PNG_FILE}.{int(time.time() * 1e6)}.tmp"
    try:
        tmp.write_bytes(png)
        tmp.replace(paths["png"])
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise MrtpoError(f"cannot write {paths['png']}: {e.strerror or e}") from None
    return paths


def band_polygons(x: list, lo: list, hi: list) -> tuple[list, list]:
    """The min–max band as one closed polygon per run of steps where the curve has a value (a reward is missing at
    steps whose prompt lacks it), the polygons separated by None: a band never bridges a gap."""
    xs: list = []
    ys: list = []
    run: list[int] = []

    def close() -> None:
        if run:
            xs.extend([x[i] for i in run] + [x[i] for i in reversed(run)] + [x[run[0]], None])
            ys.extend([hi[i] for i in run] + [lo[i] for i in reversed(run)] + [hi[run[0]], None])
            run.clear()

    for i in range(len(x)):
        ok = all(v is not None and math.isfinite(v) for v in (lo[i], hi[i]))
        if ok:
            run.append(i)
        else:
            close()
    close()
    return xs, ys
