"""The volunteer dashboard: one status snapshot (``Daemon.snapshot()``) rendered with rich.

The same renderer serves ``volunteer join`` in a terminal (``LiveDashboard``, ~2 Hz, no flicker:
rich Live with manual refresh), ``volunteer status`` (attached over the control socket) and
tests (``render_text``, headless). It fits 80x24: every section is a titled table without
borders, rows are budgeted from the height, long ids and addresses are cut with an ellipsis;
wider terminals get two columns. Every field of the snapshot may be missing or None.
"""

from __future__ import annotations

import io
import time
from typing import Callable

import trio
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..net.perf import format_size
from ..widgets import as_dict, as_dicts, duration, finite, fit, line, num, section, short, text

SECTIONS = ("Identity", "Reachability", "Connections", "DHT", "Experts", "Compute", "Log")


def _identity(s: dict) -> Table:
    table = section("Identity", 1)
    state = "[bold yellow]PAUSED[/]" if s.get("paused") else "[green]running[/]"
    table.add_row(f"{state} · swarm {text(s.get('swarm'))} · up {duration(s.get('uptime_s'))} · volunteer {text(s.get('version'))}")
    table.add_row(f"peer {text(s.get('peer_id'))}")
    return table


def _reachability(s: dict, rows: int) -> Table:
    reach = as_dict(s.get("reachability"))
    table = section("Reachability", 1)
    status = text(reach.get("status"), "unknown")
    color = {"public": "green", "private": "yellow"}.get(status, "white")
    observed = reach.get("observed_addrs")
    observed = ", ".join(text(a) for a in observed if a) if isinstance(observed, (list, tuple)) else ""
    table.add_row(f"[{color}]{status}[/] · NAT mapping {text(reach.get('nat_type'), 'unknown')} · observed {observed or 'none yet'}")
    relays = as_dicts(reach.get("relays"))
    if relays:
        parts = []
        for relay in relays:
            rtt = num(relay.get("rtt_ms"), "{:.1f} ms")
            state = "reserved" if relay.get("reserved", True) else text(relay.get("error"), "not reserved")
            parts.append(f"{text(short(relay.get('peer_id') or relay.get('addr')))} {state} rtt {rtt}")
        table.add_row("relays: " + "; ".join(parts[: max(1, rows)]))
    elif status == "private":
        table.add_row("relays: none reserved yet")
    return table


def _connections(s: dict, rows: int) -> Table:
    conns = as_dicts(s.get("connections"))
    table = section("Connections", header=("peer", "path", "rtt", "in / out"))
    conns.sort(key=lambda c: -((finite(c.get("bytes_in")) or 0) + (finite(c.get("bytes_out")) or 0)))
    shown = fit(conns, rows)
    for conn in shown:
        path = line(conn.get("path") or "?")
        if path == "relayed" and conn.get("via"):
            path = f"relayed via {short(conn['via'], 6)}"
        sent, received = finite(conn.get("bytes_out")), finite(conn.get("bytes_in"))
        traffic = "–"
        if sent is not None or received is not None:
            traffic = f"{format_size(int(received or 0))} / {format_size(int(sent or 0))}"
        table.add_row(Text(short(conn.get("peer_id"), 10)), Text(path), num(conn.get("rtt_ms"), "{:.1f} ms"), traffic)
    if len(shown) < len(conns):
        table.add_row(f"+{len(conns) - len(shown)} more", "", "", "")
    if not conns:
        table.add_row("no connections", "", "", "")
    return table


def _dht(s: dict) -> Table:
    dht = as_dict(s.get("dht"))
    table = section("DHT", 1)
    age = dht.get("last_declared_age_s")
    declared = f"{num(age, '{:.0f}')} s ago" if age is not None else "never"
    mode = "client mode" if dht.get("client_mode") else "server mode"
    table.add_row(
        f"{mode} · {num(dht.get('routing_table'), '{}')} peers · {num(dht.get('records'), '{}')} records · "
        f"{num(dht.get('experts_declared'), '{}')} experts declared {declared}"
    )
    return table


def _experts(s: dict, rows: int) -> Table:
    experts = as_dicts(s.get("experts"))
    table = section("Experts", header=("uid", "req/s", "batch", "p50", "p95", "errors", "last error"))
    experts.sort(key=lambda e: (-(finite(e.get("requests_per_s")) or 0), str(e.get("uid") or "")))
    shown = fit(experts, rows)
    for expert in shown:
        table.add_row(
            Text(line(expert.get("uid") or "?")),
            num(expert.get("requests_per_s")),
            num(expert.get("mean_batch")),
            num(expert.get("p50_ms"), "{:.1f}ms"),
            num(expert.get("p95_ms"), "{:.1f}ms"),
            num(expert.get("errors"), "{}"),
            Text(line(expert.get("last_error") or "")),
        )
    if len(shown) < len(experts):
        total = int(sum(finite(e.get("requests")) or 0 for e in experts))
        table.add_row(f"+{len(experts) - len(shown)} more", "", "", "", "", "", f"{total} requests in all")
    if not experts:
        table.add_row("none hosted (DHT and relaying only)", "", "", "", "", "", "")
    return table


def _compute(s: dict) -> Table:
    compute = as_dict(s.get("compute"))
    table = section("Compute", 1)
    memory = "n/a"
    used, total = finite(compute.get("memory_used_mb")), finite(compute.get("memory_total_mb"))
    if used is not None and total is not None:
        memory = f"{used:.0f} / {total:.0f} MiB"
    table.add_row(
        f"device {text(compute.get('device'))} · utilisation {num(compute.get('utilization_pct'), '{:.0f}%', 'n/a')} · memory {memory}"
    )
    return table


def _log(s: dict, rows: int) -> Table:
    entries = as_dicts(s.get("log"))[-max(1, rows):]
    table = section("Log", 1)
    for entry in entries:
        stamp = finite(entry.get("time"))
        when = time.strftime("%H:%M:%S", time.localtime(stamp)) if stamp is not None and 0 <= stamp < 1e11 else "--:--:--"
        level = str(entry.get("level") or "?")
        color = "red" if level in ("ERROR", "CRITICAL") else "yellow"
        prefix = Text(f"{when} ") + Text(level[:4], style=color) + Text(" ")
        table.add_row(prefix + Text(line(entry.get("message") or "")))
    if not entries:
        table.add_row("no warnings")
    return table


def render_dashboard(snapshot: dict, *, width: int | None = None, height: int = 24) -> RenderableType:
    """The dashboard for a snapshot, sized for ``height`` lines (two columns from 120 wide)."""
    s = as_dict(snapshot)
    extra = max(0, height - 24)  # rows beyond the 80x24 budget go to the lists
    conn_rows, expert_rows, log_rows = 2 + extra // 3, 3 + extra // 3, 1 + extra // 3
    if width is not None and width >= 120:
        left = Group(_identity(s), _reachability(s, 3), _dht(s), _compute(s), _log(s, log_rows + 2))
        right = Group(_connections(s, conn_rows + 2), _experts(s, expert_rows + 2))
        grid = Table.grid(expand=True, padding=(0, 2))
        grid.add_column(ratio=1)
        grid.add_column(ratio=1)
        grid.add_row(left, right)
        return grid
    return Group(
        _identity(s), _reachability(s, 2), _connections(s, conn_rows), _dht(s),
        _experts(s, expert_rows), _compute(s), _log(s, log_rows),
    )


def render_text(snapshot: dict, width: int = 80, height: int = 24) -> str:
    """The dashboard as plain text (no colours), for tests and ``volunteer status`` in a pipe."""
    console = Console(file=io.StringIO(), width=width, height=height, color_system=None, force_terminal=False,
                      legacy_windows=False, record=False)
    console.print(render_dashboard(snapshot, width=width, height=height))
    return console.file.getvalue()


class LiveDashboard:
    """Redraws the dashboard in place about twice a second until cancelled."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console

    async def run(self, get_snapshot: Callable[[], dict], *, refresh_hz: float = 2.0,
                  task_status=trio.TASK_STATUS_IGNORED) -> None:
        from rich.live import Live

        console = self.console or Console()
        period = 1.0 / min(max(refresh_hz, 0.1), 30.0)
        last: dict = {}

        def view() -> RenderableType:
            nonlocal last
            snapshot = last
            try:
                snapshot = last = as_dict(get_snapshot())
            except Exception as exc:  # the view runs beside the daemon: it must not take it down
                entry = {"time": time.time(), "level": "ERROR", "message": f"status snapshot failed: {exc!r}"}
                snapshot = dict(last, log=[*as_dicts(last.get("log")), entry])
            size = console.size
            return render_dashboard(snapshot, width=size.width, height=size.height)

        with Live(view(), console=console, auto_refresh=False, screen=False, transient=False) as live:
            task_status.started()
            while True:
                await trio.sleep(period)
                live.update(view(), refresh=True)


__all__ = ["LiveDashboard", "SECTIONS", "render_dashboard", "render_text"]
