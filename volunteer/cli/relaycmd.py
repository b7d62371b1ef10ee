"""``volunteer relay``: run a public relay node (circuit relay v2) as a stranger would."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import trio

from ..errors import VolunteerError
from ..net.multiaddr import Multiaddr
from ..paths import relay_identity_path
from ..sizes import size_arg
from ..swarmfile import load_limits
from ..web.serve import host_port_arg
from .netcmds import add_identity_flag, load_identity, swarm_id_arg



def add_parsers(sub: argparse._SubParsersAction) -> None:
    from relay.limits import RelayLimits

    defaults = RelayLimits()
    p = sub.add_parser(
        "relay",
        help="run a public relay node (circuit relay v2) for volunteers behind NAT",
        description=(
            "Run a public relay: volunteers behind NAT reserve a slot here and are reachable through it "
            "until hole punching gives them a direct connection. Needs a public IP (or a forwarded port). "
            "Shows a live status view in a terminal, Prometheus metrics with --metrics."
        ),
        epilog=(
            "examples:\n"
            "  volunteer relay\n"
            "  volunteer relay --listen /ip4/0.0.0.0/tcp/4001 --announce /ip4/203.0.113.7/tcp/4001 --metrics 127.0.0.1:9100\n"
            "  volunteer relay --max-reservations 4096 --circuit-data 1GiB --circuit-duration 1800\n"
            "defaults: circuits may last 10 minutes and carry 512 MiB each way, enough for a trainer's\n"
            "expert calls while hole punching is tried (go-libp2p's 2 min / 128 KiB only carry the punch)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--listen", action="append", metavar="MULTIADDR", help="listen address (repeatable; default /ip4/0.0.0.0/tcp/4001 and /ip4/0.0.0.0/udp/4001/quic-v1: "
                   "peers learn their QUIC address for hole punching from a relay that speaks QUIC)")
    p.add_argument("--announce", action="append", default=[], metavar="MULTIADDR", help="address to advertise instead of the listen addresses (repeatable)")
    p.add_argument("--metrics", type=host_port_arg, metavar="HOST:PORT", help="serve Prometheus metrics over HTTP at http://HOST:PORT/metrics")
    p.add_argument("--swarm", action="append", metavar="SWARM_ID|FILE", type=swarm_id_or_file,
                   help="serve as DHT bootstrap peer for this swarm id, or for the swarm a swarm file describes "
                        "(its grids and entry points then show on --web) (repeatable; default: default)")
    p.add_argument("--web", type=host_port_arg, metavar="HOST:PORT",
                   help="serve the public swarm health page (coverage map, volunteers, entry points, top "
                        "contributors; JSON at /api/health, Prometheus at /metrics) at http://HOST:PORT/")
    p.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="other relays or peers of the swarm's DHT (repeatable)")
    p.add_argument("--no-dashboard", action="store_true", help="plain log lines instead of the live status view")
    # a relay of its own key: sharing the donor's would make one peer ID of two nodes (a donor on
    # the same machine "reserved on a relay" that is itself)
    add_identity_flag(p, default="$VOLUNTEER_RELAY_IDENTITY or ~/.config/volunteer/relay.key")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="config.toml whose [limits] override the resource manager's bounds (default: the user's)")
    limits = p.add_argument_group("limits")
    limits.add_argument("--reservation-ttl", type=float, default=defaults.reservation_ttl, metavar="SECONDS")
    limits.add_argument("--max-reservations", type=int, default=defaults.max_reservations, metavar="N")
    limits.add_argument("--max-reservations-per-ip", type=int, default=defaults.max_reservations_per_ip, metavar="N")
    limits.add_argument("--max-circuits", type=int, default=defaults.max_circuits, metavar="N")
    limits.add_argument("--max-circuits-per-peer", type=int, default=defaults.max_circuits_per_peer, metavar="N")
    limits.add_argument("--circuit-duration", type=float, default=defaults.circuit_duration, metavar="SECONDS")
    limits.add_argument("--circuit-data", type=size_arg, default=defaults.circuit_data, metavar="SIZE", help="per direction, e.g. 512MiB")
    limits.add_argument("--buffer-size", type=size_arg, default=defaults.buffer_size, metavar="SIZE")
    p.set_defaults(run=run_relay)


def run_relay(args: argparse.Namespace) -> int:
    from relay.limits import RelayLimits

    limits = RelayLimits(
        reservation_ttl=args.reservation_ttl,
        max_reservations=args.max_reservations,
        max_reservations_per_ip=args.max_reservations_per_ip,
        max_circuits=args.max_circuits,
        max_circuits_per_peer=args.max_circuits_per_peer,
        circuit_duration=args.circuit_duration,
        circuit_data=args.circuit_data,
        buffer_size=args.buffer_size,
    )
    listen = [Multiaddr(a) for a in (args.listen or ["/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1"])]
    announce = [Multiaddr(a) for a in args.announce]
    keypair = load_identity(args, default=relay_identity_path())
    dashboard = not args.no_dashboard and sys.stdout.isatty()
    watched = [watched_swarm(text) for text in (args.swarm or ["default"])]
    swarms = list(dict.fromkeys(w.swarm_id for w in watched))
    resources = resource_limits(load_limits(args.config))
    return trio.run(_serve, keypair, listen, announce, limits, args.metrics, dashboard, swarms, args.bootstrap, resources,
                    args.web, watched)


def swarm_id_or_file(text: str) -> str:
    """``--swarm`` as argparse takes it: a swarm file's path (read when the relay starts) or a
    swarm id (a bad one is a usage error, exit 2)."""
    if text.endswith(".toml") or Path(text).is_file():
        return text
    return swarm_id_arg(text)


def watched_swarm(text: str):
    """``--swarm`` as given: a swarm file (its id, grids and entry points) or a bare swarm id."""
    from relay.healthservice import WatchedSwarm

    from ..swarmfile import load_swarm_file

    if text.endswith(".toml") or Path(text).is_file():
        spec = load_swarm_file(text)
        return WatchedSwarm(spec.id, tuple(spec.grids), tuple(spec.relays), tuple(spec.bootstrap))
    return WatchedSwarm(text)


def resource_limits(overrides: dict):
    """The resource manager's bounds with config.toml's [limits] applied (the expert server's
    request budget, also allowed there, means nothing to a relay)."""
    from ..net.resources import ResourceLimits
    from ..settings import EXPERT_LIMITS

    return ResourceLimits(**{k: v for k, v in overrides.items() if k not in EXPERT_LIMITS})


async def _serve(keypair, listen, announce, limits, metrics, dashboard: bool, swarms=("default",), bootstrap=(),
                 resources=None, web=None, watched=()) -> int:
    from relay.node import open_relay_node

    try:
        async with open_relay_node(keypair, listen, announce, limits, metrics, swarms, bootstrap, resources,
                                   web=web, watched=watched) as node:
            print(f"relay {node.host.peer_id}", flush=True)
            for addr in node.host.full_addrs():
                print(f"listening on {addr}", flush=True)
            print(f"DHT bootstrap for swarm(s): {', '.join(swarms)}", flush=True)
            if node.metrics_addr:
                print(f"metrics on http://{node.metrics_addr[0]}:{node.metrics_addr[1]}/metrics", flush=True)
            if node.web_addr:
                print(f"health page on http://{node.web_addr[0]}:{node.web_addr[1]}/", flush=True)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:
                    from .testnet import exit_with_parent

                    nursery.start_soon(exit_with_parent, nursery.cancel_scope.cancel)
                    if dashboard:
                        nursery.start_soon(_show_dashboard, node)
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        break
            print("relay stopped", flush=True)
    except OSError as exc:
        raise VolunteerError(f"cannot start the relay: {exc.strerror or exc}") from None
    return 0


async def _show_dashboard(node) -> None:
    from rich.live import Live

    from relay.dashboard import render

    started = trio.current_time()
    with Live(render(node, 0), refresh_per_second=2, screen=False) as live:
        while True:
            await trio.sleep(0.5)
            live.update(render(node, trio.current_time() - started, height=live.console.size.height))
