"""``volunteer experts`` and ``volunteer doctor`` on a hivemind swarm (``kind = "hivemind"``):
the commands hand such a swarm here, and the same output comes back, with "–" (JSON: null) where
hivemind declares nothing (addresses, load, heartbeat)."""

from __future__ import annotations

import argparse
import json
import sys

import trio

from ..errors import VolunteerError, describe
from ..hivemind import HivemindDHT
from ..hivemind.kad import KadPeerRouting
from ..hivemind.listing import Listing, walk_hivemind_grid
from ..net.stack import open_stack
from ..widgets import duration, short
from ..net.identity import KeyPair
from ..net.multiaddr import Multiaddr
from ..node import JoinError
from .doctor import CHECK_TIMEOUT, Check, diagnose, report

LOOKUP_TIMEOUT = 60.0
DASH = "–"


def _shown(value, fmt: str = "{}") -> str:
    return DASH if value is None else fmt.format(value)


async def fetch_hivemind_listing(spec, prefix: str) -> Listing:
    """The grid under ``prefix`` in a hivemind swarm, walked through a client-mode DHT joined via
    its bootstrap (at most ``LOOKUP_TIMEOUT`` seconds: past it, what was found)."""
    if not spec.bootstrap:
        raise JoinError(f"hivemind swarm {spec.name!r} lists no initial peers (bootstrap)")
    dht = HivemindDHT(client_mode=True)
    async with open_stack(KeyPair.generate(), services=[dht, KadPeerRouting()]):
        if not await dht.bootstrap(list(spec.bootstrap)):
            raise JoinError(f"cannot reach hivemind swarm {spec.name!r}: no initial peer answered a hivemind DHT ping")
        return await walk_hivemind_grid(dht, prefix, timeout=LOOKUP_TIMEOUT)


async def fetch_hivemind_rows(spec, prefix: str) -> list[dict]:
    """Rows of ``volunteer experts`` for a hivemind swarm."""
    return (await fetch_hivemind_listing(spec, prefix)).rows


def run_hivemind_experts(args: argparse.Namespace, spec) -> int:
    """``volunteer experts`` on a hivemind swarm."""
    listing = trio.run(fetch_hivemind_listing, spec, args.prefix)
    rows = listing.rows
    if listing.cut is not None:
        print(f"listing incomplete: {listing.cut}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no live experts under {args.prefix!r} in hivemind swarm {spec.name!r}")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len({r['uid'] for r in rows})} live experts in hivemind swarm {spec.name!r}")
    for column in ("uid", "host", "reached", "load", "heartbeat", "expires"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["uid"], short(row["peer_id"]), _shown(row["reached"]), _shown(row["load"], "{:.1f}"),
            DASH if row["heartbeat_age_s"] is None else f"{duration(row['heartbeat_age_s'])} ago",
            f"in {duration(row['expires_in_s'])}",
        )
    Console().print(table)
    return 0


async def hivemind_checks(peers: list[Multiaddr]) -> list[Check]:
    """Whether each initial peer answers hivemind's DHT ping and a kad PING."""
    checks: list[Check] = []
    dht, kad = HivemindDHT(client_mode=True), KadPeerRouting()
    async with open_stack(KeyPair.generate(), services=[dht, kad]) as host:
        for addr in peers:
            name = f"hivemind {addr.peer_id.short() if addr.peer_id else addr}"[:22]
            try:
                with trio.fail_after(CHECK_TIMEOUT):
                    conn = await host.connect(addr)
                    node_id = await dht.ping(conn.remote_peer)
                    kad_ok = await kad.ping(conn.remote_peer)
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                checks.append(Check("FAIL", name, describe(exc), "check the address of this initial peer"))
                continue
            if node_id is None:
                checks.append(Check("FAIL", name, "no answer to hivemind's DHT ping",
                                    "is it a hivemind 1.1 peer? initial peers must not run in client mode"))
            else:
                kad_text = "kad peer routing answers" if kad_ok else "no kad peer routing (peers named by id only are unreachable through it)"
                checks.append(Check("OK" if kad_ok else "WARN", name, f"DHT node {node_id:040x}"[:32] + f"…; {kad_text}",
                                    "run its p2pd with the DHT in server mode"))
    return checks


def run_hivemind_doctor(args: argparse.Namespace, spec) -> int:
    """``volunteer doctor`` on a hivemind swarm: the netcheck (no perf: p2pd does not serve it),
    then whether each initial peer speaks hivemind's DHT and kad."""
    from .netcmds import load_identity

    peers = list(spec.bootstrap)
    if not peers:
        raise VolunteerError(f"hivemind swarm {spec.name!r} lists no initial peers to check")

    async def both() -> list[Check]:
        checks = await diagnose(load_identity(args), Multiaddr(args.listen), peers, 0)
        return checks + await hivemind_checks(peers)

    return report(trio.run(both), as_json=args.json)


__all__ = ["fetch_hivemind_listing", "fetch_hivemind_rows", "hivemind_checks", "run_hivemind_doctor", "run_hivemind_experts"]
