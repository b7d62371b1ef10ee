"""Plots drawn server-side as inline SVG: a page that shows them needs no JavaScript library and
no network (donors' machines may be offline). Pure functions: figures in, markup out; every
text is escaped, every number is checked (NaN and negatives draw as zero)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

MAX_BARS = 2000  # a chart of more bars than this is cut to the newest ones
PALETTE = ("#2f7ed8", "#f28f43", "#8bbc21", "#910000", "#1aadce", "#492970")


@dataclass(frozen=True)
class Series:
    """One row of bars (stacked on the others of its chart): a name, a colour, values."""

    name: str
    values: Sequence[float]
    color: str = PALETTE[0]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 × 10^k at or above ``value`` (an axis maximum)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * (1 - 1e-9):
            return step * power
    return 10 * power


def _clean(value: float) -> float:
    return value if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else 0.0


def bar_chart(
    labels: Sequence[str],
    series: Sequence[Series],
    *,
    title: str,
    unit: str = "",
    fmt: Callable[[float], str] = lambda v: f"{v:g}",
    tick_every: int = 1,
    width: int = 720,
    height: int = 200,
    chart_id: str = "",
) -> str:
    """Stacked bars, one per label, with a y axis in ``unit``; each bar's tooltip (``<title>``)
    gives its label and figures. ``tick_every``: label one bar in so many on the x axis."""
    labels = list(labels)[-MAX_BARS:]
    count = len(labels)
    rows = [[_clean(v) for v in list(s.values)[-MAX_BARS:]] + [0.0] * max(0, count - len(s.values)) for s in series]
    totals = [sum(row[i] for row in rows) for i in range(count)]
    top = nice_ceiling(max(totals, default=0.0))
    left, right, upper, lower = 56, 8, 26, 34
    plot_w, plot_h = width - left - right, height - upper - lower
    step = plot_w / max(1, count)
    bar_w = max(1.0, step * 0.8)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}"' + (f' id="{escape(chart_id)}"' if chart_id else "") + ">",
        f"<title>{escape(title)}</title>",
        f'<text x="{left}" y="16" class="chart-title" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    for fraction in (0, 0.5, 1):
        y = upper + plot_h * (1 - fraction)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#ccc" stroke-width="1"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10" fill="#555">'
                   f"{escape(fmt(top * fraction))}{escape(unit)}</text>")
    for index, label in enumerate(labels):
        x = left + index * step + (step - bar_w) / 2
        base = upper + plot_h
        parts = []
        for row, s in zip(rows, series):
            value = row[index]
            if value <= 0:
                continue
            h = plot_h * value / top
            base -= h
            parts.append(f'<rect x="{x:.1f}" y="{base:.1f}" width="{bar_w:.1f}" height="{h:.1f}" fill="{escape(s.color)}"/>')
        tip = f"{label}: " + ", ".join(f"{s.name} {fmt(row[index])}{unit}" for row, s in zip(rows, series))
        if parts:
            out.append(f'<g class="bar"><title>{escape(tip)}</title>{"".join(parts)}</g>')
        if tick_every and index % tick_every == 0:
            out.append(f'<text x="{x + bar_w / 2:.1f}" y="{height - lower + 14}" text-anchor="middle" font-size="10" '
                       f'fill="#555">{escape(label)}</text>')
    if len(series) > 1:
        x = width - right
        for s in reversed(series):
            out.append(f'<text x="{x}" y="16" text-anchor="end" font-size="11" fill="{escape(s.color)}">■ {escape(s.name)}</text>')
            x -= 12 + 7 * len(s.name) + 12
    if not any(totals):
        out.append(f'<text x="{left + plot_w / 2:.1f}" y="{upper + plot_h / 2:.1f}" text-anchor="middle" font-size="12" '
                   f'fill="#888">nothing yet</text>')
    out.append(f'<line x1="{left}" y1="{upper + plot_h}" x2="{width - right}" y2="{upper + plot_h}" stroke="#888" stroke-width="1"/>')
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class Cell:
    """One square of a ``cell_map``: its fill colour, its tooltip, an optional short label and
    a class (tests and styles find cells by it)."""

    color: str
    tip: str
    label: str = ""
    css_class: str = "cell"


MAX_CELLS = 4096  # a map of more cells than this draws the first ones only (the caller says so)


def cell_map(rows: Sequence[Sequence[Cell]], *, title: str, row_labels: Sequence[str] = (),
             cell: int = 26, gap: int = 3, map_id: str = "") -> str:
    """A grid of coloured squares (a coverage map): ``rows`` of cells, each with a tooltip; row
    labels on the left. Cells past ``MAX_CELLS`` are left out."""
    drawn = 0
    kept: list[list[Cell]] = []
    for row in rows:
        room = MAX_CELLS - drawn
        if room <= 0:
            break
        kept.append(list(row)[:room])
        drawn += len(kept[-1])
    label_w = 8 + 7 * max((len(label) for label in row_labels), default=0)
    columns = max((len(row) for row in kept), default=0)
    width = label_w + columns * (cell + gap) + gap
    height = 20 + len(kept) * (cell + gap) + gap
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="cellmap" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}"' + (f' id="{escape(map_id)}"' if map_id else "") + ">",
        f"<title>{escape(title)}</title>",
    ]
    for c in range(columns):  # column indices along the top
        x = label_w + gap + c * (cell + gap) + cell / 2
        out.append(f'<text x="{x:.1f}" y="14" text-anchor="middle" font-size="10" fill="#555">{c}</text>')
    for r, row in enumerate(kept):
        y = 20 + gap + r * (cell + gap)
        if r < len(row_labels):
            out.append(f'<text x="{label_w - 6}" y="{y + cell / 2 + 4:.1f}" text-anchor="end" font-size="11" '
                       f'fill="#555">{escape(row_labels[r])}</text>')
        for c, item in enumerate(row):
            x = label_w + gap + c * (cell + gap)
            text = (f'<text x="{x + cell / 2:.1f}" y="{y + cell / 2 + 4:.1f}" text-anchor="middle" font-size="11" '
                    f'fill="#fff" font-weight="bold">{escape(item.label)}</text>') if item.label else ""
            out.append(f'<g class="{escape(item.css_class)}"><title>{escape(item.tip)}</title>'
                       f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" rx="4" fill="{escape(item.color)}"/>{text}</g>')
    out.append("</svg>")
    return "".join(out)


__all__ = ["Cell", "MAX_CELLS", "PALETTE", "Series", "bar_chart", "cell_map", "nice_ceiling"]
