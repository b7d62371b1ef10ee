"""When an observation of our address can still come (``AddressObserver.awaiting``): a hole
punch waits for one only then. Identify is counted by connection, not by peer: an observation
dial over QUIC reaches a relay that TCP identified long ago, and its own identify is the one
that tells us our QUIC address."""

from types import SimpleNamespace

import pytest

from volunteer.net.multiaddr import Multiaddr
from volunteer.net import limits
from volunteer.net.nat.observer import AddressObserver, _grace
from volunteer.net.transport.quic import QuicTransport

NOW = 100.0


def host_with(connections, answering=lambda ip: False):
    """A host whose QUIC transport says whether a dial to an IP hears from it."""
    quic = SimpleNamespace(answering=answering)
    return SimpleNamespace(connections=connections, service=lambda cls: quic if cls is QuicTransport else None)


def conn(ident: int, addr: str):
    return SimpleNamespace(id=ident, is_closed=False, remote_addr=Multiaddr(addr), remote_peer="relay")


def test_an_unidentified_connection_to_an_identified_peer_still_brings_an_observation():
    observer = AddressObserver()
    tcp, quic = conn(1, "/ip4/203.0.113.10/tcp/4001"), conn(2, "/ip4/203.0.113.10/udp/4001/quic-v1")
    connections = [tcp]
    observer.host = host_with(lambda: list(connections))
    assert observer.awaiting("quic", NOW)  # TCP's identify is in flight: it may start a QUIC observation dial
    observer._identified.add(1)
    assert not observer.awaiting("quic", NOW)  # identified, no dial: nothing can come
    observer._probing["quic"] = [(NOW + 0.5, "203.0.113.10")]
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
    observer.host = host_with(lambda: [relayed])
    assert not observer.awaiting("tcp", NOW)


def test_an_observation_dial_that_hears_nothing_holds_a_punch_only_for_its_grace():
    """An office drops UDP: its QUIC observation dial stays in flight until the dial's timeout,
    and a punch that waited for it all along went late by the whole observation wait."""
    observer = AddressObserver()
    tcp = conn(1, "/ip4/203.0.113.10/tcp/4001")
    heard: set[str] = set()
    observer.host = host_with(lambda: [tcp], answering=lambda ip: ip in heard)
    observer._identified.add(1)
    grace = _grace(0.02)  # the TCP identify that started the dial took 20 ms
    assert grace == limits.OBSERVATION_DIAL_GRACE < limits.DCUTR_OBSERVATION_WAIT
    observer._probing["quic"] = [(NOW + grace, "203.0.113.10")]
    assert observer.awaiting("quic", NOW + grace / 2)
    assert not observer.awaiting("quic", NOW + grace)  # still dialling, hearing nothing: no longer worth a wait
    heard.add("203.0.113.10")  # a loaded machine: the peer answers, the handshake is slow
    assert observer.awaiting("quic", NOW + grace)


def test_the_grace_grows_with_a_slow_identify_up_to_the_whole_wait():
    """A loaded machine is slow at the TCP identify and at the QUIC handshake alike: the grace
    scales with the one so the other is still waited for, never past the punch's whole wait."""
    assert _grace(0.0) == _grace(-1.0) == limits.OBSERVATION_DIAL_GRACE
    assert _grace(0.15) == pytest.approx(limits.OBSERVATION_DIAL_GRACE_FACTOR * 0.15)
    assert _grace(5.0) == limits.DCUTR_OBSERVATION_WAIT


def test_a_quic_dial_is_answering_once_it_heard_from_its_peer_until_its_handshake_ends():
    """What tells a loaded machine's slow handshake from a firewall that lets nothing back."""
    import trio

    from volunteer.net.transport.quic.endpoint import UdpEndpoint

    dial = SimpleNamespace(is_client=True, bytes_received=0, handshake_done=trio.Event(), remote=("203.0.113.10", 4001))
    inbound = SimpleNamespace(is_client=False, bytes_received=1200, handshake_done=trio.Event(), remote=("203.0.113.10", 5001))
    endpoint = SimpleNamespace(sessions=[dial, inbound])
    assert not UdpEndpoint.answering(endpoint, "203.0.113.10")  # sent its Initial, heard nothing
    dial.bytes_received = 1200
    assert UdpEndpoint.answering(endpoint, "203.0.113.10") and not UdpEndpoint.answering(endpoint, "203.0.113.11")
    dial.handshake_done.set()
    assert not UdpEndpoint.answering(endpoint, "203.0.113.10")  # done: its identify is what may still come


def test_a_punch_offers_its_quic_port_at_its_tcp_observed_ip_until_quic_is_observed():
    """A fresh volunteer's QUIC observation may come after its first punch starts (a loaded
    machine, or UDP dropped): the CONNECT still names a QUIC address, as a port-keeping NAT maps
    it, so the peer can aim birthday probes at us on the first attempt."""
    from volunteer.net.nat.observed import port_kept_guess

    listen = [Multiaddr("/ip4/0.0.0.0/tcp/4001"), Multiaddr("/ip4/0.0.0.0/udp/4002/quic-v1")]
    tcp_seen = [Multiaddr("/ip4/203.0.113.101/tcp/4001")]
    assert port_kept_guess(tcp_seen, listen) == [Multiaddr("/ip4/203.0.113.101/udp/4002/quic-v1")]
    quic_seen = tcp_seen + [Multiaddr("/ip4/203.0.113.101/udp/27001/quic-v1")]
    assert port_kept_guess(quic_seen, listen) == []  # observed: no guessing
    assert port_kept_guess(tcp_seen, listen[:1]) == []  # no QUIC listen port
    assert port_kept_guess([Multiaddr("/ip6/2001:db8::1/tcp/4001")], listen) == []
