"""``volunteer experts SWARM``: the trainer's view of which experts are alive, and where."""

from __future__ import annotations

import argparse
import json
import time

import trio

from ..dht import DHTConfig
from ..dht.grid import list_experts
from ..dht.node import open_dht
from ..net.stack import open_stack
from ..net.identity import KeyPair
from ..net.multiaddr import Multiaddr
from ..swarmfile import resolve_swarm
from ..node import JoinError

LOOKUP_TIMEOUT = 30.0


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
    p.add_argument("--swarm-id", help="swarm id when SWARM is a bare multiaddr")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_experts)


def run_experts(args: argparse.Namespace) -> int:
    spec = resolve_swarm(args.swarm, swarm_id=args.swarm_id)
    if spec.kind == "hivemind":
        from .hivemindcmd import run_hivemind_experts

        return run_hivemind_experts(args, spec)
    prefixes = [args.prefix] if args.prefix else [f"{g.prefix}." for g in spec.grids] or ["expert."]
    rows = trio.run(fetch_rows, spec, prefixes)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    from ..widgets import duration, short

    console = Console()
    if spec.grids:
        print_coverage(console, spec.grids, rows)
    if not rows:
        print(f"no live experts under {', '.join(map(repr, prefixes))} in swarm {spec.name!r}")
        return 0
    table = Table(title=f"{len({r['uid'] for r in rows})} live experts in {spec.name!r}")
    for column in ("uid", "host", "reached", "load", "version", "heartbeat"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["uid"], short(row["peer_id"]), row["reached"], f"{row['load']:.1f}", str(row["version"]),
                      f"{duration(row['heartbeat_age_s'])} ago")
    console.print(table)
    return 0


def coverage_of(grids, rows: list[dict]) -> dict:
    """The swarm's coverage of its declared grids, from the flat rows (one per expert and host)."""
    from ..replicas.coverage import coverage

    hosts: dict[str, dict[str, int]] = {}
    for row in rows:
        hosts.setdefault(row["uid"], {})[row["peer_id"]] = row["version"]
    return coverage(grids, hosts)


def print_coverage(console, grids, rows: list[dict]) -> None:
    """One line per grid: experts hosted of the grid, replicas target, under-replicated, unhosted."""
    from rich.table import Table

    view = coverage_of(grids, rows)
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


async def fetch_rows(spec, prefixes: str | list[str]) -> list[dict]:
    """One row per (expert, host), best host first, for every grid prefix given. ``version`` is
    the host's declared count of updates; ``last_sync_age_s`` the seconds since that host's replicas
    last averaged (null: never), as its latest heartbeat declared it."""
    if isinstance(prefixes, str):
        prefixes = [prefixes]
    if not spec.entry_points:
        raise JoinError(f"swarm {spec.name!r} lists no bootstrap peers or relays")
    async with open_stack(KeyPair.generate()) as host:
        async with open_dht(host, DHTConfig(swarm_id=spec.id), bootstrap=spec.entry_points, client_mode=True) as dht:
            if len(dht.state.table) == 0:
                raise JoinError(f"cannot reach swarm {spec.name!r}: no bootstrap peer answered")
            found = {}
            with trio.fail_after(LOOKUP_TIMEOUT):
                for prefix in prefixes:
                    found.update(await list_experts(dht, prefix))
    now = time.time()
    rows = []
    for uid, hosts in found.items():
        for decl in hosts:
            addrs = [Multiaddr(a) for a in decl.addrs]
            direct = [a for a in addrs if not a.is_relayed()]
            rows.append(
                {
                    "uid": uid,
                    "peer_id": str(decl.peer),
                    "reached": "direct" if direct else ("relayed" if addrs else "unknown"),
                    "addrs": [str(a) for a in addrs],
                    "load": decl.load,
                    "heartbeat_age_s": round(now - decl.heartbeat, 1),
                    "expires_in_s": round(decl.expiration - now, 1),
                    "version": int(getattr(decl, "version", 0) or 0),
                    # the age declared at the heartbeat, plus the heartbeat's own age
                    "last_sync_age_s": None if decl.synced_age is None else round(decl.synced_age + max(0.0, now - decl.heartbeat), 1),
                }
            )
    return rows
