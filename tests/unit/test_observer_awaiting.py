"""When an observation of our address can still come (``AddressObserver.awaiting``): a hole
punch waits for one only then. Identify is counted by connection, not by peer: an observation
dial over QUIC reaches a relay that TCP identified long ago, and its own identify is the one
that tells us our QUIC address."""

from types import SimpleNamespace

from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.observer import AddressObserver


def conn(ident: int, addr: str):
    return SimpleNamespace(id=ident, is_closed=False, remote_addr=Multiaddr(addr), remote_peer="relay")


def test_an_unidentified_connection_to_an_identified_peer_still_brings_an_observation():
    observer = AddressObserver()
    tcp, quic = conn(1, "/ip4/203.0.113.10/tcp/4001"), conn(2, "/ip4/203.0.113.10/udp/4001/quic-v1")
    connections = [tcp]
    observer.host = SimpleNamespace(connections=lambda: list(connections))
    assert observer.awaiting("quic")  # TCP's identify is in flight: it may start a QUIC observation dial
    observer._identified.add(1)
    assert not observer.awaiting("quic")  # identified, no dial: nothing can come
    observer._probing["quic"] = 1
    assert observer.awaiting("quic")  # an observation dial in flight
    observer._probing["quic"] = 0
    connections.append(quic)
    assert observer.awaiting("quic")  # the dial's connection is up, its identify not yet done
    observer._identified.add(2)
    assert not observer.awaiting("quic")
    connections.remove(tcp)
    observer.awaiting("quic")
    assert observer._identified == {2}  # forgotten with its connection


def test_relayed_connections_bring_no_observation():
    observer = AddressObserver()
    relayed = conn(3, "/ip4/203.0.113.10/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit")
    observer.host = SimpleNamespace(connections=lambda: [relayed])
    assert not observer.awaiting("tcp")
