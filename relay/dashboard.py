"""The relay's live status view (rich), the same style as the volunteer dashboard."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from volunteer.net.perf import format_size

from .metrics import snapshot
from .node import RelayNode


def render(node: RelayNode, uptime: float) -> Group:
    figures = snapshot(node.hop)
    header = Table.grid(padding=(0, 2))
    header.add_row("relay", str(node.host.peer_id))
    for addr in node.host.full_addrs()[:4]:
        header.add_row("address", str(addr))
    if node.metrics_addr:
        header.add_row("metrics", f"http://{node.metrics_addr[0]}:{node.metrics_addr[1]}/metrics")
    header.add_row("uptime", f"{int(uptime) // 3600}h {int(uptime) % 3600 // 60:02d}m {int(uptime) % 60:02d}s")

    counts = Table.grid(padding=(0, 2))
    counts.add_row("reservations", str(figures["reservations"]), "connections", str(figures["connections"]))
    counts.add_row("circuits open", str(figures["circuits"]), "circuits total", str(figures["circuits_total"]))
    counts.add_row("bytes relayed", format_size(figures["bytes_relayed"]), "", "")

    circuits = Table("source", "target", "up", "down", expand=True, box=None)
    for source, target, (up, down) in list(node.hop.active.values())[:8]:
        circuits.add_row(source.short(), target.short(), format_size(up), format_size(down))

    refusals = Table("refusal", "count", box=None)
    for reason, count in sorted(figures["refusals"].items(), key=lambda item: -item[1])[:6]:
        refusals.add_row(reason, str(count))

    return Group(
        Panel(header, title="volunteer relay", border_style="cyan"),
        Panel(counts, title="load"),
        Panel(circuits, title="circuits"),
        Panel(refusals, title="refusals by reason"),
    )
