"""The QUIC cores without sockets or trio: the datagram router, handshake admission, and the
engine (aioquic configured for libp2p) paired with another engine by handing datagrams across."""

from __future__ import annotations

import os

import pytest
from aioquic.quic import events
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import HandshakeError
from volunteer.net.identity import KeyPair
from volunteer.net.tls import ALPN, make_certificate, peer_of_certificate
from volunteer.net.transport.quic.demux import MIN_INITIAL_SIZE, Admission, route
from volunteer.net.transport.quic.engine import Engine, QuicLimits, configuration

CLIENT_ADDR = ("127.0.0.2", 4001)
SERVER_ADDR = ("127.0.0.3", 4002)
WALL = 1_800_000_000.0
LIMITS = QuicLimits(stream_window=64 * 1024, connection_window=256 * 1024)


def engines(client_id=None, server_id=None, quic_limits=LIMITS):
    client_id, server_id = client_id or KeyPair.generate(), server_id or KeyPair.generate()
    client = Engine(configuration=configuration(make_certificate(client_id, now=WALL), is_client=True, quic_limits=quic_limits),
                    quic_limits=quic_limits)
    client.connect(SERVER_ADDR, now=0.0)
    first = client.datagrams_to_send(now=0.0)
    found = route(first[0][0])
    assert found is not None and found.opens_connection
    server = Engine(configuration=configuration(make_certificate(server_id, now=WALL), is_client=False, quic_limits=quic_limits),
                    quic_limits=quic_limits, original_destination_connection_id=found.destination_cid)
    for data, _ in first:
        server.receive_datagram(data, CLIENT_ADDR, now=0.0)
    return client, server


def exchange(client: Engine, server: Engine, now: float = 0.0, rounds: int = 20, step: float = 0.001) -> tuple[list, list]:
    """Hand datagrams back and forth until both are quiet, ``step`` seconds apart (about half a
    round trip); the events each side saw."""
    seen_client, seen_server = [], []
    for _ in range(rounds):
        now += step  # pacing spreads a burst over time: let time pass between rounds
        moved = False
        for data, _ in server.datagrams_to_send(now=now):
            client.receive_datagram(data, SERVER_ADDR, now=now)
            moved = True
        for data, _ in client.datagrams_to_send(now=now):
            server.receive_datagram(data, CLIENT_ADDR, now=now)
            moved = True
        for engine, seen in ((client, seen_client), (server, seen_server)):
            while (event := engine.next_event()) is not None:
                seen.append(event)
        if not moved:
            break
    return seen_client, seen_server


def test_handshake_negotiates_libp2p_and_both_sides_present_certificates():
    alice, bob = KeyPair.generate(), KeyPair.generate()
    client, server = engines(alice, bob)
    seen_client, seen_server = exchange(client, server)
    assert any(isinstance(e, events.HandshakeCompleted) and e.alpn_protocol == ALPN for e in seen_client)
    assert any(isinstance(e, events.HandshakeCompleted) for e in seen_server)
    # the server asked for the client's certificate (libp2p TLS: mutual authentication)
    assert peer_of_certificate(server.peer_certificate(), now=WALL) == alice.peer_id
    assert peer_of_certificate(client.peer_certificate(), now=WALL, expected=bob.peer_id) == bob.peer_id
    assert server.peer_certificate_chain_length() == client.peer_certificate_chain_length() == 0


def test_credit_follows_what_the_application_read():
    client, server = engines()
    exchange(client, server)
    stream_id = client.get_next_available_stream_id()
    client.send_stream_data(stream_id, os.urandom(1024 * 1024))
    received = 0
    for step in range(10):
        _, seen_server = exchange(client, server, now=step * 0.01)
        received += sum(len(e.data) for e in seen_server if isinstance(e, events.StreamDataReceived))
    # nobody read: the peer got exactly one stream window, however often datagrams flowed
    assert received == LIMITS.stream_window
    server.consumed(stream_id, received)
    assert server.credit_due(stream_id)
    for step in range(10):
        _, seen_server = exchange(client, server, now=1 + step * 0.01)
        received += sum(len(e.data) for e in seen_server if isinstance(e, events.StreamDataReceived))
    assert received == 2 * LIMITS.stream_window


def test_connection_window_bounds_all_streams_together():
    client, server = engines()
    exchange(client, server)
    for _ in range(8):  # 8 streams of one window each: twice the connection window
        client.send_stream_data(client.get_next_available_stream_id(), os.urandom(LIMITS.stream_window))
    received = 0
    for step in range(20):
        _, seen_server = exchange(client, server, now=step * 0.01)
        received += sum(len(e.data) for e in seen_server if isinstance(e, events.StreamDataReceived))
    assert received == LIMITS.connection_window


def test_peer_streams_are_bounded():
    quic_limits = QuicLimits(max_streams=4)
    client, server = engines(quic_limits=quic_limits)
    exchange(client, server)
    for _ in range(6):
        client.send_stream_data(client.get_next_available_stream_id(), b"x")
    _, seen_server = exchange(client, server, now=1.0)
    opened = {e.stream_id for e in seen_server if isinstance(e, events.StreamDataReceived)}
    assert len(opened) == 4  # the rest wait for the peer's MAX_STREAMS, no error


@given(st.binary(max_size=1500))
@settings(max_examples=500, deadline=None)
def test_random_datagrams_route_or_are_refused_without_crashing(data):
    found = route(data)
    if found is not None and found.opens_connection:
        assert len(data) >= MIN_INITIAL_SIZE and data[0] & 0x80


def test_routes_short_and_long_headers():
    client, _ = engines()
    initial = client.datagrams_to_send(now=0.0)
    assert not initial  # already taken by engines(); a fresh client shows its Initial
    fresh = Engine(configuration=configuration(make_certificate(KeyPair.generate(), now=WALL), is_client=True, quic_limits=LIMITS),
                   quic_limits=LIMITS)
    fresh.connect(SERVER_ADDR, now=0.0)
    datagram = fresh.datagrams_to_send(now=0.0)[0][0]
    found = route(datagram)
    assert found is not None and found.opens_connection and len(found.destination_cid) == 8
    assert route(datagram[:1000]) == type(found)(found.destination_cid, False)  # too short to open one
    cid = os.urandom(8)
    assert route(bytes([0x40]) + cid + os.urandom(30)).destination_cid == cid
    assert route(bytes([0x00]) + os.urandom(40)) is None  # fixed bit clear: a punch packet, not QUIC


def test_admission_bounds_handshakes_per_address_and_in_all():
    admission = Admission(max_pending=4, per_address=2, max_connections=5)
    assert admission.admit("a") and admission.admit("a")
    assert not admission.admit("a")
    assert admission.admit("b") and admission.admit("c")
    assert not admission.admit("d")  # four pending in all
    admission.handshake_over("a")
    assert admission.admit("d")
    assert not admission.admit("e")  # five connections admitted: the table is full
    admission.connection_over()
    admission.handshake_over("b")
    assert admission.admit("e")
    assert admission.dropped == {"address_pending_handshakes": 1, "pending_handshakes": 1, "connection_limit": 1}


def test_a_certificate_refused_by_the_libp2p_rules_is_a_handshake_error():
    # aioquic accepts any self-signed certificate (CERT_NONE); the libp2p check is ours
    _, server = engines()
    with pytest.raises(HandshakeError):
        peer_of_certificate(b"not a certificate", now=WALL)
