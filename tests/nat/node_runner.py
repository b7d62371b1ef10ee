"""Volunteer nodes for the NAT rig scenarios, run inside namespaces with the project's Python.

    listen-via-relay RELAY_MULTIADDR   listen on 0.0.0.0:4001 (or --listen …), keep a reservation on the relay,
                                       serve /echo/1.0.0; prints `READY <circuit multiaddr>`
                                       (then, with --wait-mapped, `MAPPED <addrs>` or `UNMAPPED
                                       <why>`), then `RESERVED <circuit multiaddr>` after each
                                       new reservation; runs until stdin closes
    autonat SERVER                     listen on 0.0.0.0:4001, ask SERVER to dial back; print the verdict
    echo-client TARGET [--size N] [--listen A] [--wait-direct S] [--also ADDR] [--ping-through S]
                                       dial TARGET, echo N random bytes, print one JSON line; with
                                       --ping-through, ping TARGET every 0.1 s from the first
                                       (relayed) connection until S seconds after it went direct
                                       (the relayed one closes in between): pings sent and lost
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import trio

from volunteer.net.events import PortMappingChanged
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.dcutr import HolePuncher
from volunteer.net.nat.portmap import PortMapper
from volunteer.net.nat.relay_client import ReservationManager
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.quic import QuicLimits
from volunteer.net.identify import identify_of
from volunteer.net.ping import ping_of

ECHO = "/echo/1.0.0"


async def echo(stream) -> None:
    while data := await stream.receive_some(1 << 20):
        await stream.send_all(data)
    await stream.send_eof()


def stack_options(args) -> StackOptions:
    """The stack as the flags say: router port mapping only when asked (the rig's tests turn it on)."""
    return StackOptions(port_mapping=args.port_mapping, quic=None if args.no_quic else QuicLimits())


async def listen_via_relay(args) -> None:
    async with open_stack(listen=args.listen or ["/ip4/0.0.0.0/tcp/4001"], options=stack_options(args)) as host, \
            trio.open_nursery() as nursery:
        host.set_handler(ECHO, echo)
        manager = ReservationManager([args.relay], want=1, max_backoff=2.0)
        await host.add_service(manager)
        announced = None
        stdin_closed = trio.Event()

        async def watch_stdin():
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
            stdin_closed.set()

        nursery.start_soon(watch_stdin)
        while not stdin_closed.is_set():
            reservations = manager.reservations
            current = reservations[0] if reservations else None
            if current is not None and current is not announced:
                addr = current.circuit_addrs[0].encapsulate(f"/p2p/{host.peer_id}")
                print("READY" if announced is None else "RESERVED", addr, flush=True)
                if announced is None and args.wait_mapped:
                    await wait_mapped(host, args.wait_mapped)
                announced = current
            with trio.move_on_after(0.2):
                await stdin_closed.wait()
        nursery.cancel_scope.cancel()


async def wait_mapped(host, seconds: float) -> None:
    """Print ``MAPPED <addrs>`` once a router mapping has been dialled back (what a DHT record of
    ours would carry then), or ``UNMAPPED <why>`` after ``seconds``."""
    mapper = host.service(PortMapper)
    if mapper is None:
        print("UNMAPPED port mapping is off", flush=True)
        return
    with host.events.subscribe(PortMappingChanged) as changes, trio.move_on_after(seconds):
        while not mapper.advertised_addrs():
            await changes.receive()
    addrs = mapper.advertised_addrs()
    if addrs:
        print("MAPPED", " ".join(str(a.with_peer_id(host.peer_id)) for a in addrs), flush=True)
    else:
        print("UNMAPPED", json.dumps(mapper.snapshot()), flush=True)


async def echo_client(args) -> dict:
    async with open_stack(listen=args.listen, options=stack_options(args)) as host:  # the relay client is standard
        result: dict = {}
        if args.also:
            # the target's other addresses, as a DHT record of it would list them: direct ones first
            target = Multiaddr(args.target)
            host.peerstore.add_addrs(target.peer_id, [target, *(Multiaddr(a) for a in args.also)])
        if args.wait_direct:
            # Connect (relayed, at first), then give hole punching its chance before sending data.
            started = trio.current_time()
            first = await (host.connect(Multiaddr(args.target).peer_id) if args.also else host.connect(args.target))
            result["first_path"] = first.describe_path()
            peer = first.remote_peer
            async with trio.open_nursery() as nursery:
                pinging = trio.Event()
                if args.ping_through:
                    nursery.start_soon(ping_through, host, args.target, pinging, result)
                with trio.move_on_after(args.wait_direct):
                    while host.connection_to(peer).describe_path().startswith("relayed"):
                        await trio.sleep(0.01)
                result["seconds_to_direct"] = trio.current_time() - started
                await trio.sleep(args.ping_through)
                pinging.set()
            result["relay_rtt"] = first.rtt
        stream = await host.new_stream(args.target, [ECHO])
        payload = os.urandom(args.size)
        received = bytearray()
        async with trio.open_nursery() as nursery:
            async def send():
                await stream.send_all(payload)
                await stream.send_eof()

            nursery.start_soon(send)
            while data := await stream.receive_some(1 << 20):
                received += data
        result.update(ok=bytes(received) == payload, bytes=len(received), path=stream.connection.describe_path(),
                      transport=stream.connection.transport, remote_addr=str(stream.connection.remote_addr))
        puncher = host.service(HolePuncher)
        if puncher is not None:
            result["punch"] = puncher.snapshot()
            result["birthday"] = dict(puncher.birthday_probes)
            result["outcomes"] = [{"success": o.success, "attempts": o.attempts, "transport": o.transport, "result": o.result,
                                   "seconds": o.seconds, "error": o.error} for o in puncher.outcomes]
        return result


PING_INTERVAL = 0.1
PING_LOST_AFTER = 5.0  # an echo unanswered this long is lost (a loaded machine answers far sooner)


async def ping_through(host, target: str, done: trio.Event, result: dict) -> None:
    """Ping ``target`` (a small echo on a new stream: the host's best connection) every
    PING_INTERVAL until ``done``: across the punch and the relayed connection's close, what a
    user's ping sees. One that fails or goes unanswered is lost."""
    sent = lost = 0
    slowest = 0.0
    while not done.is_set():
        sent += 1
        began = trio.current_time()
        with trio.move_on_after(PING_LOST_AFTER) as waited:
            try:
                stream = await host.new_stream(target, [ECHO])
                await stream.send_all(b"ping %d" % sent)
                await stream.send_eof()
                answered = b""
                while data := await stream.receive_some(64):
                    answered += data
                if answered != b"ping %d" % sent:
                    lost += 1
            except Exception:  # noqa: BLE001 - any failure is a lost ping, counted not raised
                lost += 1
        lost += waited.cancelled_caught
        slowest = max(slowest, trio.current_time() - began)
        await trio.sleep(PING_INTERVAL)
    result["pings"] = {"sent": sent, "lost": lost, "slowest_ms": round(slowest * 1000, 1)}


async def hold_direct(args) -> None:
    """Connect, wait for the hole punch, then echo on request (one JSON line per stdin line)."""
    async with open_stack(listen=args.listen) as host:
        first = await host.connect(args.target)
        peer = first.remote_peer
        with trio.move_on_after(15):
            while host.connection_to(peer).describe_path().startswith("relayed"):
                await trio.sleep(0.01)
        print("DIRECT" if host.connection_to(peer).describe_path() == "hole-punched" else "RELAYED", flush=True)
        receive = trio.wrap_file(sys.stdin)
        async for _line in receive:
            conn = host.connection_to(peer)
            stream = await conn.new_stream([ECHO])
            await stream.send_all(b"still there?")
            await stream.send_eof()
            reply = b""
            while data := await stream.receive_some():
                reply += data
            print(json.dumps({"ok": reply == b"still there?", "path": conn.describe_path(), "connection": conn.id}), flush=True)


async def punch_loop(args) -> dict:
    """Benchmark: ``count`` fresh dialers, each reaching TARGET through the relay and punching."""
    from volunteer.net.identity import KeyPair

    results = []
    for attempt in range(args.count):
        # A fresh identity and listen port each time: no earlier connection or mapping helps.
        port = args.base_port + attempt
        async with open_stack(KeyPair.generate(), listen=[f"/ip4/0.0.0.0/tcp/{port}"]) as host:
            first = await host.connect(args.target)
            started = trio.current_time()  # from the relayed connection being up to the direct one
            peer = first.remote_peer
            relay_rtt = None
            with trio.move_on_after(args.timeout):
                while host.connection_to(peer).describe_path().startswith("relayed"):
                    if relay_rtt is None and first.rtt:
                        relay_rtt = first.rtt
                    await trio.sleep(0.005)
            conn = host.connection_to(peer)
            direct = not conn.describe_path().startswith("relayed")
            entry = {"direct": direct, "seconds": trio.current_time() - started, "relay_rtt": relay_rtt or first.rtt}
            if attempt == 0:
                entry["direct_rtt"] = (await (await ping_of(host).open(peer)).ping()) if direct else None
                entry["throughput"] = await _throughput(host, conn, args.size)
                if direct and not first.is_closed:
                    entry["relayed_throughput"] = await _throughput(host, first, args.size)
            results.append(entry)
    return {"results": results}


async def _throughput(host, conn, size: int) -> float:
    stream = await conn.new_stream([ECHO])
    payload = bytes(size)
    started = trio.current_time()
    received = 0
    async with trio.open_nursery() as nursery:
        async def send():
            await stream.send_all(payload)
            await stream.send_eof()

        nursery.start_soon(send)
        while data := await stream.receive_some(1 << 20):
            received += len(data)
    return 2 * received / (trio.current_time() - started) / 1e6


async def autonat(args) -> dict:
    from volunteer.net.nat.manager import NatManager

    async with open_stack(listen=args.listen) as host:
        await host.connect(args.server)
        await identify_of(host).ask(args.server.rsplit("/p2p/", 1)[1])  # learn our observed address first
        manager = NatManager(host, [args.server])
        await manager.probe_round()
        return manager.snapshot()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("listen-via-relay")
    p.add_argument("relay")
    p.add_argument("--listen", action="append", default=[], help="listen here (repeatable; default /ip4/0.0.0.0/tcp/4001)")
    p = sub.add_parser("echo-client")
    p.add_argument("target")
    p.add_argument("--size", type=int, default=1_000_000)
    p.add_argument("--listen", action="append", default=[], help="listen too (hole punching needs a listen port)")
    p.add_argument("--wait-direct", type=float, default=0.0, metavar="SECONDS", help="wait this long for a direct connection first")
    p = sub.add_parser("punch-loop")
    p.add_argument("target")
    p.add_argument("--count", type=int, default=50)
    p.add_argument("--base-port", type=int, default=20000)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--size", type=int, default=4_000_000)
    p = sub.add_parser("hold-direct")
    p.add_argument("target")
    p.add_argument("--listen", action="append", default=["/ip4/0.0.0.0/tcp/4001"])
    p = sub.add_parser("autonat")
    p.add_argument("server")
    p.add_argument("--listen", action="append", default=["/ip4/0.0.0.0/tcp/4001"])
    for sub_parser in sub.choices.values():
        sub_parser.add_argument("--port-mapping", action="store_true", help="ask the home router to map our ports")
        sub_parser.add_argument("--no-quic", action="store_true", help="TCP only (today's behaviour, for comparisons)")
    sub.choices["listen-via-relay"].add_argument("--wait-mapped", type=float, default=0.0, metavar="SECONDS",
                                                 help="after READY, print MAPPED (or UNMAPPED) within this long")
    sub.choices["echo-client"].add_argument("--also", action="append", default=[], metavar="MULTIADDR",
                                            help="more addresses of the target (direct ones are dialled first)")
    sub.choices["echo-client"].add_argument("--ping-through", type=float, default=0.0, metavar="SECONDS",
                                            help="ping across the punch until this long after it went direct")
    args = parser.parse_args()
    if args.command == "punch-loop":
        print(json.dumps(trio.run(punch_loop, args)), flush=True)
        return 0
    if args.command == "hold-direct":
        trio.run(hold_direct, args)
        return 0
    if args.command == "autonat":
        print(json.dumps(trio.run(autonat, args)), flush=True)
        return 0
    if args.command == "listen-via-relay":
        trio.run(listen_via_relay, args)
        return 0
    result = trio.run(echo_client, args)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
