"""``volunteer experts SWARM``: the trainer's view of which experts are alive, and where."""

from __future__ import annotations

import argparse
import json
import time

import trio

from ..dht import DHTConfig
from ..dht.grid import list_experts
from ..dht.node import open_dht
from ..net.host import open_host
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
    p.add_argument("--prefix", default="expert.", help="grid prefix (default expert.)")
    p.add_argument("--swarm-id", help="swarm id when SWARM is a bare multiaddr")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_experts)


def run_experts(args: argparse.Namespace) -> int:
    spec = resolve_swarm(args.swarm, swarm_id=args.swarm_id)
    if spec.kind == "hivemind":
        from .hivemindcmd import run_hivemind_experts

        return run_hivemind_experts(args, spec)
    rows = trio.run(fetch_rows, spec, args.prefix)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no live experts under {args.prefix!r} in swarm {spec.name!r}")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len({r['uid'] for r in rows})} live experts in {spec.name!r}")
    for column in ("uid", "host", "reached", "load", "heartbeat"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["uid"], row["peer_id"][-10:], row["reached"], f"{row['load']:.1f}", f"{row['heartbeat_age_s']:.1f} s ago")
    Console().print(table)
    return 0


async def fetch_rows(spec, prefix: str) -> list[dict]:
    """One row per (expert, host), best host first."""
    if not spec.entry_points:
        raise JoinError(f"swarm {spec.name!r} lists no bootstrap peers or relays")
    async with open_host(KeyPair.generate()) as host:
        async with open_dht(host, DHTConfig(swarm_id=spec.id), bootstrap=spec.entry_points, client_mode=True) as dht:
            if len(dht.state.table) == 0:
                raise JoinError(f"cannot reach swarm {spec.name!r}: no bootstrap peer answered")
            with trio.fail_after(LOOKUP_TIMEOUT):
                found = await list_experts(dht, prefix)
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
                }
            )
    return rows
