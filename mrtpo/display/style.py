"""The heatmaps' colors and style sheet (:mod:`mrtpo.display.render` draws with them): a diverging scale pinned at 0
for advantages (blue = positive, red = negative, 0 transparent), a sequential one for relevance (orange), and the CSS
of every view, its one tooltip rule among it (``[data-tip]:hover::after``)."""
from __future__ import annotations

import numpy as np

CSS = """
.mrtpo{font-family:ui-sans-serif,system-ui,sans-serif;font-size:14px;color:#222}
.mrtpo .row{display:flex;align-items:flex-start;margin:2px 0}
.mrtpo .lab{flex:0 0 190px;font-size:12px;color:#555;padding-top:3px}
.mrtpo .toks{flex:1;font-family:ui-monospace,Menlo,Consolas,monospace;line-height:1.9;white-space:normal;
 word-break:break-word}
.mrtpo .tok{border-radius:3px;padding:1px 0;white-space:pre-wrap}
.mrtpo [data-tip]{position:relative}
.mrtpo [data-tip]:hover::after{content:attr(data-tip);position:absolute;left:0;top:100%;z-index:50;margin-top:3px;
 background:#222;color:#fff;font:11px/1.45 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;
 width:max-content;max-width:560px;padding:3px 7px;border-radius:3px;pointer-events:none;text-align:left}
.mrtpo [data-tip]:hover{outline:1px solid #333}
@supports (position-try-fallbacks:flip-inline){.mrtpo [data-tip]:hover{anchor-name:--mrtpo-tip}
 .mrtpo [data-tip]:hover::after{position:fixed;position-anchor:--mrtpo-tip;left:anchor(left);top:anchor(bottom);
 position-try-fallbacks:flip-inline,flip-block,flip-block flip-inline}}
.mrtpo .ev{border-bottom:3px solid #111;padding:0 1px 1px;box-decoration-break:clone;-webkit-box-decoration-break:clone}
.mrtpo .evkey{font-family:ui-monospace,Menlo,Consolas,monospace}
.mrtpo .faith{display:block;font-size:11px;color:#333}
.mrtpo .nl{color:#aaa}
.mrtpo .legend{display:flex;flex-wrap:wrap;gap:4px 14px;align-items:center;font-size:12px;color:#555;margin:6px 0}
.mrtpo .bar{display:inline-block;width:120px;height:10px;border-radius:2px;vertical-align:middle}
.mrtpo .reward{border-top:1px solid #eee;padding-top:4px;margin-top:6px}
.mrtpo h3{margin:10px 0 4px 0;font-size:15px}
.mrtpo .pair{display:grid;grid-template-columns:repeat(auto-fit,minmax(360px,1fr));column-gap:24px}
.mrtpo .pair .row{flex-direction:column;margin:3px 0}
.mrtpo .pair .lab{flex:none;padding:0 0 1px 0}
.mrtpo .pair .faith{display:inline;margin-left:8px}
.mrtpo .why{font-weight:normal;font-size:12px;color:#666}
.mrtpo .vk{font-size:12px;color:#555;margin:1px 0 2px 0}
.mrtpo .vk summary{cursor:pointer}
.mrtpo .vk pre{white-space:pre-wrap;background:#f6f6f6;padding:4px 6px;margin:2px 0;font-size:12px}
.mrtpo .scale{font-weight:600;color:#333}
.mrtpo table{border-collapse:collapse;font-size:12px}
.mrtpo td,.mrtpo th{border:1px solid #ddd;padding:2px 6px;text-align:right}
"""

POS, NEG, REL = (33, 102, 172), (178, 24, 43), (230, 97, 1)


def diverging_color(v: float, vmax: float) -> str:
    """rgba for an advantage: blue for v > 0, red for v < 0, alpha |v| / vmax (0 → transparent)."""
    if vmax <= 0 or v == 0 or not np.isfinite(v):
        return "transparent"
    a = min(1.0, abs(v) / vmax) * 0.85
    r, g, b = POS if v > 0 else NEG
    return f"rgba({r},{g},{b},{a:.3f})"


def sequential_color(v: float, vmax: float) -> str:
    """rgba for relevance: orange with alpha v / vmax."""
    if vmax <= 0 or v <= 0 or not np.isfinite(v):
        return "transparent"
    a = min(1.0, v / vmax) * 0.85
    return f"rgba({REL[0]},{REL[1]},{REL[2]},{a:.3f})"
