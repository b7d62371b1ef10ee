"""The volunteer dashboard: one status snapshot (``Daemon.snapshot()``) rendered with rich.

The same renderer serves ``volunteer join`` in a terminal (``LiveDashboard``, ~2 Hz, no flicker:
rich Live with manual refresh), ``volunteer status`` (attached over the control socket) and
tests (``render_text``, headless). It fits 80x24: every section is a titled table without
borders, rows are budgeted from the height, long ids and addresses are cut with an ellipsis;
terminals from 140 columns get two. Every field of the snapshot may be missing or None.
"""

from __future__ import annotations

import io
import logging
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import trio
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..sizes import format_size
from ..widgets import as_dict, as_dicts, duration, finite, fit, line, num, section, short, text

SECTIONS = ("Identity", "Reachability", "Connections", "DHT", "Experts", "Compute", "Given", "Log")
TWO_COLUMNS_FROM = 140  # narrower, a column is too narrow for the Compute and Given rows
COMPACT_BELOW = 30  # terminals lower than this get one-row Identity and a merged Compute row
SUMMARY_PERIOD = 300.0  # seconds between one-line summaries in --no-dashboard mode
LIST_OVERHEAD = 3  # a list section's title, header and rule
PLAIN_OVERHEAD = 1  # a plain section's title
LOG_ROWS_WIDE = 6  # log lines a wide terminal keeps for the log before the lists take the rest
COVERAGE_FRESH_S = 30.0  # a coverage survey older than this says its age

REACHABILITY_WORDS = {
    "public": "[green]public[/]: others reach you directly",
    "private": "[yellow]private[/]: others reach you through relays",
    "unknown": "checking whether others can reach you",
}
NAT_WORDS = {
    "endpoint-independent": "NAT: hole punching possible (endpoint-independent)",
    "endpoint-dependent": "NAT: hole punching unlikely (symmetric NAT); traffic goes via relays",
    "unknown": "NAT: not known yet whether hole punching works",
}


STATE_STYLES = {"paused": "bold yellow", "waiting": "bold cyan", "finishing": "bold magenta",
                "finished": "bold"}


def _state(s: dict) -> str:
    """What the daemon does and why (fold/pause/finish, run-when policies, self-care)."""
    word = line(s.get("state") or ("paused" if s.get("paused") else "folding"))
    why = line(s.get("state_text") or "")
    if word == "folding":  # serving: said as every view has said it
        return "[green]running[/]"
    return f"[{STATE_STYLES.get(word, 'bold')}]{word.upper()}[/]" + (f" ({text(why)})" if why and why != word else "")


def _identity(s: dict, compact: bool) -> Table:
    table = section("Identity", 1)
    state = _state(s)
    head = f"{state} · swarm {text(s.get('swarm'))} · up {duration(s.get('uptime_s'))} · volunteer {text(s.get('version'))}"
    if compact:
        table.add_row(f"{head} · peer {text(s.get('peer_id'))}")
    else:
        table.add_row(head)
        table.add_row(f"peer {text(s.get('peer_id'))}")
    return table


NOT_JOINED = "not joined: nothing dialled, announced or downloaded until you fold (waiting for your consent)"


def _reachability(s: dict) -> Table:
    reach = as_dict(s.get("reachability"))
    table = section("Reachability", 1)
    if s.get("joined") is False:
        table.add_row(NOT_JOINED)
        return table
    status = line(reach.get("status") or "unknown")
    words = REACHABILITY_WORDS.get(status, text(status))
    after = finite(s.get("reachable_after_s"))
    if after is not None:
        words += f" (after {duration(after)})"
    observed = reach.get("observed_addrs")
    observed = ", ".join(text(a) for a in observed if a) if isinstance(observed, (list, tuple)) else ""
    table.add_row(f"{words} · seen as {observed or 'nothing yet'}")
    nat = line(reach.get("nat_type") or "unknown")
    table.add_row(NAT_WORDS.get(nat, "NAT: " + text(nat)))
    relays = as_dicts(reach.get("relays"))
    if relays:
        parts = []
        for relay in relays:
            state = "reserved" if relay.get("reserved", True) else text(relay.get("error"), "not reserved")
            name = text(short(relay.get('peer_id') or relay.get('addr')))
            if relay.get("reserved", True) and relay.get("answering") is False:  # a dead relay's reservation
                silent = finite(relay.get("silent_s"))
                parts.append(f"[red]{name} NOT ANSWERING[/]" + (f" for {duration(silent)}" if silent is not None else ""))
                continue
            parts.append(f"{name} {state} rtt {num(relay.get('rtt_ms'), '{:.1f} ms')}")
        table.add_row("relays: " + "; ".join(parts))
    elif status == "private":
        table.add_row("relays: none reserved yet")
    return table


def _connections(conns: list[dict], rows: int) -> Table:
    shown = conns[:max(1, rows)]
    title = "Connections"
    if len(shown) < len(conns):  # said in the title: every row the terminal has shows a peer
        roles: dict[str, int] = {}
        for conn in conns[len(shown):]:
            roles[line(conn.get("role") or "peer")] = roles.get(line(conn.get("role") or "peer"), 0) + 1
        title += f" · +{len(conns) - len(shown)} more: " + ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
    table = section(title, header=("peer", "is", "path", "rtt", "in / out"))
    for conn in shown:
        path = line(conn.get("path") or "?")
        if path == "relayed" and conn.get("via"):
            path = f"relayed via {short(conn['via'])}"
        sent, received = finite(conn.get("bytes_out")), finite(conn.get("bytes_in"))
        traffic = "–"
        if sent is not None or received is not None:
            traffic = f"{format_size(int(received or 0))} / {format_size(int(sent or 0))}"
        table.add_row(Text(short(conn.get("peer_id"))), Text(line(conn.get("role") or "?")), Text(path),
                      num(conn.get("rtt_ms"), "{:.1f} ms"), traffic)
    if not conns:
        table.add_row("no connections", "", "", "", "")
    return table


def _dht(s: dict) -> Table:
    dht = as_dict(s.get("dht"))
    table = section("DHT", 1)
    if s.get("joined") is False:
        table.add_row("none running: not joined yet")
        return table
    age = dht.get("last_declared_age_s")
    declared = f"{duration(age)} ago" if finite(age) is not None else "never"
    mode = "client mode" if dht.get("client_mode") else "server mode"
    table.add_row(
        f"{mode} · {num(dht.get('routing_table'), '{}')} peers · {num(dht.get('records'), '{}')} records · "
        f"{num(dht.get('experts_declared'), '{}')} experts declared {declared}"
    )
    view = as_dict(s.get("coverage"))
    grids = as_dicts(view.get("grids"))
    if grids:
        parts = []
        for grid in grids:
            under, unhosted = _count(grid.get("under_replicated")), _count(grid.get("unhosted"))
            state = "[green]covered[/]" if not under and not unhosted else f"[yellow]{under} under-replicated, {unhosted} unhosted[/]"
            parts.append(f"{text(grid.get('prefix'))} {num(grid.get('hosted'), '{:.0f}')}/{num(grid.get('total'), '{:.0f}')} hosted "
                         f"×{num(grid.get('replicas_target'), '{:.0f}')} · {state}")
        age = finite(view.get("surveyed_age_s"))
        # placement re-surveys every few minutes: an older view says how old it is
        old = f" {duration(age)} old" if age is not None and age >= COVERAGE_FRESH_S else ""
        table.add_row(f"coverage{old}: " + "; ".join(parts))
    return table


def _count(value: object) -> int:
    """How many: the length of a list of uids (what the replica manager reports), or a number."""
    if isinstance(value, (list, tuple)):
        return len(value)
    number = finite(value)
    return int(number) if number is not None and number > 0 else 0


def _trainers(trainers: dict) -> str:
    """' · trainers: 2 (1 refused, 3 clipped, 1 rolled back)': who trains our experts, in the table's title."""
    rows = as_dict(trainers.get("trainers"))
    if not rows:
        return ""
    refused = sum(1 for t in rows.values() if (finite(as_dict(t).get("refused_for")) or 0) > 0)
    clipped = sum(int(finite(as_dict(t).get("clipped")) or 0) for t in rows.values())
    rolled = int(finite(trainers.get("rollbacks")) or 0)
    parts = [f"{refused} refused" if refused else "", f"{clipped} clipped" if clipped else "",
             f"{rolled} rolled back" if rolled else ""]
    detail = ", ".join(p for p in parts if p)
    return f" · trainers: {len(rows)}" + (f" ({detail})" if detail else "")


def _experts(experts: list[dict], rows: int, trainers: dict | None = None) -> Table:
    versions = any("version" in e for e in experts)
    synced = any("last_sync_age_s" in e for e in experts)
    header = ("uid", "req/s", "batch", "p50", "p95", "err") + (("ver",) if versions else ()) + (("synced",) if synced else ()) + ("last error",)
    shown = experts[:max(1, rows)]
    title = "Experts" + _trainers(trainers or {})
    if len(shown) < len(experts):  # said in the title: every row the terminal has shows an expert
        total = int(sum(finite(e.get("requests")) or 0 for e in experts))
        title += f" · +{len(experts) - len(shown)} more · {total} requests in all"
    table = section(title, header=header)
    for expert in shown:
        cells: list[RenderableType] = [Text(line(expert.get("uid") or "?")), num(expert.get("requests_per_s")), num(expert.get("mean_batch")),
                 num(expert.get("p50_ms"), "{:.1f}ms"), num(expert.get("p95_ms"), "{:.1f}ms"), num(expert.get("errors"), "{}")]
        if versions:
            cells.append(num(expert.get("version"), "{:.0f}"))
        if synced:
            age = expert.get("last_sync_age_s")
            cells.append("never" if age is None else f"{duration(age)} ago")
        table.add_row(*cells, Text(line(expert.get("last_error") or "")))
    if not experts:
        table.add_row("none hosted (DHT and relaying only)", *[""] * (len(header) - 2), "")
    return table


def _gpu(s: dict) -> str:
    gpu, compute = as_dict(s.get("gpu")), as_dict(s.get("compute"))
    if gpu.get("available"):
        memory = "memory n/a"
        used, total = finite(gpu.get("memory_used_mb")), finite(gpu.get("memory_total_mb"))
        if used is not None and total is not None:
            memory = f"{used:.0f} / {total:.0f} MiB"
        power = num(gpu.get("power_w"), "{:.0f}", "n/a")
        limit = finite(gpu.get("power_limit_w"))
        power = f"{power} / {limit:.0f} W" if limit is not None else f"{power} W"
        # the figures first: at 80 columns the board's name is what the ellipsis cuts
        return (f"GPU {num(gpu.get('utilization_pct'), '{:.0f}%', 'n/a')} · {memory} · "
                f"{num(gpu.get('temperature_c'), '{:.0f}°C', 'n/a')} · {power} · {text(gpu.get('name'), 'NVIDIA')}")
    if gpu.get("reason"):
        return f"GPU n/a ({text(gpu.get('reason'))})"
    # a daemon without the NVML reading: torch's figures, if any
    used, total = finite(compute.get("memory_used_mb")), finite(compute.get("memory_total_mb"))
    memory = f"{used:.0f} / {total:.0f} MiB" if used is not None and total is not None else "n/a"
    return f"utilisation {num(compute.get('utilization_pct'), '{:.0f}%', 'n/a')} · memory {memory}"


def _upload(s: dict) -> str:
    upload = as_dict(s.get("upload"))
    rate = finite(upload.get("rate_bps"))
    limit = finite(upload.get("limit_bps"))
    sent = f"{format_size(int(rate))}/s" if rate is not None else "–"
    cap = f"of {format_size(int(limit))}/s max ({100 * (rate or 0) / limit:.0f}%)" if limit else "(no --max-upload cap)"
    refusals = {scope: sum(int(finite(n) or 0) for n in as_dict(reasons).values()) for scope, reasons in as_dict(s.get("refusals")).items()}
    refused = ", ".join(f"{n} {text(scope)}" for scope, n in sorted(refusals.items()) if n)
    return f"upload {sent} {cap}" + (f" · refused {refused}" if refused else "")


def _checkpoints(s: dict) -> str:
    checkpoints = as_dict(s.get("checkpoints"))
    if not checkpoints:
        return "checkpoints: none (no experts hosted)"
    writable = "writable" if checkpoints.get("writable") else "[red]NOT writable[/]"
    age = finite(checkpoints.get("last_save_age_s"))
    saved = f"last saved {duration(age)} ago" if age is not None else "nothing saved yet"
    return f"checkpoints {text(checkpoints.get('dir'))} · {writable} · {saved}"


def _compute(s: dict, compact: bool) -> Table:
    table = section("Compute", 1)
    table.add_row(f"{text(as_dict(s.get('compute')).get('device'))} · {_gpu(s)}")
    if compact:
        table.add_row(f"{_upload(s)} · {_checkpoints(s)}")
    else:
        table.add_row(_upload(s))
        table.add_row(_checkpoints(s))
    if s.get("log_file"):  # the event log join keeps in the state dir
        table.add_row(f"event log {text(s.get('log_file'))}")
    return table


def _given_row(label: str, figures: dict) -> str:
    return (f"{label} {num(figures.get('requests'), '{:,.0f}', '0')} req · {num(figures.get('samples'), '{:,.0f}', '0')} samples · "
            f"{duration(figures.get('compute_s') or 0)} compute · {format_size(int(finite(figures.get('bytes_sent')) or 0))} sent · "
            f"{num(figures.get('trainers'), '{:.0f}', '0')} trainers")


def _given(s: dict, compact: bool) -> Table:
    given = as_dict(s.get("contributions"))
    session, total = as_dict(given.get("session")), as_dict(given.get("total"))
    if compact:  # one row: each figure as "this session / in all"
        table = section("Given (this session / in all)", 1)
        count = lambda figures, key: num(figures.get(key), "{:,.0f}", "0")  # noqa: E731
        size = lambda figures: format_size(int(finite(figures.get("bytes_sent")) or 0))  # noqa: E731
        table.add_row(
            f"{count(session, 'requests')} / {count(total, 'requests')} req · {count(session, 'samples')} / "
            f"{count(total, 'samples')} samples · {duration(session.get('compute_s') or 0)} / {duration(total.get('compute_s') or 0)} "
            f"compute · {size(session)} / {size(total)} sent · {count(session, 'trainers')} / {count(total, 'trainers')} trainers"
        )
        return table
    since = finite(given.get("since"))
    kept = time.strftime(" (kept since %Y-%m-%d)", time.localtime(since)) if since is not None and 0 <= since < 1e11 else ""
    table = section("Given" + kept, 1)
    table.add_row(_given_row("session", session))
    table.add_row(_given_row("total", total))
    return table


def _log(entries: list[dict], rows: int) -> Table:
    entries = entries[-max(1, rows):]
    table = section("Log", 1)
    for entry in entries:
        stamp = finite(entry.get("time"))
        when = time.strftime("%H:%M:%S", time.localtime(stamp)) if stamp is not None and 0 <= stamp < 1e11 else "--:--:--"
        level = line(entry.get("level") or "?")
        color = "red" if level in ("ERROR", "CRITICAL") else "yellow"
        prefix = Text(f"{when} ") + Text(level[:4], style=color) + Text(" ")
        table.add_row(prefix + Text(line(entry.get("message") or "")))
    if not entries:
        table.add_row("no warnings")
    return table


def _lines(table: Table) -> int:
    """Lines a section takes: its title, header and rule, and one line per row (rows never wrap)."""
    return (PLAIN_OVERHEAD if not table.show_header else LIST_OVERHEAD) + table.row_count


def allocate(available: int, demands: list[int]) -> list[int]:
    """Rows for each list, in priority order: one each at least, then as many as each has items
    (a list showing all its items needs no "+N more" row), the first lists first."""
    rows = [1] * len(demands)
    spare = max(0, available - len(demands))
    for index, demand in enumerate(demands):
        extra = min(spare, max(0, demand - 1))
        rows[index] += extra
        spare -= extra
    return rows


def _log_entries(s: dict) -> list[dict]:
    warnings = [{"level": "WARN", "message": f"coverage: {w}"} for w in as_dict(s.get("coverage")).get("warnings") or []
                if isinstance(w, str)]
    return [*as_dicts(s.get("log")), *warnings[:20]]


def render_dashboard(snapshot: dict, *, width: int | None = None, height: int = 24) -> RenderableType:
    """The dashboard for a snapshot, filling ``height`` lines: the fixed sections first, then the
    lists (experts, connections, log) get the rest, experts first (two columns from 140 wide)."""
    s = as_dict(snapshot)
    compact = height < COMPACT_BELOW
    conns = as_dicts(s.get("connections"))
    conns.sort(key=lambda c: -((finite(c.get("bytes_in")) or 0) + (finite(c.get("bytes_out")) or 0)))
    experts = as_dicts(s.get("experts"))
    experts.sort(key=lambda e: (-(finite(e.get("requests_per_s")) or 0), str(e.get("uid") or "")))
    entries = _log_entries(s)
    fixed = [_identity(s, compact), _reachability(s), _dht(s), _compute(s, compact), _given(s, compact)]
    fixed_lines = sum(_lines(t) for t in fixed)
    if width is not None and width >= TWO_COLUMNS_FROM:
        # fixed sections left, the lists right, the log across the whole width below them (its
        # lines are the longest: a column would cut them)
        log_wanted = min(max(1, len(entries)), LOG_ROWS_WIDE)
        expert_rows, conn_rows = allocate(height - 2 * LIST_OVERHEAD - PLAIN_OVERHEAD - log_wanted, [len(experts), len(conns)])
        lists = (_connections(conns, conn_rows), _experts(experts, expert_rows, as_dict(s.get("trainers"))))
        right = Group(*lists)
        top_lines = max(fixed_lines, sum(_lines(t) for t in lists))
        (log_rows,) = allocate(height - top_lines - PLAIN_OVERHEAD, [len(entries)])
        grid = Table.grid(expand=True, padding=(0, 2))
        grid.add_column(ratio=1)
        grid.add_column(ratio=1)
        grid.add_row(Group(*fixed), right)
        return Group(grid, _log(entries, log_rows))
    available = height - fixed_lines - 2 * LIST_OVERHEAD - PLAIN_OVERHEAD
    expert_rows, conn_rows, log_rows = allocate(available, [len(experts), len(conns), len(entries)])
    identity, reachability, dht, compute, given = fixed
    return Group(identity, reachability, _connections(conns, conn_rows), dht, _experts(experts, expert_rows, as_dict(s.get("trainers"))),
                 compute, given, _log(entries, log_rows))


def summary_line(snapshot: dict) -> str:
    """The one line ``--no-dashboard`` logs every SUMMARY_PERIOD: state, reachability, peers by
    role, experts' load and what was given this session."""
    s = as_dict(snapshot)
    roles: dict[str, int] = {}
    for conn in as_dicts(s.get("connections")):
        role = line(conn.get("role") or "peer")
        roles[role] = roles.get(role, 0) + 1
    peers = ", ".join(f"{n} {role}" for role, n in sorted(roles.items())) or "none"
    experts = as_dicts(s.get("experts"))
    rate = sum(finite(e.get("requests_per_s")) or 0 for e in experts)
    session = as_dict(as_dict(s.get("contributions")).get("session"))
    warnings = len(as_dicts(s.get("log")))
    return line(
        f"{line(s.get('state_text') or ('paused' if s.get('paused') else 'running'))} · up {duration(s.get('uptime_s'))} · "
        f"{as_dict(s.get('reachability')).get('status') or 'unknown'} · peers: {peers} · "
        f"{len(experts)} experts {rate:.1f} req/s · given this session: {num(session.get('requests'), '{:.0f}', '0')} requests, "
        f"{format_size(int(finite(session.get('bytes_sent')) or 0))} sent, {num(session.get('trainers'), '{:.0f}', '0')} trainers · "
        f"{warnings} recent warnings"
    )


async def log_summaries(get_snapshot: Callable[[], dict], write: Callable[[str], None] | None = None, *,
                        period: float = SUMMARY_PERIOD) -> None:
    """Write ``summary_line`` every ``period`` seconds (trio's clock) until cancelled: what
    ``volunteer join --no-dashboard`` (systemd's journal) shows after the banner."""
    out = write or (lambda message: print(message, flush=True))
    while True:
        await trio.sleep(period)
        try:
            out(summary_line(get_snapshot()))
        except Exception as exc:  # a summary must not take the daemon down
            out(f"status summary failed: {exc!r}")


def render_text(snapshot: dict, width: int = 80, height: int = 24) -> str:
    """The dashboard as plain text (no colours), for tests and ``volunteer status`` in a pipe."""
    out = io.StringIO()
    console = Console(file=out, width=width, height=height, color_system=None, force_terminal=False,
                      legacy_windows=False, record=False)
    console.print(render_dashboard(snapshot, width=width, height=height))
    return out.getvalue()


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


@contextmanager
def logging_through(console: Console) -> Iterator[None]:
    """While the live view runs, nothing writes to the terminal underneath it: the root logger's
    terminal handlers (``logging.basicConfig``'s stderr one) come off; warnings and errors reach
    the user once, in the Log panel (the daemon's LogBuffer), and the info and debug lines of
    ``-v`` print through rich on the live console, above the view. Restored on exit."""
    from rich.logging import RichHandler

    root = logging.getLogger()
    streams = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    terminal = [h for h in root.handlers if type(h) is logging.StreamHandler
                and (h.stream in streams or getattr(h.stream, "name", None) in ("<stderr>", "<stdout>"))]
    for handler in terminal:
        root.removeHandler(handler)
    chatty = RichHandler(console=console, show_path=False, rich_tracebacks=False)
    chatty.addFilter(_BelowWarning())  # WARNING and up: the Log panel shows them, once
    for handler in terminal:  # what those handlers let through, chatty does too (the event log lowers the root's level)
        for kept in handler.filters:
            chatty.addFilter(kept)
    root.addHandler(chatty)
    try:
        yield
    finally:
        root.removeHandler(chatty)
        for handler in terminal:
            root.addHandler(handler)


class LiveDashboard:
    """Redraws the dashboard about twice a second until cancelled, on the terminal's alternate
    screen: every frame is drawn whole at the terminal's current size, so a resize or a line
    printed meanwhile leaves nothing stale behind (the screen comes back as it was on exit)."""

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

        with logging_through(console), Live(view(), console=console, auto_refresh=False, screen=True,
                                            transient=False, redirect_stdout=True, redirect_stderr=True) as live:
            task_status.started()
            while True:
                await trio.sleep(period)
                live.update(view(), refresh=True)


__all__ = ["LiveDashboard", "SECTIONS", "render_dashboard", "render_text"]
