"""Hostile peers against a node on loopback, built from the project's own modules.

The attacker dials from 127.0.0.3, the honest peer from 127.0.0.2; each test asserts that the
honest peer is served during and after the attack, and that the node's memory growth stays under
its configured budget, measured twice: the resource manager's reserved bytes, and the process's
resident set from /proc/self/statm (the attacker runs in this process too, so that figure is an
upper bound on what the node itself grew).
"""

from __future__ import annotations

import os
import socket

import pytest
import trio

from volunteer.net.connection import negotiate_muxer, upgrade
from volunteer.net.identity import KeyPair
from volunteer.net.multistream import PROTOCOL_ID, encode_message
from volunteer.net.resources import HANDSHAKES, MEMORY, ResourceLimits, ResourceManager
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.base import Direction, RawConnection
from volunteer.net.transport.tcp import sockaddr_to_multiaddr
from volunteer.net.yamux import YamuxConnection
from volunteer.net.yamux.frames import DATA, PING, SYN, WINDOW_UPDATE, encode_header

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc for RSS")

MiB = 1024 * 1024
ECHO = "/echo/1.0.0"
SINK = "/sink/1.0.0"
HONEST, ATTACKER = "127.0.0.2", "127.0.0.3"
BUDGET = 64 * MiB  # the node's configured memory budget in these tests


def limits(**overrides) -> ResourceLimits:
    base = dict(system_memory=BUDGET, peer_memory=16 * MiB, address_pending_handshakes=8,
                system_pending_handshakes=32, first_message_timeout=0.5)
    base.update(overrides)
    return ResourceLimits(**base)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def echo(stream) -> None:
    while data := await stream.receive_some():
        await stream.send_all(data)
    await stream.send_eof()


async def sink(stream) -> None:
    await trio.sleep_forever()  # a handler that never reads: everything sent stays buffered


class Victim:
    def __init__(self, host, manager: ResourceManager) -> None:
        self.host = host
        self.manager = manager
        self.port = int(str(host.addrs[0]).split("/")[4])
        self.peak_reserved = 0

    async def honest_roundtrip(self, honest_host) -> None:
        """Dial from the honest address, echo a message, close: the honest peer is served."""
        conn = await honest_host.dial_addr(self.host.full_addrs()[0], self.host.peer_id, local_host=HONEST)
        try:
            stream = await conn.new_stream([ECHO])
            await stream.send_all(b"still served")
            await stream.send_eof()
            received = b""
            while chunk := await stream.receive_some():
                received += chunk
            assert received == b"still served"
        finally:
            await conn.aclose()

    async def watch_memory(self) -> None:
        while True:
            self.peak_reserved = max(self.peak_reserved, self.manager.memory)
            await trio.sleep(0.01)


async def run_attack(attack, *, resource_limits: ResourceLimits | None = None, during: int = 3) -> Victim:
    """Start a victim node, run ``attack(victim)`` while the honest peer is served ``during``
    times, then once more after it; check the memory budget. Returns the victim for more checks."""
    manager = ResourceManager(resource_limits or limits())
    options = StackOptions(relay_client=False, hole_punching=False)
    async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=options, services=[manager]) as host, open_stack(
        options=StackOptions(relay_client=False, hole_punching=False)
    ) as honest:
        host.set_handler(ECHO, echo)
        host.set_handler(SINK, sink)
        victim = Victim(host, manager)
        await victim.honest_roundtrip(honest)  # warm up: imports and first allocations
        rss_before = rss()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(victim.watch_memory)
            attack_done = trio.Event()

            async def attacker() -> None:
                try:
                    await attack(victim)
                finally:
                    attack_done.set()

            nursery.start_soon(attacker)
            for _ in range(during):
                await victim.honest_roundtrip(honest)
                await trio.sleep(0.05)
            await attack_done.wait()
            await victim.honest_roundtrip(honest)
            victim.peak_reserved = max(victim.peak_reserved, manager.memory)
            nursery.cancel_scope.cancel()
        growth = rss() - rss_before
        assert victim.peak_reserved <= BUDGET
        assert growth < BUDGET, f"RSS grew {growth / MiB:.0f} MiB, over the {BUDGET / MiB:.0f} MiB budget"
    return victim


async def raw_socket(port: int, *, rcvbuf: int | None = None) -> trio.SocketStream:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # a peer that reads nothing
    await sock.bind((ATTACKER, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


async def secure_session(port: int, *, rcvbuf: int | None = None):
    """An authenticated, muxer-negotiated byte stream to the victim, ready for raw yamux frames."""
    stream = await raw_socket(port, rcvbuf=rcvbuf)
    raw = RawConnection(stream, sockaddr_to_multiaddr(stream.socket.getsockname()),
                        sockaddr_to_multiaddr(stream.socket.getpeername()), None)
    secure, needs_muxer = await upgrade(raw, KeyPair.generate(), Direction.OUTBOUND)
    return (await negotiate_muxer(secure, Direction.OUTBOUND)) if needs_muxer else secure


async def closed_by_peer(stream, limit: int = 64 * MiB) -> None:
    """Read until the victim closes the connection (bounded in bytes)."""
    received = 0
    try:
        while chunk := await stream.receive_some(65536):
            received += len(chunk)
            assert received < limit
    except trio.BrokenResourceError:
        pass


@pytest.mark.trio_timeout(90)
async def test_half_open_sockets_from_one_address_never_lock_others_out():
    sockets: list[trio.SocketStream] = []

    async def attack(victim: Victim) -> None:
        for _ in range(300):  # hundreds of idle sockets, reopened as the victim drops them
            sockets.append(await raw_socket(victim.port))
        for stream in sockets:
            await closed_by_peer(stream)  # each is dropped: 2 s rule (0.5 s here), or no slot
        for stream in sockets:
            await stream.aclose()

    victim = await run_attack(attack)
    refusals = victim.manager.refusals()
    assert refusals["address"][HANDSHAKES] > 0  # most were refused at the door
    assert refusals["address"]["first_message_timeout"] > 0  # the rest timed out


@pytest.mark.slow
@pytest.mark.trio_timeout(90)
async def test_garbage_and_slowloris_lose_only_their_own_connections():
    async def attack(victim: Victim) -> None:
        slow = [await raw_socket(victim.port) for _ in range(6)]  # within the address's share
        garbage = [await raw_socket(victim.port) for _ in range(20)]
        for stream in garbage:
            await stream.send_all(os.urandom(4096))
        header = encode_message(PROTOCOL_ID)
        for index in range(len(header) - 1):  # the header a byte at a time, never finished
            for stream in slow:
                try:
                    await stream.send_all(header[index : index + 1])
                except trio.BrokenResourceError:
                    pass
            await trio.sleep(0.1)
        for stream in garbage + slow:
            await closed_by_peer(stream)
            await stream.aclose()

    victim = await run_attack(attack)
    assert victim.manager.refusals()["address"]["first_message_timeout"] > 0


@pytest.mark.slow
@pytest.mark.trio_timeout(120)
async def test_ping_flood_without_reading_loses_its_own_connection():
    async def attack(victim: Victim) -> None:
        session = await secure_session(victim.port, rcvbuf=4096)
        batch = encode_header(PING, SYN, 0, 1) * 4096  # 48 KiB of pings per write
        with trio.move_on_after(60):
            try:
                for _ in range(4000):  # up to 190 MiB of pings; the victim cuts us off long before
                    await session.send_all(batch)
            except trio.BrokenResourceError:
                pass
        await trio.aclose_forcefully(session)

    victim = await run_attack(attack)
    assert victim.manager.refusals()["connection"]["control_outbox"] == 1


@pytest.mark.slow
@pytest.mark.trio_timeout(120)
async def test_a_thousand_unread_streams_stay_within_the_peer_budget():
    async def attack(victim: Victim) -> None:
        session = await secure_session(victim.port)
        yamux = YamuxConnection(session, is_client=True)
        negotiation = encode_message(PROTOCOL_ID) + encode_message(SINK)
        payload = negotiation + b"\0" * (256 * 1024 - len(negotiation))  # the whole initial window
        async with trio.open_nursery() as nursery:
            await nursery.start(yamux.run)
            with trio.move_on_after(60):
                for _ in range(1000):
                    stream = await yamux.open_stream()
                    try:
                        await stream.send_all(payload)  # fits the window: never blocks
                    except trio.BrokenResourceError:
                        pass  # already reset by the victim: past the peer's budget
                    await trio.sleep(0)
            await yamux.aclose()
            nursery.cancel_scope.cancel()

    victim = await run_attack(attack)
    assert victim.peak_reserved <= 16 * MiB + victim.manager.limits.connection_memory * 4
    assert victim.manager.refusals()["peer"][MEMORY] > 0


@pytest.mark.trio_timeout(60)
async def test_window_violation_closes_only_the_violators_connection():
    async def attack(victim: Victim) -> None:
        session = await secure_session(victim.port)
        await session.send_all(encode_header(WINDOW_UPDATE, SYN, 1, 0))
        await session.send_all(encode_header(DATA, 0, 1, 4 * MiB) + b"x" * 65536)  # 4 MiB announced, 256 KiB granted
        await closed_by_peer(session)
        await trio.aclose_forcefully(session)

    await run_attack(attack)
