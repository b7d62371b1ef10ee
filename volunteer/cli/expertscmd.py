"""``volunteer experts SWARM``: the trainer's view of which experts are alive, and where (asked
of the swarm as its kind says: ``SwarmKind.list_experts``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

import trio

from ..kinds import ExpertListing, kind_of
from ..swarmfile import resolve_swarm
from .netcmds import swarm_id_arg

if TYPE_CHECKING:
    from rich.table import Table

    from ..replicas.coverage import Coverage

DASH = "–"  # what a kind does not declare (hivemind: addresses, load, heartbeat)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experts", help="list the live experts of a swarm: where, load, heartbeat age",
        description="Ask the swarm's DHT which experts are alive now (as a trainer would), with each "
        "host's peer ID, how it is reached (direct or through a relay), its load and heartbeat age.",
        epilog="examples:\n  volunteer experts demo\n  volunteer experts ./swarm.toml --prefix ffn. --json\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("swarm", metavar="SWARM", help="swarm name, swarm file, or bootstrap multiaddr")
    p.add_argument("--prefix", default=None, help="grid prefix (default: every [[grid]] of the swarm file, else expert.)")
    p.add_argument("--swarm-id", type=swarm_id_arg, help="swarm id when SWARM is a bare multiaddr")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_experts)


def run_experts(args: argparse.Namespace) -> int:
    spec = resolve_swarm(args.swarm, swarm_id=args.swarm_id)
    prefixes = [args.prefix] if args.prefix else [f"{g.prefix}." for g in spec.grids] or ["expert."]
    listing = trio.run(kind_of(spec).list_experts, spec, prefixes)
    if listing.incomplete is not None:
        print(f"listing incomplete: {listing.incomplete}", file=sys.stderr)
    if spec.receipts and spec.kind == "volunteer" and listing.rows:  # only swarms of exact audits have proofs
        listing = with_verdicts(listing, trio.run(check_verdicts, spec, sorted({r["peer_id"] for r in listing.rows})))
    if args.json:
        print(json.dumps(listing.rows, indent=2))
        return 0
    from rich.console import Console

    console = Console()
    if listing.coverage is not None:
        print_coverage(console, listing.coverage)
    if not listing.rows:
        print(f"no live experts under {', '.join(map(repr, prefixes))} in {listing.title}")
        return 0
    console.print(experts_table(listing))
    print_verdicts(console, listing.rows)
    return 0


def experts_table(listing: ExpertListing) -> "Table":
    """The listing as a table of its kind's columns; "–" where a kind declares nothing."""
    from rich.table import Table

    from ..widgets import duration, short

    def cell(row: dict, column: str) -> str:
        if column == "uid":
            return row["uid"]
        if column == "host":
            return short(row["peer_id"])
        if column == "reached":
            return _shown(row.get("reached"))
        if column == "load":
            return _shown(row.get("load"), "{:.1f}")
        if column == "version":
            return _shown(row.get("version"))
        if column == "claim":
            return _shown(row.get("claim"))
        if column == "verdict":
            return _shown(row.get("verdict"))
        if column == "heartbeat":
            age = row.get("heartbeat_age_s")
            return DASH if age is None else f"{duration(age)} ago"
        if column == "expires":
            return f"in {duration(row['expires_in_s'])}"
        raise ValueError(f"unknown column {column!r}")

    table = Table(title=f"{len({r['uid'] for r in listing.rows})} live experts in {listing.title}")
    for column in listing.columns:
        table.add_column(column)
    for row in listing.rows:
        table.add_row(*(cell(row, column) for column in listing.columns))
    return table


VERDICT_TIMEOUT = 60.0  # seconds ``volunteer experts`` gives the swarm's proofs (lookups and recomputes)


async def check_verdicts(spec, peers: list[str]) -> dict:
    """The swarm's shared verdicts as this command checks them now, by recompute
    (``experts.verdicts``): the index and the keys of ``peers`` read, each accusation checked.
    Returns the book's report (``excluded``, ``unproven``, ``refused``, ``checks``)."""
    from functools import partial

    from ..dht import DHTConfig
    from ..dht.node import open_dht
    from ..experts.client import call_expert
    from ..experts.verdicts import VerdictWatch, snapshot_fetcher
    from ..net.identity import KeyPair
    from ..net.stack import open_stack

    async with open_stack(KeyPair.generate()) as host:
        async with open_dht(host, DHTConfig.for_trainer(spec.id), bootstrap=spec.entry_points, client_mode=True) as dht:
            watch = VerdictWatch(dht, host.keypair, spec.id, snapshot_fetcher(partial(call_expert, host, swarm_id=spec.id)),
                                 peers=lambda: peers)
            with trio.move_on_after(VERDICT_TIMEOUT):
                await watch.read()
            return watch.book.report()


def with_verdicts(listing: ExpertListing, report: dict) -> ExpertListing:
    """``listing`` with each row's ``verdict``: ``excluded`` (a published proof checked out here:
    its row also says by whom and why), ``accused`` (an accusation that did not check out: it
    changes nothing), or None; and a ``verdict`` column."""
    from dataclasses import replace

    rows = []
    for row in listing.rows:
        peer = row["peer_id"]
        proof = report["excluded"].get(peer)
        verdict = "excluded" if proof is not None else "accused" if peer in report["unproven"] else None
        rows.append({**row, "verdict": verdict, "verdict_reason": proof["reason"] if proof else report["unproven"].get(peer)})
    return replace(listing, rows=rows, columns=(*listing.columns, "verdict"))


def print_verdicts(console, rows: list[dict]) -> None:
    """One line per host a verdict names: excluded on a checked proof (why), or accused without one."""
    from rich.markup import escape

    seen: dict[str, dict] = {}
    for row in rows:
        if row.get("verdict") is not None:
            seen.setdefault(row["peer_id"], row)
    for peer, row in sorted(seen.items()):
        if row["verdict"] == "excluded":
            console.print(f"[red]excluded[/] {peer}: {escape(str(row['verdict_reason']))}", markup=True, highlight=False)
        else:
            console.print(f"[yellow]accused, not proven[/] {peer}: {escape(str(row['verdict_reason']))} (changes nothing)",
                          markup=True, highlight=False)


def _shown(value, fmt: str = "{}") -> str:
    return DASH if value is None else fmt.format(value)


def print_coverage(console, view: Coverage) -> None:
    """One line per grid: experts hosted of the grid, replicas target, under-replicated, unhosted."""
    from rich.table import Table

    table = Table(title="coverage of the swarm's grids")
    for column in ("grid", "hosted", "replicas", "under-replicated", "no host"):
        table.add_column(column)
    for g in view["grids"]:
        size = "x".join(map(str, g["size"]))
        table.add_row(f"{g['prefix']} [{size}]", f"{g['hosted']}/{g['total']}", str(g["replicas_target"]),
                      str(len(g["under_replicated"])), ", ".join(g["unhosted"][:6]) + (" …" if len(g["unhosted"]) > 6 else ""))
    console.print(table)
    for warning in view["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")
