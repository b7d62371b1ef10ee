"""DCUtR on loopback: a relayed connection is upgraded to a direct one, and the relay is dropped."""

from __future__ import annotations

import errno

import pytest

import trio

from relay.service import HopService
from volunteer.net.transport.base import Direction, Path
from volunteer.net.stack import open_stack
from volunteer.errors import DialError
from volunteer.net.nat.dcutr import HolePuncher, attempt_roles, punchable, tuple_taken
from volunteer.net.transport.tcp import NO_LISTEN_PORT, TcpTransport
from volunteer.net.nat.observed import MappingType, ObservedAddrs
from volunteer.net.nat.relay_client import reserve
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.identify import identify_of

ECHO = "/test/echo/1.0.0"


async def echo(stream):
    while data := await stream.receive_some(1 << 20):
        await stream.send_all(data)
    await stream.send_eof()


async def relayed_from_a_to_b(relay, a, b):
    """B reserves a slot on the relay; A learns its observed address from the relay, then
    connects to B through it: B's HolePuncher starts on that relayed connection."""
    await relay.add_service(HopService())
    reservation = await reserve(b, relay.full_addrs()[0])
    await a.connect(relay.full_addrs()[0])
    await identify_of(a).ask(relay.peer_id)
    relayed = await a.connect(reservation.circuit_addrs[0].encapsulate(f"/p2p/{b.peer_id}"))
    assert relayed.path is Path.RELAYED
    return relayed


async def punch_outcome(host):
    """The outcome of the first punch ``host`` initiated, once it has ended."""
    puncher = host.service(HolePuncher)
    while not puncher.outcomes:
        await trio.sleep(0.01)
    return puncher.outcomes[-1]


@pytest.mark.slow
async def test_relayed_connection_upgrades_to_direct():
    with trio.fail_after(60):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as relay, open_stack(
            listen=["/ip4/127.0.0.1/tcp/0"]
        ) as a, open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as b, trio.open_nursery() as nursery:
            service = HopService()
            await relay.add_service(service)
            b.set_handler(ECHO, echo)
            reservation = await reserve(b, relay.full_addrs()[0])
            await a.connect(relay.full_addrs()[0])
            await identify_of(a).ask(relay.peer_id)  # A learns its observed address from the relay
            relayed = await a.connect(reservation.circuit_addrs[0].encapsulate(f"/p2p/{b.peer_id}"))
            assert relayed.path is Path.RELAYED
            # B punches: soon A has a direct connection to B and the relayed one goes away.
            while a.connection_to(b.peer_id) is None or a.connection_to(b.peer_id).path is Path.RELAYED:
                await trio.sleep(0.01)
            direct = a.connection_to(b.peer_id)
            assert direct.path in (Path.HOLE_PUNCHED, Path.DIRECT)
            stream = await a.new_stream(b.peer_id, [ECHO])
            assert stream.connection is direct
            await stream.send_all(b"direct now")
            await stream.send_eof()
            assert await stream.receive_some() == b"direct now"
            while not relayed.is_closed:
                await trio.sleep(0.05)
            outcome = b.service(HolePuncher).outcomes[-1]
            assert outcome.success and outcome.attempts == 1 and outcome.rtt is not None
            nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_the_peers_syn_first_is_the_punch_not_a_failed_attempt(monkeypatch):
    """The race behind a first attempt failing on a loaded machine: A's SYN reaches B's listener
    before B's own leaves, so B's dial from its listen port finds the 4-tuple taken
    (EADDRNOTAVAIL) while that connection's upgrade still runs. That connection is the punch:
    B must keep expecting it (its role as the upgrade's client) until it is up, not end the
    attempt at once. Here B's connect waits for A's to go through, and A's upgrade for B's
    connect to end, which makes that order certain."""
    ports: dict[str, int] = {}
    a_connected, b_refused = trio.Event(), trio.Event()
    connect = TcpTransport._connect

    async def ordered(family, sockaddr, bind):
        ends = (bind[1], sockaddr[1]) if bind is not None and ports else None
        if ends == (ports.get("b"), ports.get("a")):  # B's punch: after A's SYN got to B's listener
            await a_connected.wait()
            try:
                return await connect(family, sockaddr, bind)
            finally:
                b_refused.set()
        sock = await connect(family, sockaddr, bind)
        if ends == (ports.get("a"), ports.get("b")):  # A's punch: its upgrade waits for B's dial to end
            a_connected.set()
            await b_refused.wait()
        return sock

    monkeypatch.setattr(TcpTransport, "_connect", staticmethod(ordered))
    with trio.fail_after(60):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as relay, open_stack(
            listen=["/ip4/127.0.0.1/tcp/0"]
        ) as a, open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as b:
            await relay.add_service(HopService())
            reservation = await reserve(b, relay.full_addrs()[0])
            await a.connect(relay.full_addrs()[0])
            await identify_of(a).ask(relay.peer_id)
            ports.update(a=int(a.listen_addrs[0].value_for("tcp")), b=int(b.listen_addrs[0].value_for("tcp")))
            relayed = await a.connect(reservation.circuit_addrs[0].encapsulate(f"/p2p/{b.peer_id}"))
            assert relayed.path is Path.RELAYED
            puncher = b.service(HolePuncher)
            while not puncher.outcomes:
                await trio.sleep(0.01)
            assert a_connected.is_set() and b_refused.is_set()
            outcome = puncher.outcomes[-1]
            assert outcome.success and outcome.attempts == 1, outcome
            assert "failed" not in puncher.snapshot()["attempts"].get("tcp", {})


@pytest.mark.slow
async def test_a_connect_without_addresses_still_waits_for_the_peers_dial(monkeypatch):
    """A's CONNECT names no address (nothing of A's is dialable), but B's names its own: A dials
    B while B has nothing to dial. That dial is the attempt; B waits for it rather than sending
    the next CONNECT at once (its attempts were all spent before A's dial arrived)."""
    with trio.fail_after(60):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as relay, open_stack(
            listen=["/ip4/127.0.0.1/tcp/0"]
        ) as a, open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as b:
            monkeypatch.setattr(a.service(HolePuncher), "our_addrs", lambda *args, **kwargs: [])
            await relayed_from_a_to_b(relay, a, b)
            outcome = await punch_outcome(b)
            assert outcome.success and outcome.attempts == 1, outcome
            direct = b.connection_to(a.peer_id)
            assert direct is not None and direct.path is not Path.RELAYED


@pytest.mark.slow
async def test_the_round_trip_b_times_its_dial_by_leaves_out_as_wait_for_its_addresses(monkeypatch):
    """A may hold its CONNECT back while it waits for its observed addresses (an office's QUIC
    observation that never comes). B timed its dial by half the CONNECT exchange, so half of A's
    wait went into B's dial timing, and B's SYN left a second after A's (the office's punches took
    3.1 s, not 2.1). B's muxer ping beside the exchange measures the path, not A's wait."""
    held = 2.0

    async def waits_for_its_addresses():
        await trio.sleep(held)

    with trio.fail_after(60):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as relay, open_stack(
            listen=["/ip4/127.0.0.1/tcp/0"]
        ) as a, open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as b:
            monkeypatch.setattr(a.service(HolePuncher), "_await_observed_addrs", waits_for_its_addresses)
            await relayed_from_a_to_b(relay, a, b)
            outcome = await punch_outcome(b)
            assert outcome.success and outcome.attempts == 1, outcome
            assert outcome.rtt is not None and outcome.rtt < held / 2, outcome  # the path's, not A's wait


def test_a_taken_four_tuple_is_told_from_other_dial_errors():
    taken = DialError("cannot connect")
    taken.__cause__ = OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
    assert tuple_taken(taken)
    no_listener = DialError("cannot connect")
    no_listener.__cause__ = OSError(errno.EADDRNOTAVAIL, NO_LISTEN_PORT)
    refused = DialError("cannot connect")
    refused.__cause__ = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    assert not tuple_taken(no_listener) and not tuple_taken(refused) and not tuple_taken(DialError("timed out"))


def test_roles_follow_the_spec_then_swap_on_the_last_attempt():
    assert attempt_roles(1) == (Direction.OUTBOUND, Direction.INBOUND)
    assert attempt_roles(2) == (Direction.OUTBOUND, Direction.INBOUND)
    assert attempt_roles(3) == (Direction.INBOUND, Direction.OUTBOUND)


def test_punchable_addresses_are_bounded_and_direct():
    peer = KeyPair.generate().peer_id
    raw = [Multiaddr(f"/ip4/203.0.113.{i}/tcp/4001").to_bytes() for i in range(10)]
    raw.append(Multiaddr(f"/ip4/203.0.113.9/tcp/1/p2p/{peer}/p2p-circuit").to_bytes())
    raw.append(b"\xff\xff garbage")
    addrs = punchable(raw)
    assert len(addrs) == 4 and all(not a.is_relayed() for a in addrs)


def test_mapping_type_from_observations():
    observed = ObservedAddrs()
    relay, other = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    local = Multiaddr("/ip4/192.0.2.2/tcp/4001")
    observed.record(relay, Multiaddr("/ip4/203.0.113.10/tcp/4001"), local, Multiaddr("/ip4/203.0.113.101/tcp/4001"), 0)
    assert observed.mapping(1, 4001) is MappingType.UNKNOWN  # one observer is not evidence enough
    observed.record(other, Multiaddr("/ip4/203.0.113.20/tcp/4001"), local, Multiaddr("/ip4/203.0.113.101/tcp/4001"), 1)
    assert observed.mapping(2, 4001) is MappingType.ENDPOINT_INDEPENDENT
    assert observed.candidates(2, 4001) == [Multiaddr("/ip4/203.0.113.101/tcp/4001")]
    observed.record(other, Multiaddr("/ip4/203.0.113.20/tcp/4001"), local, Multiaddr("/ip4/203.0.113.101/tcp/5555"), 3)
    assert observed.mapping(4, 4001) is MappingType.ENDPOINT_DEPENDENT
    # Relayed observations say nothing about our NAT; stale ones are forgotten.
    observed.record(other, Multiaddr(f"/ip4/203.0.113.10/tcp/1/p2p/{relay}/p2p-circuit"), local, Multiaddr("/ip4/1.2.3.4/tcp/9"), 5)
    assert observed.mapping(10_000, 4001) is MappingType.UNKNOWN


async def _punch_through_relay(listen: list[str]):
    """A relayed connection from a to b through a relay, all listening on ``listen``; returns
    (a's direct connection to b, b's last punch outcome, b's puncher snapshot)."""
    async with open_stack(listen=listen) as relay, open_stack(listen=listen) as a, open_stack(listen=listen) as b:
        await relay.add_service(HopService())
        b.set_handler(ECHO, echo)
        reservation = await reserve(b, relay.full_addrs()[0])
        await a.connect(relay.full_addrs()[0])
        await identify_of(a).ask(relay.peer_id)
        relayed = await a.connect(reservation.circuit_addrs[0].encapsulate(f"/p2p/{b.peer_id}"))
        assert relayed.path is Path.RELAYED
        while a.connection_to(b.peer_id) is None or a.connection_to(b.peer_id).path is Path.RELAYED:
            await trio.sleep(0.01)
        direct = a.connection_to(b.peer_id)
        stream = await a.new_stream(b.peer_id, [ECHO])
        await stream.send_all(b"direct now")
        await stream.send_eof()
        assert await stream.receive_some() == b"direct now"
        puncher = b.service(HolePuncher)
        while not puncher.outcomes:
            await trio.sleep(0.01)
        return direct, puncher.outcomes[-1], puncher.snapshot()


async def test_a_relayed_connection_upgrades_to_direct_quic():
    with trio.fail_after(60):
        direct, outcome, snapshot = await _punch_through_relay(["/ip4/127.0.0.1/udp/0/quic-v1"])
        assert direct.path_label == "direct quic"
        assert outcome.success and outcome.transport == "quic" and outcome.attempts == 1
        assert snapshot["by_transport"]["quic"] == 1 and snapshot["first_attempt"] == 1
        assert sum(snapshot["attempts"]["quic"].values()) == 1 and "tcp" not in snapshot["attempts"]


async def test_with_both_transports_the_first_direct_connection_wins():
    with trio.fail_after(60):
        direct, outcome, snapshot = await _punch_through_relay(["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"])
        assert outcome.success and outcome.attempts == 1 and outcome.transport in ("tcp", "quic")
        assert direct.transport in ("tcp", "quic") and snapshot["direct"] == 1
