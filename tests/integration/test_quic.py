"""QUIC between Hosts on loopback: streams, the shared UDP socket, and hostile peers built from
our own modules (garbage datagrams, a flood of Initials, a handshake that never finishes, a peer
that never reads), each of which may only hurt its own connection."""

from __future__ import annotations

import os
import socket

import pytest
import trio

from volunteer.errors import DialError, PeerIDMismatch
from volunteer.net.config import HostConfig
from volunteer.net.stack import open_stack
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.resources import ResourceManager
from volunteer.net.tls import make_certificate
from volunteer.net.transport.quic import QuicTransport
from volunteer.net.transport.quic.engine import Engine, QuicLimits, configuration
from volunteer.net.identify import identify_of

from ..echo import echo, roundtrip

ECHO = "/test/echo/1.0.0"
SINK = "/test/sink/1.0.0"
QUIC = "/ip4/127.0.0.1/udp/0/quic-v1"


def quic_of(host) -> QuicTransport:
    transport = host.service(QuicTransport)
    assert transport is not None
    return transport


def udp_port(addr: Multiaddr) -> int:
    return int(addr.value_for("udp"))


@pytest.mark.trio_timeout(30)
async def test_streams_over_quic_both_ways_on_one_connection():
    async with open_stack(listen=[QUIC]) as a, open_stack(listen=[QUIC]) as b:
        a.set_handler(ECHO, echo)
        b.set_handler(ECHO, echo)
        stream = await b.new_stream(a.full_addrs()[0], [ECHO])
        payload = os.urandom(3 * 1024 * 1024 + 17)  # beyond one stream window: credit must flow
        assert await roundtrip(stream, payload) == payload
        conn = stream.connection
        assert conn.transport == "quic" and conn.path_label == "direct quic"
        # the other way, on the same connection (streams opened by the QUIC server side)
        back = await a.new_stream(b.peer_id, [ECHO])
        assert back.connection.remote_peer == b.peer_id
        assert await roundtrip(back, b"pong") == b"pong"
        assert len(a.connections(b.peer_id)) == 1
        # many streams at once, each with its own protocol negotiation
        results = []
        async with trio.open_nursery() as nursery:
            for index in range(20):
                async def one(index=index):
                    s = await b.new_stream(a.peer_id, [ECHO])
                    results.append(await roundtrip(s, str(index).encode()))

                nursery.start_soon(one)
        assert sorted(results) == sorted(str(i).encode() for i in range(20))
        assert await conn.muxer.ping() >= 0
        # streams over in both directions are forgotten: per-stream state does not pile up
        for side in (conn, a.connection_to(b.peer_id)):
            assert len(side.muxer.streams) <= 3 and len(side.muxer.engine.read_offsets) <= 3


@pytest.mark.trio_timeout(30)
async def test_dials_leave_from_the_listen_port():
    async with open_stack(listen=[QUIC]) as a, open_stack(listen=[QUIC]) as b:
        a.set_handler(ECHO, echo)
        conn = await b.connect(a.full_addrs()[0])
        b_port = udp_port(b.listen_addrs[0])
        assert udp_port(conn.local_addr) == b_port
        seen_by_a = a.connection_to(b.peer_id)
        assert seen_by_a is not None and udp_port(seen_by_a.remote_addr) == b_port
        # identify told b where a sees it: the listen port, the address b advertises
        info = await identify_of(b).ask(a.peer_id)
        assert info.observed_addr is not None and udp_port(info.observed_addr) == b_port
        # one socket per family: both connections share it
        assert len(quic_of(b).stats()) == 1 and quic_of(b).stats()[0]["connections"] == 1


@pytest.mark.trio_timeout(30)
async def test_a_dial_to_the_wrong_peer_fails_and_a_host_without_a_listener_dials_from_a_fresh_socket():
    async with open_stack(listen=[QUIC]) as a, open_stack() as b:
        a.set_handler(ECHO, echo)
        wrong = a.listen_addrs[0].with_peer_id(KeyPair.generate().peer_id)
        with pytest.raises((PeerIDMismatch, DialError)):
            await b.connect(wrong)
        stream = await b.new_stream(a.full_addrs()[0], [ECHO])
        assert await roundtrip(stream, b"x") == b"x"
        assert quic_of(b).stats() == []  # no shared socket: the dial had a throw-away one


@pytest.mark.trio_timeout(30)
async def test_garbage_datagrams_are_dropped_and_counted():
    async with open_stack(listen=[QUIC]) as a, open_stack(listen=[QUIC]) as b:
        a.set_handler(ECHO, echo)
        target = ("127.0.0.1", udp_port(a.listen_addrs[0]))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as junk:
            junk.bind(("127.0.0.2", 0))
            for index in range(300):
                size = (index * 37) % 1400 + 1
                junk.sendto(os.urandom(size), target)
        stream = await b.new_stream(a.full_addrs()[0], [ECHO])
        assert await roundtrip(stream, b"still here") == b"still here"
        stats = quic_of(a).stats()[0]
        assert sum(stats["dropped"].values()) >= 290  # a few random ones parse as a header of no connection


def _initial_from_a_stranger() -> bytes:
    """The first datagram of a real client that will never say anything else."""
    quic_limits = QuicLimits()
    client = Engine(configuration=configuration(make_certificate(KeyPair.generate(), now=1.8e9), is_client=True,
                                                quic_limits=quic_limits), quic_limits=quic_limits)
    client.connect(("127.0.0.1", 9), now=0.0)
    return client.datagrams_to_send(now=0.0)[0][0]


@pytest.mark.slow
@pytest.mark.trio_timeout(40)
async def test_a_flood_of_initials_and_handshakes_that_never_finish_lock_out_no_one_else():
    config = HostConfig(handshake_timeout=2.0)
    async with open_stack(listen=[QUIC], config=config) as a, open_stack(listen=[QUIC]) as b:
        a.set_handler(ECHO, echo)
        target = ("127.0.0.1", udp_port(a.listen_addrs[0]))
        initials = [_initial_from_a_stranger() for _ in range(60)]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as flood:
            flood.bind(("127.0.0.2", 0))
            for datagram in initials:
                flood.sendto(datagram, target)
            await trio.sleep(0.3)
            stats = quic_of(a).stats()[0]
            # one source address gets its share of handshake slots, and not one more
            assert stats["dropped"].get("address_pending_handshakes", 0) >= 60 - 16
            # meanwhile an honest peer from another address connects and works
            stream = await b.new_stream(a.full_addrs()[0], [ECHO])
            assert await roundtrip(stream, b"honest") == b"honest"
            # the stranger never finishes: its slots come back after the handshake timeout
            await trio.sleep(config.handshake_timeout + 1.0)
            transport = quic_of(a)
            assert not transport._admission.pending
            assert transport.stats()[0]["connections"] == 1  # only b's


@pytest.mark.slow
@pytest.mark.trio_timeout(40)
async def test_a_peer_that_never_reads_holds_a_bounded_amount_of_ours_and_only_its_own_stream_stalls():
    async with open_stack(listen=[QUIC]) as a, open_stack(listen=[QUIC]) as b:
        never_read = trio.Event()

        async def deaf(stream) -> None:
            await never_read.wait()

        a.set_handler(SINK, deaf)
        a.set_handler(ECHO, echo)
        stream = await b.new_stream(a.full_addrs()[0], [SINK])
        sent = 0
        with trio.move_on_after(2):
            while True:
                await stream.send_all(b"\0" * 65536)
                sent += 65536
        # the writer stalls after about one stream window (plus what sits unacknowledged)
        window = QuicLimits().stream_window
        assert window <= sent <= window + QuicLimits().send_buffer + 2 * 65536
        # what a buffers for the deaf handler is charged to the resource manager, and bounded
        # (beside the fixed reservation every connection makes)
        manager = a.service(ResourceManager)
        assert manager is not None
        held = manager.peer_memory(b.peer_id) - manager.limits.connection_memory
        assert window - 65536 <= held <= window
        # other streams on the same connection still flow
        other = await b.new_stream(a.peer_id, [ECHO])
        assert await roundtrip(other, b"unaffected") == b"unaffected"
        never_read.set()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
@pytest.mark.trio_timeout(30)
async def test_quic_over_ipv6_has_a_socket_of_its_own():
    v6 = "/ip6/::1/udp/0/quic-v1"
    async with open_stack(listen=[QUIC, v6]) as a, open_stack(listen=[QUIC, v6]) as b:
        a.set_handler(ECHO, echo)
        target = next(addr for addr in a.full_addrs() if addr.protocols()[0] == "ip6")
        stream = await b.new_stream(target, [ECHO])
        assert await roundtrip(stream, b"six") == b"six"
        assert stream.connection.local_addr.protocols()[0] == "ip6"
        assert udp_port(stream.connection.local_addr) == udp_port(next(x for x in b.listen_addrs if x.protocols()[0] == "ip6"))
        assert len(quic_of(b).stats()) == 2  # one shared socket per address family


@pytest.mark.slow
@pytest.mark.trio_timeout(30)
async def test_quic_handshakes_share_the_resource_managers_slots_per_source_address():
    from volunteer.net.resources import ResourceLimits

    manager = ResourceManager(ResourceLimits(address_pending_handshakes=3))
    async with open_stack(listen=[QUIC], config=HostConfig(handshake_timeout=2.0), services=[manager]) as a:
        target = ("127.0.0.1", udp_port(a.listen_addrs[0]))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as flood:
            flood.bind(("127.0.0.2", 0))
            for _ in range(8):
                flood.sendto(_initial_from_a_stranger(), target)
            await trio.sleep(0.3)
        stats = quic_of(a).stats()[0]
        assert stats["dropped"].get("shared_pending_handshakes", 0) == 5  # the manager's share: 3
        assert manager.refusals()["address"]["pending_handshakes"] == 5  # counted where status shows it
        await trio.sleep(2.5)  # the strangers' handshakes time out and give their slots back
        assert manager.stat()["system"].get("pending_handshakes", 0) == 0
        assert not quic_of(a)._admission.pending
