"""Line charts as inline SVG, drawn on the server: the console needs no JavaScript and no build step."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape

from markupsafe import Markup

from strom.gateway.console.metrics import Point

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")
WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 28


def format_value(value: float, unit: str = "") -> str:
    """A short number for an axis or a legend: 1.2k, 3.4M; seconds as s."""
    magnitude = abs(value)
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= size:
            return f"{value / size:.1f}{suffix}{unit}"
    if magnitude and magnitude < 10 and value != int(value):
        return f"{value:.2f}{unit}"
    return f"{value:.0f}{unit}"


def line_chart(lines: Mapping[str, Sequence[Point]], title: str, unit: str = "", chart_id: str = "") -> Markup:
    """An SVG chart of ``lines`` (label → points over time), or a note when there is nothing to draw yet."""
    drawn = {label: list(points) for label, points in sorted(lines.items()) if points}
    identity = f' id="{escape(chart_id)}"' if chart_id else ""
    if not drawn:
        return Markup(f'<figure class="chart empty"{identity}><figcaption>{escape(title)}</figcaption>'
                      "<p>No samples yet.</p></figure>")
    times = [p.at for points in drawn.values() for p in points]
    values = [p.value for points in drawn.values() for p in points]
    t0, t1 = min(times), max(times)
    top = max([*values, 0.0])
    bottom = min([*values, 0.0])
    if top == bottom:
        top = bottom + 1.0
    span_t = (t1 - t0) or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(at: float) -> float:
        return LEFT + (at - t0) / span_t * plot_w

    def y(value: float) -> float:
        return TOP + (top - value) / (top - bottom) * plot_h

    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
             f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="plot"/>']
    for fraction in (0.0, 0.5, 1.0):
        value = bottom + (top - bottom) * fraction
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" class="grid"/>'
                     f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" class="axis" text-anchor="end">'
                     f"{escape(format_value(value, unit))}</text>")
    ago = max(0.0, time.time() - t0)
    parts.append(f'<text x="{LEFT}" y="{HEIGHT - 8}" class="axis">{escape(_ago(ago))}</text>'
                 f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" class="axis" text-anchor="end">'
                 f"{escape(_ago(max(0.0, time.time() - t1)))}</text>")
    legend = []
    for index, (label, points) in enumerate(drawn.items()):
        color = PALETTE[index % len(PALETTE)]
        path = " ".join(f"{x(p.at):.1f},{y(p.value):.1f}" for p in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.8">'
                     f"<title>{escape(label)}</title></polyline>")
        legend.append(f'<li><span class="swatch" style="background:{color}"></span>{escape(label)} '
                      f'<b class="last">{escape(format_value(points[-1].value, unit))}</b></li>')
    parts.append("</svg>")
    return Markup(f'<figure class="chart"{identity}><figcaption>{escape(title)}</figcaption>{"".join(parts)}'
                  f'<ul class="legend">{"".join(legend)}</ul></figure>')


def _ago(seconds: float) -> str:
    if seconds < 1:
        return "now"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago"


__all__ = ["format_value", "line_chart"]
