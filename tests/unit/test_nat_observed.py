"""Observed addresses and the NAT mapping they imply (pure: ``now`` passed in)."""

from __future__ import annotations

import trio

from volunteer.net import limits
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.observed import MappingType, ObservedAddrs

PEERS = [KeyPair.generate().peer_id for _ in range(4)]
LOCAL = Multiaddr("/ip4/192.0.2.2/tcp/4001")
EXTERNAL = Multiaddr("/ip4/203.0.113.101/tcp/4001")


def observer(i: int) -> Multiaddr:
    return Multiaddr(f"/ip4/198.51.100.{i}/tcp/4001")


def test_one_external_address_seen_by_two_observers_is_endpoint_independent():
    observed = ObservedAddrs()
    observed.record(PEERS[0], observer(1), LOCAL, EXTERNAL, now=0)
    assert observed.mapping(1, 4001) is MappingType.UNKNOWN  # one observer is not evidence enough
    observed.record(PEERS[1], observer(2), LOCAL, EXTERNAL, now=1)
    assert observed.mapping(2, 4001) is MappingType.ENDPOINT_INDEPENDENT
    assert observed.external_addrs(2, [Multiaddr("/ip4/0.0.0.0/tcp/4001")]) == [EXTERNAL]


def test_different_ports_per_destination_mean_a_symmetric_nat():
    observed = ObservedAddrs()
    observed.record(PEERS[0], observer(1), LOCAL, EXTERNAL, now=0)
    observed.record(PEERS[1], observer(2), LOCAL, Multiaddr("/ip4/203.0.113.101/tcp/5555"), now=0)
    assert observed.mapping(1, 4001) is MappingType.ENDPOINT_DEPENDENT


def test_two_peers_behind_one_ip_count_once():
    observed = ObservedAddrs()
    observed.record(PEERS[0], observer(1), LOCAL, EXTERNAL, now=0)
    observed.record(PEERS[1], observer(1), LOCAL, EXTERNAL, now=0)
    assert observed.mapping(1, 4001) is MappingType.UNKNOWN


def test_relayed_and_stale_observations_say_nothing():
    observed = ObservedAddrs()
    relayed = Multiaddr(f"/ip4/198.51.100.1/tcp/1/p2p/{PEERS[3]}/p2p-circuit")
    observed.record(PEERS[0], relayed, LOCAL, EXTERNAL, now=0)
    assert len(observed) == 0
    observed.record(PEERS[0], observer(1), LOCAL, EXTERNAL, now=0)
    observed.record(PEERS[1], observer(2), LOCAL, EXTERNAL, now=0)
    assert observed.external_addrs(limits.OBSERVATION_TTL + 1, [LOCAL]) == []


def test_external_addrs_follow_the_listen_port_most_reported_first_and_bounded():
    observed = ObservedAddrs()
    popular = Multiaddr("/ip4/203.0.113.7/tcp/4001")
    observed.record(PEERS[0], observer(1), LOCAL, EXTERNAL, now=0)
    observed.record(PEERS[1], observer(2), LOCAL, popular, now=0)
    observed.record(PEERS[2], observer(3), LOCAL, popular, now=0)
    other_port = Multiaddr("/ip4/192.0.2.2/tcp/9999")
    observed.record(PEERS[3], observer(4), other_port, Multiaddr("/ip4/203.0.113.9/tcp/9999"), now=0)
    assert observed.external_addrs(1, [LOCAL]) == [popular, EXTERNAL]
    assert len(observed.external_addrs(1, [])) == 3  # no listen port: every observation counts


def test_memory_is_bounded():
    observed = ObservedAddrs()
    for i in range(limits.MAX_OBSERVATIONS + 50):
        peer = KeyPair.generate().peer_id
        observed.record(peer, observer(i % 250), LOCAL, EXTERNAL, now=i)
    assert len(observed) == limits.MAX_OBSERVATIONS


class _FakeConnection:
    def __init__(self, remote: Multiaddr) -> None:
        self.remote_addr = remote
        self.local_addr = LOCAL


class _FakeHost:
    def __init__(self) -> None:
        from volunteer.net.events import EventBus

        self.events = EventBus()
        self.listen_addrs = [LOCAL]


def test_the_observer_publishes_only_when_the_set_of_addresses_changes():
    from volunteer.net.events import ObservedAddrChanged, PeerIdentified
    from volunteer.net.identify import IdentifyInfo
    from volunteer.net.nat.observer import AddressObserver

    watcher = AddressObserver()
    watcher.host = _FakeHost()
    published = watcher.host.events.subscribe(ObservedAddrChanged)

    def identified(i: int, seen: Multiaddr | None) -> PeerIdentified:
        return PeerIdentified(PEERS[i], _FakeConnection(observer(i + 1)), IdentifyInfo(observed_addr=seen))

    watcher.note(identified(0, EXTERNAL), now=0)
    watcher.note(identified(1, EXTERNAL), now=1)  # same set: nothing new
    watcher.note(identified(2, None), now=2)  # nothing observed: nothing new
    watcher.note(identified(3, Multiaddr("/ip4/203.0.113.9/tcp/4001")), now=3)
    events = []
    while True:
        try:
            events.append(published._receive.receive_nowait())
        except trio.WouldBlock:
            break
    assert [set(e.addrs) for e in events] == [{EXTERNAL}, {EXTERNAL, Multiaddr("/ip4/203.0.113.9/tcp/4001")}]
    assert watcher.external_addrs(4)[0] == EXTERNAL and watcher.mapping(4) is MappingType.ENDPOINT_DEPENDENT


def test_quic_and_tcp_are_observed_apart_and_missing_ones_are_named():
    observed = ObservedAddrs()
    quic_local = Multiaddr("/ip4/192.0.2.2/udp/4001/quic-v1")
    quic_seen = Multiaddr("/ip4/203.0.113.101/udp/4001/quic-v1")
    listen = [Multiaddr("/ip4/0.0.0.0/tcp/4001"), Multiaddr("/ip4/0.0.0.0/udp/4001/quic-v1")]
    observed.record(PEERS[0], observer(1), LOCAL, EXTERNAL, now=0)
    assert observed.missing(1, listen) == {"quic"}
    # a peer reporting a TCP address for a QUIC connection tells us nothing
    observed.record(PEERS[0], Multiaddr("/ip4/198.51.100.1/udp/4001/quic-v1"), quic_local, EXTERNAL, now=0)
    assert observed.missing(1, listen) == {"quic"}
    observed.record(PEERS[0], Multiaddr("/ip4/198.51.100.1/udp/4001/quic-v1"), quic_local, quic_seen, now=0)
    assert observed.missing(1, listen) == set()
    assert observed.external_addrs(1, listen) == [EXTERNAL, quic_seen]  # TCP first, then QUIC
    # the same port number over TCP and UDP are different mappings
    assert observed.mapping(1, 4001, transport="tcp") is MappingType.UNKNOWN
    assert len(observed) == 2


def test_the_probe_dials_the_peer_at_the_ip_we_already_reach_it_on():
    from volunteer.net.nat.observed import probe_target

    relay_addrs = [Multiaddr("/ip4/10.0.0.1/udp/4001/quic-v1"), Multiaddr("/ip4/198.51.100.1/udp/4001/quic-v1"),
                   Multiaddr("/ip4/198.51.100.1/tcp/4001")]
    assert probe_target(relay_addrs, observer(1), "quic") == Multiaddr("/ip4/198.51.100.1/udp/4001/quic-v1")
    assert probe_target(relay_addrs[:1], observer(1), "quic") is None
    assert probe_target(relay_addrs, Multiaddr("/memory/5"), "quic") is None
