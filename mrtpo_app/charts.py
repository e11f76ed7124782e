"""The app's Plotly figures: the Train page's per-metric curves of runs, an experiment's curves with bands over seeds,
the probe's relevance over steps; the run viewer's reward components over steps."""
from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from mrtpo.core.stats import smooth
from mrtpo.display.curves import metric_title
from mrtpo.display.run_stats import METRICS, TITLES
from mrtpo.experiment.report import PALETTE, band_polygons, panel_keys
from mrtpo.experiment.sweep import arm_title


def step_axes(fig: go.Figure, last: int, rows: int) -> None:
    """Integer step axes (1 … last), one range shared by every panel, "step" under the bottom row."""
    fig.update_xaxes(matches="x", range=[0.5, max(1, last) + 0.5], tickformat="d", dtick=max(1, math.ceil(last / 10)),
                     showticklabels=True)
    fig.update_xaxes(title_text="step", row=rows)
    fig.update_annotations(font_size=12)


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def band_curves(summary: dict, cols: int = 3) -> go.Figure:
    """One panel per curve (mean reward, then each reward/...): each method's seed mean and its min–max band."""
    keys = panel_keys(summary)
    rows = max(1, math.ceil(len(keys) / cols))
    titles = ["mean reward (per prompt, 0–1)" if k == "mean" else metric_title(k) for k in keys]
    # three panels a row: a long reward name breaks after its type ("…format:<br>number_bullet_lists (0–1)")
    titles = [t.replace(":", ":<br>", 1) if len(t) > 40 else t for t in titles]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles)
    last = 1
    for j, m in enumerate(summary["methods"]):
        color = PALETTE[j % len(PALETTE)]
        for i, k in enumerate(keys):
            c = summary["curves"][m].get(k)
            if not c:
                continue
            x = list(range(1, len(c["mean"]) + 1))
            last = max(last, len(x))
            pos = {"row": i // cols + 1, "col": i % cols + 1}
            bx, by = band_polygons(x, c["lo"], c["hi"])
            fig.add_trace(go.Scatter(x=bx, y=by, mode="lines", line={"width": 0}, fill="toself",
                                     fillcolor=_rgba(color, 0.18), legendgroup=m, showlegend=False,
                                     hoverinfo="skip"), **pos)
            fig.add_trace(go.Scatter(x=x, y=c["mean"], mode="lines+markers", name=m, legendgroup=m,
                                     showlegend=i == 0, line={"color": color}, marker={"size": 4},
                                     hovertemplate=f"{m} · step %{{x}}: %{{y:.3f}}<extra></extra>"), **pos)
    fig.update_yaxes(range=[-0.03, 1.03])
    step_axes(fig, last, rows)
    fig.update_layout(height=250 * rows, margin={"t": 40, "b": 20, "l": 20, "r": 20})
    return fig


def curves(keys: list[str], series: dict, cols: int = 3, window: int = 1, height: int = 240) -> go.Figure:
    """One panel per metric, one line per run (a trailing mean over ``window`` stored points); integer step axes
    shared by every panel."""
    rows = max(1, math.ceil(len(keys) / cols))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[metric_title(k) for k in keys],
                        vertical_spacing=min(0.3, 0.5 / rows), horizontal_spacing=0.06)
    last = 1
    for j, (name, m) in enumerate(series.items()):
        for i, k in enumerate(keys):
            pts = sorted((s, v) for s, v in m.get(k, {}).items() if v is not None)
            x, y = [p[0] for p in pts], smooth([p[1] for p in pts], window).tolist()
            last = max([last] + x)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=i == 0, marker={"size": 5},
                                     line={"color": PALETTE[j % len(PALETTE)]},
                                     hovertemplate=f"{name} · step %{{x}}: %{{y:.3f}}<extra></extra>"),
                          row=i // cols + 1, col=i % cols + 1)
    step_axes(fig, last, rows)
    for i, k in enumerate(keys):  # rewards and fractions on their whole [0, 1] scale
        if k.startswith(("reward/", "type/")) or k in ("clip_frac",):
            fig.update_yaxes(range=[-0.05, 1.05], row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(height=height * rows + 40, margin={"t": 70, "b": 20, "l": 20, "r": 20},
                      legend={"orientation": "h", "x": 0, "y": 1, "yanchor": "top", "yref": "container"})
    return fig


def probe_heatmap(tokens: list[str], steps: list[int], heat: list[list[float]]) -> go.Figure:
    """Rows: steps (0 = before training); columns: tokens; color: relevance ρ."""
    labels = [f"{n}:{t!r}" for n, t in enumerate(tokens)]
    fig = go.Figure(go.Heatmap(z=heat, x=labels, y=[f"step {s}" for s in steps], colorscale="Oranges", zmin=0,
                               hovertemplate="%{y} · token %{x}<br>ρ = %{z:.3f}<extra></extra>"))
    fig.update_layout(height=120 + 22 * len(steps), margin={"t": 10, "b": 10, "l": 10, "r": 10},
                      yaxis={"autorange": "reversed"}, xaxis={"showticklabels": len(labels) <= 60})
    return fig


def component_curves_chart(curves: dict, cols: int = 3, height: int = 220) -> go.Figure:
    """A run's reward components over steps (:func:`mrtpo.display.run_stats.component_curves`): one panel per metric
    (mean reward, share of zeros, of constant groups, of the advantage's magnitude, concentration), one line per
    reward; the shares on their whole [0, 1] scale. A metric no reward has (another tool's log without per-reward
    advantages) is left out."""
    keys = [m for m in METRICS if any(v is not None for c in curves.values() for v in c[m].values())]
    rows = max(1, math.ceil(len(keys) / cols))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[TITLES[k] for k in keys],
                        vertical_spacing=min(0.3, 0.6 / rows), horizontal_spacing=0.06)
    colors = PALETTE if len(curves) <= len(PALETTE) else qualitative.Dark24  # many rewards: colors that differ
    last = 1
    for j, (name, c) in enumerate(curves.items()):
        for i, k in enumerate(keys):
            pts = sorted((s, v) for s, v in c[k].items() if v is not None)
            x, y = [p[0] for p in pts], [p[1] for p in pts]
            last = max([last] + x)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=name, legendgroup=name, showlegend=i == 0,
                                     marker={"size": 5}, line={"color": colors[j % len(colors)]},
                                     hovertemplate=f"{name} · step %{{x}}: %{{y:.3f}}<extra></extra>"),
                          row=i // cols + 1, col=i % cols + 1)
            if k != "mean":
                fig.update_yaxes(range=[-0.05, 1.05], row=i // cols + 1, col=i % cols + 1)
    step_axes(fig, last, rows)
    top = 40 + 24 * math.ceil(len(curves) / 4)  # the legend's lines (about 4 long reward names a line) above
    fig.update_layout(height=height * rows + top, margin={"t": top, "b": 20, "l": 20, "r": 20},
                      legend={"orientation": "h", "x": 0, "y": 1, "yanchor": "top", "yref": "container"})
    return fig


def credit_sweep(rows: list[dict]) -> go.Figure:
    """The credit sweep: each arm's Δ AUC against GDPO at each K (items = rewards per response), with its 95 %
    interval as error bars; 0 marked."""
    fig = go.Figure()
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    for i, arm in enumerate(arms):
        pts = [r for r in rows if r["arm"] == arm and r["delta"] is not None and math.isfinite(r["delta"])]
        name = arm_title(arm).replace("`", "")  # a legend shows no markdown
        fig.add_trace(go.Scatter(
            x=[r["k"] + 0.08 * (i - (len(arms) - 1) / 2) for r in pts], y=[r["delta"] for r in pts],
            mode="lines+markers", name=name, line={"color": PALETTE[(i + 1) % len(PALETTE)]},
            error_y={"type": "data", "symmetric": False, "array": [r["ci95"][1] - r["delta"] for r in pts],
                     "arrayminus": [r["delta"] - r["ci95"][0] for r in pts]},
            customdata=[[r["k"], r["ci95"][0], r["ci95"][1]] for r in pts],
            hovertemplate=f"{name} · K = %{{customdata[0]}}: Δ AUC %{{y:+.3f}} "
                          "[%{customdata[1]:+.3f}, %{customdata[2]:+.3f}]<extra></extra>"))
    fig.add_hline(y=0, line={"color": "#444", "width": 1})
    ks = sorted({r["k"] for r in rows})
    fig.update_xaxes(title_text="K (items = rewards per response)", tickvals=ks)
    fig.update_yaxes(title_text="Δ AUC vs GDPO (95 % interval)")
    fig.update_layout(height=320, margin={"t": 20, "b": 20, "l": 20, "r": 20})
    return fig
