"""Which of our addresses a peer may use, and which of a peer's we keep (``net.addresses``)."""

from volunteer.net import addresses, interfaces
from volunteer.net.addresses import LINK_LOCAL, LOOPBACK, PRIVATE, PUBLIC, for_peer, ip_scope, shareable, usable_across
from volunteer.net.multiaddr import Multiaddr as M

LOOP = M("/ip4/127.0.0.1/tcp/4001")
LOOP6 = M("/ip6/::1/udp/4001/quic-v1")
LINK = M("/ip6/fe80::1/tcp/4001")
LINK4 = M("/ip4/169.254.3.4/tcp/4001")
LAN = M("/ip4/192.168.1.5/tcp/4001")
CGNAT = M("/ip4/100.64.0.7/udp/4001/quic-v1")
PUB = M("/ip4/198.51.100.7/tcp/4001")
CIRCUIT_PUB = M("/ip4/203.0.113.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit")


def test_scopes_count_documentation_ranges_as_public_and_cgnat_as_private():
    assert ip_scope("127.0.1.1") == LOOPBACK
    assert ip_scope("::1") == LOOPBACK
    assert ip_scope("fe80::1%eth0") == LINK_LOCAL
    assert ip_scope("169.254.0.9") == LINK_LOCAL
    assert ip_scope("10.1.2.3") == PRIVATE
    assert ip_scope("100.64.3.2") == PRIVATE
    assert ip_scope("fd00::2") == PRIVATE
    # the NAT rig's internet: Python's is_private says True for these, we must not
    for ip in ("198.51.100.7", "203.0.113.1", "192.0.2.9", "2001:db8::5"):
        assert ip_scope(ip) == PUBLIC
    assert ip_scope("::ffff:127.0.0.1") == LOOPBACK
    assert ip_scope("not an ip") is None


def test_loopback_only_to_a_peer_on_our_loopback():
    ours = [LOOP, LOOP6, LINK, LINK4, LAN, CGNAT, PUB, CIRCUIT_PUB]
    assert for_peer(ours, M("/ip4/198.51.100.9/tcp/5000")) == [LAN, CGNAT, PUB, CIRCUIT_PUB]
    assert for_peer(ours, M("/ip4/192.168.1.9/tcp/5000")) == [LAN, CGNAT, PUB, CIRCUIT_PUB]
    assert for_peer(ours, None) == [LAN, CGNAT, PUB, CIRCUIT_PUB]
    # a loopback-only testnet keeps working: a peer that reached us over loopback may use it
    assert for_peer(ours, M("/ip4/127.0.0.1/tcp/5000")) == [LOOP, LOOP6, LAN, CGNAT, PUB, CIRCUIT_PUB]
    # a circuit through a relay on our loopback is on our machine too
    via_local_relay = M("/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit")
    assert usable_across(LOOP, via_local_relay)
    assert not usable_across(LOOP, CIRCUIT_PUB)
    # the memory transport names no IP: nothing limits it
    assert usable_across(LOOP, M("/memory/7"))


def test_shareable_never_link_local_and_loopback_only_as_a_last_resort():
    assert shareable([LOOP, LINK, LAN]) == [LAN]
    assert shareable([LOOP, LINK]) == [LOOP]


def test_unspecified_expands_to_interface_addresses_not_the_hostname(monkeypatch):
    # Debian maps the hostname to 127.0.1.1: the interfaces, not the resolver, name our addresses
    monkeypatch.setattr(interfaces, "_interface_ips", lambda: ["127.0.0.1", "192.168.1.5", "169.254.1.1",
                                                               "::1", "fe80::1", "2001:db8::5", "fd00::2", "10.0.0.3"])
    v4 = addresses.expand_unspecified(M("/ip4/0.0.0.0/tcp/4001"))
    assert v4 == [M("/ip4/127.0.0.1/tcp/4001"), M("/ip4/192.168.1.5/tcp/4001"), M("/ip4/10.0.0.3/tcp/4001")]
    v6 = addresses.expand_unspecified(M("/ip6/::/udp/4001/quic-v1"))
    assert v6 == [M("/ip6/::1/udp/4001/quic-v1"), M("/ip6/2001:db8::5/udp/4001/quic-v1"), M("/ip6/fd00::2/udp/4001/quic-v1")]


def test_without_interfaces_the_hostname_stands_in_but_never_as_loopback(monkeypatch):
    monkeypatch.setattr(interfaces, "_interface_ips", lambda: None)
    monkeypatch.setattr(interfaces.socket, "getaddrinfo",
                        lambda *a, **k: [(2, 1, 6, "", ("127.0.1.1", 0)), (2, 1, 6, "", ("10.9.8.7", 0))])
    assert interfaces.interface_ipv4_addrs() == ["10.9.8.7"]
