"""DCUtR messages: round trips, bounds, and random bytes that never crash the decoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import RemoteProtocolError
from volunteer.net import limits
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat import messages
from volunteer.net.varint import decode_uvarint


def body_of(encoded: bytes) -> bytes:
    length, start = decode_uvarint(encoded, 0)
    assert len(encoded) == start + length
    return encoded[start:]


def test_connect_round_trip_and_sync_without_addresses():
    addrs = [Multiaddr("/ip4/203.0.113.1/tcp/4001"), Multiaddr("/ip6/2001:db8::1/tcp/4001")]
    decoded = messages.decode(body_of(messages.encode(messages.CONNECT, addrs)), messages.CONNECT)
    assert decoded.kind == messages.CONNECT and list(decoded.addrs) == addrs
    assert messages.decode(body_of(messages.encode(messages.SYNC)), messages.SYNC).addrs == ()


def test_wrong_type_and_oversized_messages_are_refused():
    with pytest.raises(RemoteProtocolError, match="expected dcutr SYNC"):
        messages.decode(body_of(messages.encode(messages.CONNECT)), messages.SYNC)
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        messages.decode(b"\x08\x64" + b"\x00" * limits.DCUTR_MAX_MESSAGE, messages.CONNECT)


def test_only_direct_tcp_and_quic_addresses_survive_and_at_most_four_of_each():
    peer = KeyPair.generate().peer_id
    raw = [Multiaddr(f"/ip4/203.0.113.{i}/tcp/4001").to_bytes() for i in range(6)]
    raw += [Multiaddr(f"/ip4/203.0.113.{i}/udp/4001/quic-v1").to_bytes() for i in range(6)]
    raw.insert(0, Multiaddr(f"/ip4/203.0.113.9/tcp/1/p2p/{peer}/p2p-circuit").to_bytes())
    raw.insert(0, Multiaddr("/ip4/203.0.113.9/udp/1/quic").to_bytes())  # draft QUIC: not ours to dial
    raw.insert(0, Multiaddr("/ip4/203.0.113.9/udp/1").to_bytes())
    raw.insert(0, b"\xff\xff garbage")
    addrs = messages.punchable(raw)
    assert [a.protocols() for a in addrs] == [["ip4", "tcp"]] * 4 + [["ip4", "udp", "quic-v1"]] * 4
    # A peer ID on an address is dropped (we dial the peer we expect, whatever it says).
    assert messages.punchable([Multiaddr(f"/ip4/203.0.113.1/tcp/5/p2p/{peer}").to_bytes()]) == [Multiaddr("/ip4/203.0.113.1/tcp/5")]


def test_addresses_past_the_read_bound_are_not_even_parsed():
    junk = [b"\x00"] * limits.DCUTR_MAX_ADDRS_READ
    good = Multiaddr("/ip4/203.0.113.1/tcp/4001").to_bytes()
    assert messages.punchable(junk + [good]) == []


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=600), st.sampled_from([messages.CONNECT, messages.SYNC]))
def test_random_bytes_never_crash(data, expected):
    try:
        decoded = messages.decode(data, expected)
    except RemoteProtocolError:
        return
    assert decoded.kind == expected and len(decoded.addrs) <= 2 * limits.DCUTR_MAX_PUNCH_ADDRS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=40))
def test_random_address_bytes_never_crash(raw):
    addrs = messages.punchable(raw)
    assert len(addrs) <= 2 * limits.DCUTR_MAX_PUNCH_ADDRS and all(messages.punch_transport(a) for a in addrs)
