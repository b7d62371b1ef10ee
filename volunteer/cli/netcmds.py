"""Network commands: ``volunteer id`` and ``volunteer ping``."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import trio

from ..errors import DialError, HandshakeError, PeerIDMismatch, VolunteerError
from ..net.connection import Connection
from ..net.stack import open_stack
from ..net.identity import KeyPair, default_identity_path, load_or_create_keypair
from ..net.multiaddr import Multiaddr
from ..net.ping import Pinger, PING


def add_identity_flag(parser: argparse.ArgumentParser, *, default: str = "$VOLUNTEER_IDENTITY or ~/.config/volunteer/identity.key") -> None:
    """Every command that runs a node takes the same ``--identity PATH``; ``default`` says, in the
    help, which key it uses without one."""
    parser.add_argument(
        "--identity",
        metavar="PATH",
        type=Path,
        default=None,
        help=f"identity key file (created on first use; default: {default})",
    )


# ports of the OS's choosing, TCP and QUIC: enough for hole punching over either
EPHEMERAL_LISTEN = ["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"]


def add_listen_flag(parser: argparse.ArgumentParser) -> None:
    """``--listen`` for the diagnostics: they listen like a real node by default (an ephemeral
    port), so a relayed path can turn into a hole-punched one while they measure."""
    parser.add_argument(
        "--listen",
        metavar="MULTIADDR",
        action="append",
        default=[],
        help=f"listen here (repeatable; default {' and '.join(EPHEMERAL_LISTEN)}, so hole punching can turn a relayed path "
        "into a direct one); use your daemon's port, e.g. /ip4/0.0.0.0/tcp/4001, to test it exactly",
    )


def swarm_id_arg(text: str) -> str:
    """``--swarm-id`` / ``--swarm ID`` as argparse takes it (a bad one is a usage error, exit 2)."""
    from ..swarmfile import check_swarm_id

    try:
        return check_swarm_id(text)
    except VolunteerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_seconds(text: str) -> float:
    """A duration flag in seconds, more than zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, e.g. 2.5, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds more than 0, got {text!r}")
    return value


def listen_addrs(args: argparse.Namespace, target: Multiaddr | None = None) -> list[str]:
    """The ``--listen`` addresses given, else ephemeral ports: TCP and QUIC, or TCP alone for a
    ``target`` reached directly over TCP (no punch can follow, and loading QUIC costs a one-shot
    command a tenth of a second)."""
    if args.listen:
        return list(args.listen)
    if target is not None and "p2p-circuit" not in target.protocols() and "tcp" in target.protocols():
        return [a for a in EPHEMERAL_LISTEN if "/tcp/" in a]
    return list(EPHEMERAL_LISTEN)


def load_identity(args: argparse.Namespace, default: Path | None = None) -> KeyPair:
    """The key ``--identity`` names, else ``default``, else this machine's volunteer identity."""
    keypair, _created = load_or_create_keypair(args.identity or default or default_identity_path())
    return keypair


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "id",
        help="print this node's peer ID",
        description="Print this node's peer ID, creating the identity key (mode 0600) on first use.",
        epilog="examples:\n  volunteer id\n  volunteer id --identity ./relay.key\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_identity_flag(p)
    p.add_argument("--cid", action="store_true", help="print the CIDv1 form (bafz…) instead of base58")
    p.set_defaults(run=run_id)

    p = sub.add_parser(
        "ping",
        help="ping any libp2p peer and show the path taken",
        description=(
            "Dial a libp2p peer (ours, go-libp2p, py-libp2p…), ping it over /ipfs/ping/1.0.0 and print each "
            "round-trip time with the path it took (direct, hole-punched, or relayed via which relay)."
        ),
        epilog=(
            "examples:\n"
            "  volunteer ping /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...\n"
            "  volunteer ping -c 10 -i 0.2 /ip4/198.51.100.1/tcp/4001/p2p/RELAY/p2p-circuit/p2p/PEER\n"
            "  volunteer ping -c 20 /ip4/198.51.100.1/tcp/4001/p2p/RELAY/p2p-circuit/p2p/PEER\n"
            "      (it listens on a port of its own, so hole punching moves the path from relayed to direct while it pings)\n"
            "exit status: 0 if every ping was answered, 1 otherwise (unreachable, wrong peer ID, handshake refused, timeout)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("addr", metavar="MULTIADDR", help="the peer's multiaddr, ideally ending in /p2p/PEER_ID")
    p.add_argument("-c", "--count", type=int, default=4, help="number of pings (default 4)")
    p.add_argument("-i", "--interval", type=positive_seconds, default=1.0, help="seconds between pings (default 1)")
    p.add_argument("-W", "--timeout", type=positive_seconds, default=10.0, help="seconds to wait for the connection and each reply")
    add_listen_flag(p)
    add_identity_flag(p)
    p.set_defaults(run=run_ping)


def run_id(args: argparse.Namespace) -> int:
    keypair = load_identity(args)
    print(keypair.peer_id.to_cid() if args.cid else keypair.peer_id)
    return 0


def run_ping(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise VolunteerError("--count must be at least 1")
    target = Multiaddr(args.addr)
    keypair = load_identity(args)
    return trio.run(_ping, target, keypair, args)


async def _ping(target: Multiaddr, keypair: KeyPair, args: argparse.Namespace) -> int:
    async with open_stack(keypair, listen_addrs(args, target)) as host:
        started = trio.current_time()
        try:
            with trio.fail_after(args.timeout):
                conn = await host.connect(target)
        except trio.TooSlowError:
            raise VolunteerError(f"timeout: no connection to {target} within {args.timeout:g}s") from None
        except PeerIDMismatch as exc:
            from ..kinds.entry import wrong_peer_line  # the kinds (and the DHT) only on this error

            raise VolunteerError(wrong_peer_line(exc, target)) from None
        except HandshakeError as exc:
            raise VolunteerError(f"handshake refused by {target}: {exc}") from None
        except DialError as exc:
            if PeerIDMismatch.inside(exc) is not None:
                from ..kinds.entry import wrong_peer_line

                raise VolunteerError(wrong_peer_line(exc, target)) from None
            raise VolunteerError(f"unreachable: {exc}") from None
        setup_ms = (trio.current_time() - started) * 1000
        peer = conn.remote_peer
        print(f"PING {peer} connected in {setup_ms:.1f} ms via {conn.describe_path()} over {conn.transport} ({conn.remote_addr})",
              flush=True)

        rtts: list[float] = []
        pinger: Pinger | None = None
        pinger_conn: Connection | None = None
        for seq in range(1, args.count + 1):
            best = host.connection_to(peer)
            try:
                with trio.fail_after(args.timeout):
                    conn = best if best is not None else await host.connect(peer)
                    if pinger is None or conn is not pinger_conn:
                        # The best connection changed (relayed → direct, say): ping on the new one.
                        if pinger is not None:
                            with trio.move_on_after(1):
                                await _quiet(pinger.aclose())
                        pinger = Pinger(await conn.new_stream([PING]))
                        pinger_conn = conn
                    rtt = await pinger.ping()
            except trio.TooSlowError:
                print(f"seq={seq} timeout after {args.timeout:g}s", flush=True)
                pinger, pinger_conn = None, None
            except (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                print(f"seq={seq} failed: {exc}", flush=True)
                pinger, pinger_conn = None, None
            else:
                rtts.append(rtt)
                print(f"seq={seq} rtt={rtt * 1000:.2f} ms path={conn.describe_path()} transport={conn.transport}", flush=True)
            if seq < args.count:
                await trio.sleep(args.interval)

        lost = args.count - len(rtts)
        print(f"--- {peer} ping statistics ---")
        summary = f"{args.count} sent, {len(rtts)} received, {100 * lost / args.count:.0f}% lost"
        if rtts:
            ms = sorted(r * 1000 for r in rtts)
            summary += f"; rtt min/avg/p50/max = {ms[0]:.2f}/{statistics.fmean(ms):.2f}/{statistics.median(ms):.2f}/{ms[-1]:.2f} ms"
        print(summary, flush=True)
        if lost:
            raise VolunteerError(f"{lost} of {args.count} pings got no reply")
        return 0


async def _quiet(awaitable) -> None:
    try:
        await awaitable
    except (trio.BrokenResourceError, trio.ClosedResourceError, VolunteerError):
        pass
