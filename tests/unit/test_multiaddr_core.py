"""Multiaddr text/binary forms (vectors from the multiaddr spec and go-multiaddr) and errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import MultiaddrError
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr

VECTORS = [
    ("/ip4/127.0.0.1/tcp/4001", "047f000001060fa1"),
    ("/ip4/1.2.3.4/udp/4001/quic-v1", "040102030491020fa1cd03"),
    ("/ip6/::1/tcp/1", "2900000000000000000000000000000001060001"),
    ("/dns4/localhost/tcp/5", "36096c6f63616c686f7374060005"),
    ("/dnsaddr/example.com", "380b6578616d706c652e636f6d"),
    ("/ip4/127.0.0.1/udp/1234", "047f000001910204d2"),
    ("/p2p-circuit", "a202"),
    (
        "/p2p/QmcgpsyWgH8Y8ajJz1Cu72KnS5uo2Aa2LpzU7kinSupNKC",
        "a503221220d52ebb89d85b02a284948203a62ff28389c57c9f42beec4ec20db76a68911c0b",
    ),
]


@pytest.mark.parametrize("text, hexed", VECTORS)
def test_vectors(text, hexed):
    addr = Multiaddr(text)
    assert addr.to_bytes().hex() == hexed
    assert str(Multiaddr.from_bytes(bytes.fromhex(hexed))) == text
    assert Multiaddr(addr.to_bytes()) == addr and hash(Multiaddr(text)) == hash(addr)


def test_ipfs_alias_and_normalisation():
    peer = "QmcgpsyWgH8Y8ajJz1Cu72KnS5uo2Aa2LpzU7kinSupNKC"
    assert str(Multiaddr(f"/ipfs/{peer}")) == f"/p2p/{peer}"
    assert str(Multiaddr("/ip6/0:0:0:0:0:0:0:1/tcp/1")) == "/ip6/::1/tcp/1"


def test_relay_addresses():
    relay, target = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    addr = Multiaddr(f"/ip4/198.51.100.1/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{target}")
    assert addr.is_relayed() and addr.peer_id == target
    relay_addr, relay_target = addr.relay_parts()
    assert relay_addr == Multiaddr(f"/ip4/198.51.100.1/tcp/4001/p2p/{relay}") and relay_target == target
    assert addr.without_peer_id() == Multiaddr(f"/ip4/198.51.100.1/tcp/4001/p2p/{relay}/p2p-circuit")
    assert addr.decapsulate("/p2p-circuit") == relay_addr
    assert addr.decapsulate_code("p2p") == addr.without_peer_id()
    assert not Multiaddr("/ip4/1.2.3.4/tcp/1").is_relayed()
    assert Multiaddr("/ip4/1.2.3.4/tcp/1").relay_parts() is None


def test_encapsulation_and_lookup():
    base = Multiaddr("/ip4/10.0.0.1/tcp/80")
    peer = KeyPair.generate().peer_id
    full = base.with_peer_id(peer)
    assert full.with_peer_id(peer) == full
    assert full.without_peer_id() == base
    assert full.protocols() == ["ip4", "tcp", "p2p"]
    assert full.value_for("tcp") == "80" and full.value_for("udp") is None
    assert base.encapsulate("/p2p-circuit").decapsulate("/p2p-circuit") == base
    assert str(Multiaddr("/memory/7")) == "/memory/7"
    assert str(Multiaddr("/unix/tmp/s.sock")) == "/unix/tmp/s.sock"


@pytest.mark.parametrize(
    "bad, hint",
    [
        ("/ip4/1.2.3/tcp/1", "1.2.3"),
        ("ip4/1.2.3.4", "starts with"),
        ("/tcp/99999", "99999"),
        ("/tcp/-1", "-1"),
        ("/foo/1", "unknown protocol"),
        ("/ip4", "needs a value"),
        ("/p2p/notapeer", "p2p"),
        ("/ip6/zz::1", "ip6"),
    ],
)
def test_malformed_text_is_explained(bad, hint):
    with pytest.raises(MultiaddrError, match=hint):
        Multiaddr(bad)


@pytest.mark.parametrize("hexed", ["04", "047f0000", "0601", "a503", "a50322", "ff", "8080808080808080808001", "3800"])
def test_malformed_binary(hexed):
    with pytest.raises(MultiaddrError):
        Multiaddr.from_bytes(bytes.fromhex(hexed))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_only_raise_multiaddr_error(data):
    try:
        addr = Multiaddr.from_bytes(data)
    except MultiaddrError:
        return
    assert Multiaddr(str(addr)) == addr


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["ip4", "tcp", "udp", "p2p", "p2p-circuit", "1.2.3.4", "80", "x", "", "dns4", "::1", "ip6"]), max_size=8))
def test_random_text_only_raises_multiaddr_error(parts):
    try:
        Multiaddr("/" + "/".join(parts))
    except MultiaddrError:
        pass
