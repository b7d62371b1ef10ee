"""``volunteer doctor``: a netcheck. Can we reach the swarm's relays, are we public, can we punch?

Each check prints one line, OK / WARN / FAIL, with what to do about it. The swarm is a name or
swarm file (the peers its kind says to check: ours, its relays and bootstrap peers; hivemind's,
its initial peers, then whether they speak hivemind's DHT and kad) or the peers' multiaddrs.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

import trio

from ..errors import VolunteerError, describe
from ..kinds import Check, SwarmKind, kind_of
from ..net.stack import open_stack
from ..net.multiaddr import Multiaddr
from ..net.nat.autonat import Reachability
from ..net.nat.manager import NatManager
from ..net.nat.observed import MappingType
from ..net.nat.relay_client import reserve
from ..net.perf import PERF, format_size, parse_size, perf_stream
from .netcmds import add_identity_flag, load_identity

CHECK_TIMEOUT = 15.0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check connectivity: relays, reachability, NAT type, hole punching, throughput",
        description=(
            "A netcheck for volunteers: reach each relay / bootstrap peer and time it, ask them whether "
            "this machine is reachable from outside (AutoNAT), tell the NAT mapping type (can hole "
            "punching work?), try a relay reservation, and measure throughput to each relay with the "
            "perf protocol. Each line is OK, WARN or FAIL, with what to do about it."
        ),
        epilog=(
            "examples:\n"
            "  volunteer doctor demo                      # the relays and bootstrap peers of swarm 'demo'\n"
            "  volunteer doctor /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW... /ip4/198.51.100.9/tcp/4001/p2p/12D3KooW...\n"
            "  volunteer doctor --listen /ip4/0.0.0.0/tcp/4001 --perf-size 16MiB --json RELAY_MULTIADDR\n"
            "exit status: 0 when nothing FAILed, 1 otherwise"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("peers", nargs="+", metavar="SWARM_OR_MULTIADDR",
                   help="a swarm (name or swarm file: its relays and bootstrap peers are checked), or multiaddrs")
    p.add_argument("--listen", default="/ip4/0.0.0.0/tcp/0", metavar="MULTIADDR",
                   help="listen address to test (default: any port); use your daemon's port to test it exactly")
    p.add_argument("--perf-size", default="4MiB", metavar="SIZE", help="bytes each way for the throughput check (0 to skip)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    add_identity_flag(p)
    p.set_defaults(run=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    peers: list[Multiaddr] = []
    perf = True  # every peer serves perf, unless a swarm's kind says its peers do not
    kinds: list[tuple[SwarmKind, list[Multiaddr]]] = []  # each swarm's kind, for its own checks
    for text in args.peers:
        if text.startswith("/") and not text.endswith(".toml"):
            peers.append(Multiaddr(text))
        else:
            from ..swarmfile import resolve_swarm

            spec = resolve_swarm(text)
            kind = kind_of(spec)
            plan = kind.doctor_plan(spec)
            perf = perf and plan.perf
            kinds.append((kind, plan.peers))
            peers.extend(a for a in plan.peers if a not in peers)
    try:
        perf_size = parse_size(args.perf_size) if perf else 0
    except ValueError as exc:
        raise VolunteerError(str(exc)) from None

    async def all_checks() -> list[Check]:
        checks = await diagnose(load_identity(args), Multiaddr(args.listen), peers, perf_size)
        for kind, its_peers in kinds:
            checks += await kind.check_peers(its_peers)
        return checks

    return report(trio.run(all_checks), as_json=args.json)


def report(checks: list["Check"], *, as_json: bool) -> int:
    """Print the checks (a table with fixes, or JSON); the exit status: 1 if any failed."""
    if as_json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for check in checks:
            line = f"{check.status:<5} {check.name:<22} {check.detail}"
            print(line + (f"\n{'':28}→ {check.fix}" if check.fix and check.status != "OK" else ""))
    return 1 if any(c.status == "FAIL" for c in checks) else 0


async def diagnose(keypair, listen: Multiaddr, peers: list[Multiaddr], perf_size: int) -> list[Check]:
    checks: list[Check] = []
    async with open_stack(keypair, [listen]) as host:
        checks.append(Check("OK", "identity", str(host.peer_id)))
        checks.append(Check("OK", "listening", ", ".join(str(a) for a in host.listen_addrs)))
        reached = []
        for addr in peers:
            try:
                with trio.fail_after(CHECK_TIMEOUT):
                    conn = await host.connect(addr)
                    rtt = await (await host.open_pinger(conn.remote_peer)).ping()
                    await host.identify(conn.remote_peer)
                reached.append(addr)
                checks.append(Check("OK", f"reach {conn.remote_peer.short()}", f"rtt {rtt * 1000:.1f} ms via {conn.describe_path()}"))
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                checks.append(Check("FAIL", f"reach {addr}"[:22], describe(exc),
                                    "check the address, and that your firewall allows outgoing TCP"))
        if not reached:
            checks.append(Check("FAIL", "swarm", "no relay or bootstrap peer answered", "check your internet connection"))
            return checks

        manager = NatManager(host, reached)
        with trio.move_on_after(CHECK_TIMEOUT):
            await manager.probe_round()
        reachability = manager.reachability
        if reachability is Reachability.PUBLIC:
            checks.append(Check("OK", "reachability", f"public: {manager.tracker.confirmed_addr} takes incoming connections"))
        elif reachability is Reachability.PRIVATE:
            checks.append(Check("WARN", "reachability", "private: peers cannot dial this machine directly",
                                "fine: you will be reachable through relays and hole punching; forwarding the listen port makes you public"))
        else:
            detail = "; ".join(r.text for r in manager.last_results if r.text) or manager.last_error or "no verdict"
            checks.append(Check("WARN", "reachability", f"unknown ({detail})", "ask a relay operator whether AutoNAT is served"))

        mapping = manager.mapping()
        observed = ", ".join(str(a) for a in manager.our_addrs()[:2])
        if mapping is MappingType.ENDPOINT_INDEPENDENT:
            checks.append(Check("OK", "NAT mapping", f"endpoint-independent ({observed}): hole punching can work"))
        elif mapping is MappingType.ENDPOINT_DEPENDENT:
            checks.append(Check("WARN", "NAT mapping", f"symmetric ({observed}): hole punching will fail",
                                "traffic will stay on relays; a router setting (full-cone/EIM NAT, UPnP) or a forwarded port helps"))
        else:
            checks.append(Check("WARN", "NAT mapping", f"unknown: needs two peers to compare ({observed or 'no observation'})",
                                "give doctor two relays or bootstrap peers"))

        for addr in reached:
            try:
                reservation = await reserve(host, addr)
                checks.append(Check("OK", f"relay {reservation.relay.short()}",
                                    f"reservation for {reservation.ttl / 60:.0f} min, circuits up to "
                                    f"{format_size(reservation.limit.data) if reservation.limit.data else 'unlimited'} each way"))
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                checks.append(Check("WARN", f"relay {addr.peer_id.short() if addr.peer_id else addr}"[:22], f"no reservation: {describe(exc)}",
                                    "this peer is no relay, or it is full: ask its operator, or add another relay"))
            if perf_size:
                try:
                    with trio.fail_after(60):
                        conn = await host.connect(addr)
                        up, down = await perf_stream(await conn.new_stream([PERF], lazy=False), perf_size, perf_size)
                    checks.append(Check("OK", f"perf {conn.remote_peer.short()}",
                                        f"{perf_size / up / 1e6:.1f} MB/s up, {perf_size / down / 1e6:.1f} MB/s down ({format_size(perf_size)} each way)"))
                except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                    checks.append(Check("WARN", f"perf {addr.peer_id.short() if addr.peer_id else addr}"[:22], describe(exc),
                                        "the peer may not serve /perf/1.0.0, or its perf budget is spent"))
    return checks
