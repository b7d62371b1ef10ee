"""The relay's live status view: the volunteer dashboard's style (borderless titled sections, ids
cut with an ellipsis, rows budgeted from the terminal height), so it fits 80x24 too."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape

from volunteer.widgets import duration, fit, format_size, section, short

from .metrics import snapshot
from .node import RelayNode


def render(relay_server: RelayNode, uptime_s: float, *, height: int = 24) -> Group:
    """The relay's view for a terminal of ``height`` lines."""
    figures = snapshot(relay_server.hop)
    extra = max(0, height - 24)  # rows beyond the 80x24 budget go to the lists
    addr_rows, circuit_rows, refusal_rows = 2 + extra // 4, 4 + extra // 2, 2 + extra // 4

    relay = section("Relay")
    relay.add_row(f"[green]serving[/] · up {duration(uptime_s)}")
    relay.add_row(f"peer {relay_server.host.peer_id}")
    addrs = relay_server.host.full_addrs()
    for addr in addrs[:addr_rows]:
        relay.add_row(escape(str(addr)))
    if len(addrs) > addr_rows:
        relay.add_row(f"+{len(addrs) - addr_rows} more addresses")
    if relay_server.metrics_addr:
        relay.add_row(f"metrics http://{relay_server.metrics_addr[0]}:{relay_server.metrics_addr[1]}/metrics")

    load = section("Load")
    swarms = ", ".join(escape(s) for s in relay_server.dhts) or "none"
    load.add_row(
        f"{figures['reservations']} reservations · {figures['connections']} connections · "
        f"DHT for {swarms}"
    )
    load.add_row(
        f"{figures['circuits']} circuits open · {figures['circuits_total']} in all · "
        f"{format_size(figures['bytes_relayed'])} relayed"
    )

    circuits = section("Circuits", header=("source", "target", "up", "down"))
    active = list(relay_server.hop.active.values())
    shown = fit(active, circuit_rows)
    for source, target, (up, down) in shown:
        circuits.add_row(short(source), short(target), format_size(up), format_size(down))
    if len(shown) < len(active):
        circuits.add_row(f"+{len(active) - len(shown)} more", "", "", "")
    if not active:
        circuits.add_row("no circuits", "", "", "")

    refusals = section("Refusals", header=("reason", "count"))
    by_count = sorted(figures["refusals"].items(), key=lambda item: -item[1])
    for reason, count in by_count[:refusal_rows]:
        refusals.add_row(escape(str(reason)), str(count))
    if not by_count:
        refusals.add_row("none", "")

    return Group(relay, load, circuits, refusals)
