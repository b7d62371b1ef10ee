"""Plots drawn server-side as inline SVG: a page that shows them needs no JavaScript library and
no network (donors' machines may be offline). Pure functions: figures in, markup out. The
geometry is computed here, the markup is in ``templates/*.svg`` (autoescaped: every text a
caller hands in is text); every number is checked (NaN and negatives draw as zero)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markupsafe import Markup

from .templating import render

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
) -> Markup:
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
    gridlines = [(upper + plot_h * (1 - fraction), f"{fmt(top * fraction)}{unit}") for fraction in (0, 0.5, 1)]
    bars = []
    for index, label in enumerate(labels):
        base: float = upper + plot_h
        rects = []
        for row, s in zip(rows, series):
            if row[index] > 0:
                h = plot_h * row[index] / top
                base -= h
                rects.append({"y": base, "h": h, "color": s.color})
        tip = f"{label}: " + ", ".join(f"{s.name} {fmt(row[index])}{unit}" for row, s in zip(rows, series))
        bars.append({"x": left + index * step + (step - bar_w) / 2, "rects": rects, "tip": tip, "label": label,
                     "tick": bool(tick_every) and index % tick_every == 0})
    legend = []
    if len(series) > 1:
        x = width - right
        for s in reversed(series):
            legend.append((x, s))
            x -= 12 + 7 * len(s.name) + 12
    return render("bar_chart.svg", width=width, height=height, chart_id=chart_id, title=title, left=left, right=right,
                  upper=upper, lower=lower, plot_w=plot_w, plot_h=plot_h, bar_w=bar_w, gridlines=gridlines, bars=bars,
                  legend=legend, empty=not any(totals))


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
             cell: int = 26, gap: int = 3, map_id: str = "") -> Markup:
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
    placed = [{"y": 20 + gap + r * (cell + gap), "label": row_labels[r] if r < len(row_labels) else None,
               "cells": [(label_w + gap + c * (cell + gap), item) for c, item in enumerate(row)]}
              for r, row in enumerate(kept)]
    return render("cell_map.svg", width=label_w + columns * (cell + gap) + gap, height=20 + len(kept) * (cell + gap) + gap,
                  map_id=map_id, title=title, label_w=label_w, cell=cell, rows=placed,
                  column_xs=[label_w + gap + c * (cell + gap) + cell / 2 for c in range(columns)])


__all__ = ["Cell", "MAX_CELLS", "PALETTE", "Series", "bar_chart", "cell_map", "nice_ceiling"]
