"""AutoNAT v1 over loopback: dial-back verdicts, the server's safety rules, the evidence rule."""

from __future__ import annotations

import trio

from volunteer.net.stack import open_stack
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.autonat import (
    AutoNATServer,
    Reachability,
    ReachabilityTracker,
    dialable_addrs,
    per_peer_limiter,
    probe,
)
from volunteer.net.nat.manager import NatManager


async def test_listening_client_is_reachable_and_silent_one_is_not():
    with trio.fail_after(30):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as server, open_stack(
            listen=["/ip4/127.0.0.1/tcp/0"]
        ) as client, open_stack() as closed:
            await server.add_service(AutoNATServer())
            result = await probe(client, server.full_addrs()[0], client.addrs)
            assert result.reachable is True and result.addr == client.addrs[0]
            # An address nobody listens on: the dial back fails (E_DIAL_ERROR).
            result = await probe(closed, server.full_addrs()[0], [Multiaddr("/ip4/127.0.0.1/tcp/1")])
            assert result.reachable is False
            # Addresses on another IP than the one the server sees are never dialed.
            result = await probe(closed, server.full_addrs()[0], [Multiaddr("/ip4/203.0.113.9/tcp/4001")])
            assert result.reachable is None and "observed IP" in result.text


async def test_rate_limit_refuses():
    with trio.fail_after(30):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as server, open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as client:
            await server.add_service(AutoNATServer(per_peer=per_peer_limiter(1)))
            assert (await probe(client, server.full_addrs()[0], client.addrs)).reachable is True
            result = await probe(client, server.full_addrs()[0], client.addrs)
            assert result.reachable is None and "rate" in result.text


async def test_nat_manager_decides_public():
    with trio.fail_after(30):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as server, open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as client:
            await server.add_service(AutoNATServer())
            manager = NatManager(client, [server.full_addrs()[0]])
            assert await manager.probe_round() is Reachability.PUBLIC
            snapshot = manager.snapshot()
            assert snapshot["reachability"] == "public" and snapshot["evidence"]["required"] == 1
            # the address the server reached us on is advertised (behind a forwarded port it is
            # the only one others can dial)
            assert manager.advertised_addrs() == [client.addrs[0]] == [Multiaddr(snapshot["confirmed_addr"])]


def test_a_private_or_undecided_node_advertises_no_confirmed_address():
    manager = NatManager(None, [])
    assert manager.advertised_addrs() == []  # unknown
    server = KeyPair.generate().peer_id
    manager.tracker.record(server, True, Multiaddr("/ip4/203.0.113.7/tcp/4001"))
    assert manager.advertised_addrs() == [Multiaddr("/ip4/203.0.113.7/tcp/4001")]
    manager.tracker.record(server, False)
    assert manager.tracker.status is Reachability.PRIVATE and manager.advertised_addrs() == []


def test_tracker_needs_agreeing_distinct_servers_and_does_not_flap():
    peers = [KeyPair.generate().peer_id for _ in range(5)]
    tracker = ReachabilityTracker(required=3)
    assert tracker.record(peers[0], True) is Reachability.UNKNOWN
    assert tracker.record(peers[0], True) is Reachability.UNKNOWN  # the same server twice is one voice
    tracker.record(peers[1], True)
    assert tracker.record(peers[2], True) is Reachability.PUBLIC
    assert tracker.record(peers[3], False) is Reachability.PUBLIC  # one dissent does not flip it
    tracker.record(peers[4], False)
    tracker.record(peers[0], False)
    assert tracker.record(peers[1], False) is Reachability.PRIVATE


def test_dial_back_filter():
    peer = KeyPair.generate().peer_id
    requested = [
        Multiaddr("/ip4/198.51.100.7/tcp/4001"),
        Multiaddr(f"/ip4/198.51.100.7/tcp/4002/p2p/{peer}"),
        Multiaddr("/ip4/192.0.2.1/tcp/4001"),  # not the observed IP
        Multiaddr(f"/ip4/198.51.100.7/tcp/4001/p2p/{peer}/p2p-circuit"),  # relayed
        Multiaddr("/ip4/198.51.100.7/udp/4001"),  # bare UDP: nothing to dial back
        Multiaddr("/ip4/198.51.100.7/udp/4001/quic-v1"),  # QUIC: dialled back too
    ] + [Multiaddr(f"/ip4/198.51.100.7/tcp/{5000 + i}") for i in range(10)]
    addrs = dialable_addrs(requested, "198.51.100.7")
    assert addrs[:3] == [Multiaddr("/ip4/198.51.100.7/tcp/4001"), Multiaddr("/ip4/198.51.100.7/tcp/4002"),
                         Multiaddr("/ip4/198.51.100.7/udp/4001/quic-v1")]
    assert len(addrs) == 4 and all(a.value_for("ip4") == "198.51.100.7" for a in addrs)


async def test_nat_manager_publishes_reachability_changes():
    from volunteer.net.events import ReachabilityChanged

    with trio.fail_after(30):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as server, open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as client:
            await server.add_service(AutoNATServer())
            manager = NatManager(client, [server.full_addrs()[0]])
            with client.events.subscribe(ReachabilityChanged) as changes:
                await client.add_service(manager)  # runs its first probe round at once
                event = await changes.receive()
            assert isinstance(event, ReachabilityChanged) and event.reachability is Reachability.PUBLIC
            assert manager.reservations is None  # public: no relay slots needed


async def test_a_quic_listener_is_dialled_back_over_quic_from_a_fresh_port():
    with trio.fail_after(30):
        quic = "/ip4/127.0.0.1/udp/0/quic-v1"
        async with open_stack(listen=[quic]) as server, open_stack(listen=[quic]) as client:
            await server.add_service(AutoNATServer())
            result = await probe(client, server.full_addrs()[0], client.addrs)
            assert result.reachable is True and result.addr == client.addrs[0]
            # the dial-back came from another port than the server's shared socket
            dial_backs = [c for c in client.connections(server.peer_id) if c.direction.value == "inbound"]
            assert all(c.remote_addr.value_for("udp") != server.listen_addrs[0].value_for("udp") for c in dial_backs)
