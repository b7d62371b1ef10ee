"""``volunteer doctor``: a netcheck. Can we reach the swarm's relays, are we public, can we punch,
does the router map ports, does our NAT's mapping vary by destination, does it hairpin, IPv6?

Each check prints one line, OK / WARN / FAIL, with what to do about it. The swarm is a name or
swarm file (the peers its kind says to check: ours, its relays and bootstrap peers; hivemind's,
its initial peers, then whether they speak hivemind's DHT and kad) or the peers' multiaddrs.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ..errors import PeerIDMismatch, VolunteerError, describe
from ..kinds import Check, SwarmKind, kind_of
from ..kinds.entry import wrong_peer_line
from ..net.events import PortMappingChanged
from ..net.host import Host
from ..net.identify import identify_of
from ..net.identity import KeyPair
from ..net.interfaces import default_listen_addrs, global_ipv6_addrs, is_global_v6
from ..net.multiaddr import Multiaddr
from ..net.nat.autonat import Reachability
from ..net.nat.manager import NatManager
from ..net.nat.observed import endpoint_of
from ..net.nat.observer import AddressObserver
from ..net.nat.portmap import PortMapper
from ..net.nat.portmap.service import PortMapStatus
from ..net.nat.relay_client import reserve
from ..net.stack import StackOptions, open_stack
from ..net.perf import PERF, perf_stream
from ..net.ping import ping_of
from ..sizes import format_size, parse_size
from .netcmds import add_identity_flag, load_identity
from .reachcheck import hairpin_check, ipv6_check, nat_mapping_check, port_mapping_check

if TYPE_CHECKING:
    from ..swarmfile import SwarmSpec

CHECK_TIMEOUT = 15.0
PORT_MAPPING_WAIT = 10.0  # for the router to answer (PCP and NAT-PMP give up after 3.75 s, UPnP after 1 s of discovery)
CONFIRM_WAIT = 10.0  # for an AutoNAT server to dial a fresh mapping back
SHORT_DIAL = 5.0  # a hairpin or IPv6 dial


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check connectivity: relays, reachability, NAT type, hole punching, throughput",
        description=(
            "A netcheck for volunteers: reach each relay / bootstrap peer and time it, ask them whether "
            "this machine is reachable from outside (AutoNAT), ask the router for a port mapping (PCP, "
            "NAT-PMP, UPnP IGD: which it speaks, the mapping it gave, whether a peer reached it), tell "
            "whether the NAT's mapping varies by destination for TCP and QUIC (can hole punching work?), "
            "whether the router hairpins, whether IPv6 works, try a relay reservation, and measure "
            "throughput to each relay with the perf protocol. Each line is OK, WARN or FAIL, with what "
            "to do about it."
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
    p.add_argument("--listen", action="append", metavar="MULTIADDR",
                   help="listen address to test (repeatable; default: TCP and QUIC on any port, IPv6 too with a "
                   "global IPv6 address); use your daemon's ports to test them exactly")
    p.add_argument("--no-port-mapping", action="store_true",
                   help="do not ask the router for a port mapping (also VOLUNTEER_NO_PORT_MAPPING=1)")
    p.add_argument("--perf-size", default="4MiB", metavar="SIZE", help="bytes each way for the throughput check (0 to skip)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    add_identity_flag(p)
    p.set_defaults(run=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    peers: list[Multiaddr] = []
    perf = True  # every peer serves perf, unless a swarm's kind says its peers do not
    kinds: list[tuple[SwarmKind, list[Multiaddr]]] = []  # each swarm's kind, for its own checks
    sources: dict[Multiaddr, "SwarmSpec"] = {}  # the swarm file each checked address came from
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
            for addr in plan.peers:
                sources.setdefault(addr, spec)
    try:
        perf_size = parse_size(args.perf_size) if perf else 0
    except ValueError as exc:
        raise VolunteerError(str(exc)) from None

    async def all_checks() -> list[Check]:
        checks = await diagnose(load_identity(args), listen_addrs(args), peers, perf_size, port_mapping_off(args),
                                sources=sources)
        for kind, its_peers in kinds:
            checks += await kind.check_peers(its_peers)
        from ..paths import state_dir
        from .eventlog import event_log_path

        return checks + [event_log_check(event_log_path(state_dir()))]

    return report(trio.run(all_checks), as_json=args.json)


def event_log_check(path: Path) -> Check:
    """Where ``volunteer join`` keeps its event log, and whether it has written one yet."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return Check("OK", "event log", f"none yet: `volunteer join` keeps it at {path}")
    except OSError as exc:
        return Check("WARN", "event log", f"cannot read {path}: {exc.strerror}", "check the state dir's permissions")
    return Check("OK", "event log", f"{path} ({format_size(size)}; older ones beside it as .1 .. .3)")


def listen_addrs(args: argparse.Namespace) -> list[Multiaddr]:
    """What doctor listens on: --listen, else what a volunteer listens on by default."""
    return [Multiaddr(a) for a in (args.listen or default_listen_addrs())]


def port_mapping_off(args: argparse.Namespace) -> str:
    """Why doctor leaves the router's ports alone (empty: it asks for a mapping)."""
    if getattr(args, "no_port_mapping", False):
        return "--no-port-mapping"
    if os.environ.get("VOLUNTEER_NO_PORT_MAPPING") == "1":
        return "VOLUNTEER_NO_PORT_MAPPING=1"
    return ""


def report(checks: list["Check"], *, as_json: bool) -> int:
    """Print the checks (a table with fixes, or JSON); the exit status: 1 if any failed."""
    if as_json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for check in checks:
            line = f"{check.status:<5} {check.name:<22} {check.detail}"
            print(line + (f"\n{'':28}→ {check.fix}" if check.fix and check.status != "OK" else ""))
    return 1 if any(c.status == "FAIL" for c in checks) else 0


async def diagnose(keypair, listen: list[Multiaddr], peers: list[Multiaddr], perf_size: int,
                   port_mapping_off: str = "", *, sources: Mapping[Multiaddr, "SwarmSpec"] | None = None) -> list[Check]:
    """Run every check (``port_mapping_off``: why port mapping is off, empty when it is on;
    ``sources``: the swarm each peer's address came from, named when that address is wrong)."""
    checks: list[Check] = []
    services = [] if port_mapping_off else [PortMapper()]
    async with open_stack(keypair, listen, options=StackOptions(port_mapping=False), services=services) as host:
        checks.append(Check("OK", "identity", str(host.peer_id)))
        checks.append(Check("OK", "listening", ", ".join(str(a) for a in host.listen_addrs)))
        reached = []
        for addr in peers:
            try:
                with trio.fail_after(CHECK_TIMEOUT):
                    conn = await host.connect(addr)
                    rtt = await (await ping_of(host).open(conn.remote_peer)).ping()
                    await identify_of(host).identify(conn)
                reached.append(addr)
                checks.append(Check("OK", f"reach {conn.remote_peer.short()}", f"rtt {rtt * 1000:.1f} ms via {conn.describe_path()}"))
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                if PeerIDMismatch.inside(exc) is not None:  # someone answered: the address is wrong
                    spec = (sources or {}).get(addr)
                    fix = (f"put the node's current address in swarm file {spec.path}" if spec is not None and spec.path
                           else "give the node's current address")
                    checks.append(Check("FAIL", "reach", wrong_peer_line(exc, addr, spec), fix))
                    continue
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

        mapper = host.service(PortMapper)
        snapshot = await _port_mapping(host, mapper) if mapper is not None else None
        checks.append(port_mapping_check(snapshot, port_mapping_off))
        checks += _nat_mapping_checks(host, manager, mapper)
        checks.append(await _hairpin(host, manager, mapper))
        checks.append(await _ipv6(host, reached))

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


async def _port_mapping(host: Host, mapper: PortMapper) -> PortMapStatus:
    """Wait for the router's answer, then for an AutoNAT server to dial the mapping back."""
    with trio.move_on_after(PORT_MAPPING_WAIT):
        await mapper.started.wait()
    with host.events.subscribe(PortMappingChanged) as changes, trio.move_on_after(CONFIRM_WAIT):
        while mapper.confirming:
            await changes.receive()
    return mapper.snapshot()


def _nat_mapping_checks(host: Host, manager: NatManager, mapper: PortMapper | None) -> list[Check]:
    """Whether the mapping varies by destination, for TCP and (when we listen on it) QUIC."""
    observer = host.service(AddressObserver)
    mapped = mapper is not None and bool(mapper.advertised_addrs())
    now = trio.current_time()
    checks = []
    for transport, name in (("tcp", "TCP"), ("quic", "QUIC")):
        ports = [found[2] for found in map(endpoint_of, host.listen_addrs)
                 if found is not None and found[0] == transport and ":" not in found[1]]
        if not ports:
            continue
        if observer is None:
            mapping, observed = manager.mapping(), manager.our_addrs()
        else:
            mapping = observer.observed.mapping(now, ports[0], transport=transport)
            observed = observer.observed.candidates(now, ports[0], transport=transport)
        checks.append(nat_mapping_check(name, mapping, [str(a) for a in observed], mapped))
    return checks


async def _hairpin(host: Host, manager: NatManager, mapper: PortMapper | None) -> Check:
    """Dial our own public address (a confirmed mapping first, else an observed one, TCP first)
    from a second, throw-away host inside this machine: does the router loop it back to us?"""
    candidates = [*(mapper.advertised_addrs() if mapper is not None else []), *manager.our_addrs()]
    candidates.sort(key=lambda a: a.value_for("tcp") is None)  # TCP first: a QUIC dial needs more setup
    targets = [a for a in candidates if not is_global_v6(a.value_at(0))]
    if not targets:
        return hairpin_check(None, None)
    target = targets[0]
    options = StackOptions(port_mapping=False, hole_punching=False, relay_client=False, perf=None)
    async with open_stack(KeyPair.generate(), [], options=options) as probe_host:
        # caught in here: out of the stack, a failure would come wrapped in its nursery's group
        try:
            with trio.fail_after(SHORT_DIAL):
                await probe_host.dial_addr(target, host.peer_id)
        except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            return hairpin_check(False, str(target), describe(exc))
    return hairpin_check(True, str(target))


async def _ipv6(host: Host, reached: list[Multiaddr]) -> Check:
    """Our global IPv6 addresses, and whether a peer we reached answers over IPv6."""
    ours = global_ipv6_addrs()
    if not ours:
        return ipv6_check([], None)
    why = ""
    tried = False
    for addr in reached:
        peer = addr.peer_id
        conn = host.connection_to(peer) if peer is not None else None
        if conn is not None and is_global_v6(conn.remote_addr.value_at(0)):
            return ipv6_check(ours, True)
        for candidate in (host.peerstore.addrs(peer) if peer is not None else []):
            if candidate.is_relayed() or not is_global_v6(candidate.value_at(0)):
                continue
            tried = True
            try:
                with trio.fail_after(SHORT_DIAL):
                    await host.dial_addr(candidate, peer)
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                why = f"{candidate}: {describe(exc)}"
                continue
            return ipv6_check(ours, True)
    return ipv6_check(ours, False if tried else None, why)
