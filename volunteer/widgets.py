"""Dashboard pieces shared by ``volunteer status`` (cli/) and the relay's live view (relay/).

Both views fit 80x24 the same way: borderless titled sections, ids cut with an ellipsis, list
rows budgeted from the terminal height with a "+N more" row. The helpers take values straight
from a status snapshot, which may come from another version or be broken: anything missing,
None or of the wrong type renders as a placeholder instead of raising. This module sits beside
the layers (it imports only rich and ``net.perf``), so neither view imports the other's package.
"""

from __future__ import annotations

import math

from rich import box
from rich.markup import escape
from rich.table import Table

from .sizes import format_size


SHORT_ID_CHARS = 6  # what PeerID.short() keeps too: one spelling of a peer in logs and every view


def short(peer: object) -> str:
    """THE short form of a peer id (or any long id, an address): its last characters behind an
    ellipsis, ``…a1B2c3``, the same as ``PeerID.short()`` writes in logs. Every view uses this."""
    whole = line(peer or "")
    return whole if len(whole) <= SHORT_ID_CHARS + 1 else "…" + whole[-SHORT_ID_CHARS:]


def as_dict(value: object) -> dict:
    """``value`` if it is a dict, else an empty one."""
    # a snapshot from another version (or a broken one) must not take the view down
    return value if isinstance(value, dict) else {}


def as_dicts(value: object) -> list[dict]:
    """The dicts in ``value`` if it is a list or tuple, else an empty list."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, (list, tuple)) else []


def finite(value: object) -> float | None:
    """``value`` if it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def text(value: object, default: str = "?") -> str:
    """A snapshot string made safe for rich markup (error messages carry brackets: ``[/ip4/…]``)."""
    return escape(line(value)) if value not in (None, "") else default


def line(value: object) -> str:
    """``value`` as one line of text."""
    # one row per item: a traceback in an error message must not push the view past 24 lines
    return " ".join(str(value).split())


def num(value: object, fmt: str = "{:.1f}", none: str = "–") -> str:
    """A number formatted with ``fmt``, or ``none`` when it is missing or not finite."""
    number = finite(value)
    if number is None:
        return none
    try:
        return fmt.format(number)
    except (TypeError, ValueError):
        return str(number)


def duration(seconds: object) -> str:
    """THE way every view writes a duration (uptime, ages, compute time): two units at most,
    ``0.4s``, ``42s``, ``4m05s``, ``2h03m``, ``3d04h``; ``–`` when missing or negative."""
    value = finite(seconds)
    if value is None or value < 0:
        return "–"
    if value < 10 and value != int(value):
        return f"{value:.1f}s"  # sub-10-second ages (a fresh declaration, a quick reservation) keep a decimal
    whole = int(value)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def fit(items: list, rows: int) -> list:
    """The items a list section shows in ``rows`` rows: all, or one fewer to leave room for "+N more"."""
    return items if len(items) <= rows else items[: max(0, rows - 1)]


def section(title: str, columns: int = 1, header: tuple[str, ...] = ()) -> Table:
    """A titled borderless section; with ``header``, a list whose first column keeps its width."""
    table = Table(
        title=title, title_justify="left", title_style="bold cyan", box=box.SIMPLE_HEAD if header else None,
        show_header=bool(header), show_edge=False, pad_edge=False, padding=(0, 1), expand=True,
    )
    for index in range(max(columns, len(header))):
        # lists: the first column (an id) keeps its width, the last one (free text) takes the rest
        last = bool(header) and index == len(header) - 1
        table.add_column(header[index] if header else "", no_wrap=True, overflow="ellipsis",
                         min_width=11 if index == 0 and header else None, ratio=1 if last or not header else None)
    return table


__all__ = [
    "SHORT_ID_CHARS", "as_dict", "as_dicts", "duration", "finite", "fit", "format_size", "line", "num", "section", "short", "text",
]
