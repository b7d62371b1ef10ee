"""When an observation of our address can still come (``AddressObserver.awaiting``): a hole
punch waits for one only then. Identify is counted by connection, not by peer: an observation
dial over QUIC reaches a relay that TCP identified long ago, and its own identify is the one
that tells us our QUIC address."""

from types import SimpleNamespace

import pytest

from volunteer.net.multiaddr import Multiaddr
from volunteer.net import limits
from volunteer.net.nat.observer import AddressObserver, _grace

NOW = 100.0


def conn(ident: int, addr: str):
    return SimpleNamespace(id=ident, is_closed=False, remote_addr=Multiaddr(addr), remote_peer="relay")


def test_an_unidentified_connection_to_an_identified_peer_still_brings_an_observation():
    observer = AddressObserver()
    tcp, quic = conn(1, "/ip4/203.0.113.10/tcp/4001"), conn(2, "/ip4/203.0.113.10/udp/4001/quic-v1")
    connections = [tcp]
    observer.host = SimpleNamespace(connections=lambda: list(connections))
    assert observer.awaiting("quic", NOW)  # TCP's identify is in flight: it may start a QUIC observation dial
    observer._identified.add(1)
    assert not observer.awaiting("quic", NOW)  # identified, no dial: nothing can come
    observer._probing["quic"] = [NOW + 0.5]
    assert observer.awaiting("quic", NOW)  # an observation dial in flight
    observer._probing["quic"] = []
    connections.append(quic)
    assert observer.awaiting("quic", NOW)  # the dial's connection is up, its identify not yet done
    observer._identified.add(2)
    assert not observer.awaiting("quic", NOW)
    connections.remove(tcp)
    observer.awaiting("quic", NOW)
    assert observer._identified == {2}  # forgotten with its connection


def test_relayed_connections_bring_no_observation():
    observer = AddressObserver()
    relayed = conn(3, "/ip4/203.0.113.10/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit")
    observer.host = SimpleNamespace(connections=lambda: [relayed])
    assert not observer.awaiting("tcp", NOW)


def test_an_observation_dial_that_hears_nothing_holds_a_punch_only_for_its_grace():
    """An office drops UDP: its QUIC observation dial stays in flight until the dial's timeout,
    and a punch that waited for it all along went late by the whole observation wait."""
    observer = AddressObserver()
    tcp = conn(1, "/ip4/203.0.113.10/tcp/4001")
    observer.host = SimpleNamespace(connections=lambda: [tcp])
    observer._identified.add(1)
    grace = _grace(0.02)  # the TCP identify that started the dial took 20 ms
    assert grace == limits.OBSERVATION_DIAL_GRACE < limits.DCUTR_OBSERVATION_WAIT
    observer._probing["quic"] = [NOW + grace]
    assert observer.awaiting("quic", NOW + grace / 2)
    assert not observer.awaiting("quic", NOW + grace)  # still dialling, no longer worth a wait


def test_the_grace_grows_with_a_slow_identify_up_to_the_whole_wait():
    """A loaded machine is slow at the TCP identify and at the QUIC handshake alike: the grace
    scales with the one so the other is still waited for, never past the punch's whole wait."""
    assert _grace(0.0) == _grace(-1.0) == limits.OBSERVATION_DIAL_GRACE
    assert _grace(0.15) == pytest.approx(limits.OBSERVATION_DIAL_GRACE_FACTOR * 0.15)
    assert _grace(5.0) == limits.DCUTR_OBSERVATION_WAIT
