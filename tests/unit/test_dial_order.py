"""Which of a peer's addresses a dial tries first, and how long each waits for the one before."""

from __future__ import annotations

from volunteer.net.multiaddr import Multiaddr


def test_dials_try_tcp_then_quic_then_relays():
    from volunteer.net import limits
    from volunteer.net.dialing import attempt_delay, dial_order
    from volunteer.net.identity import KeyPair

    peer, relay = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    quic, tcp = Multiaddr("/ip4/203.0.113.5/udp/4001/quic-v1"), Multiaddr("/ip4/203.0.113.5/tcp/4001")
    circuit = Multiaddr(f"/ip4/203.0.113.9/tcp/4001/p2p/{relay}/p2p-circuit")
    order = dial_order(peer, [circuit, quic, tcp])
    assert order[:2] == [tcp, quic] and order[2].is_relayed()
    assert attempt_delay(tcp) < attempt_delay(quic) == limits.DIAL_STAGGER + limits.QUIC_DIAL_DELAY


def test_ipv6_and_ipv4_take_turns_within_each_kind_of_address():
    from volunteer.net.dialing import dial_order, interleave_families
    from volunteer.net.identity import KeyPair

    v4 = [Multiaddr(f"/ip4/203.0.113.{n}/tcp/4001") for n in (1, 2, 3)]
    v6 = [Multiaddr(f"/ip6/2001:db8::{n}/tcp/4001") for n in (1, 2)]
    memory = Multiaddr("/dns4/example.org/tcp/4001")
    assert interleave_families([*v4, memory, *v6]) == [v6[0], v4[0], v6[1], v4[1], v4[2], memory]
    quic6 = Multiaddr("/ip6/2001:db8::1/udp/4001/quic-v1")
    order = dial_order(KeyPair.generate().peer_id, [quic6, *v4[:1], *v6[:1]])
    assert order == [v6[0], v4[0], quic6]  # TCP (both families in turn) before QUIC


def test_only_global_unicast_ipv6_counts_as_an_external_address():
    from volunteer.net.interfaces import is_global_v6

    assert is_global_v6("2001:db8:a::2") and is_global_v6("2a00:1450::1%eth0")
    for ip in ("fe80::1", "fd00::1", "::1", "::ffff:192.0.2.1", "192.0.2.1", "not an ip"):
        assert not is_global_v6(ip), ip


def test_no_attempt_at_a_family_this_machine_cannot_send_from():
    from volunteer.net.dialing import routable

    v4_home = ["127.0.0.1", "192.168.1.5", "::1", "fe80::1", "fd00::2"]  # IPv4-only: a ULA reaches no internet
    assert routable(Multiaddr("/ip4/198.51.100.7/tcp/1"), v4_home)
    assert routable(Multiaddr("/ip4/127.0.0.1/udp/1/quic-v1"), v4_home)
    assert not routable(Multiaddr("/ip6/2001:db8::7/udp/1/quic-v1"), v4_home)
    assert routable(Multiaddr("/ip6/fd00::9/tcp/1"), v4_home)
    assert routable(Multiaddr("/memory/3"), v4_home)
    dual = v4_home + ["2001:db8::5"]
    assert routable(Multiaddr("/ip6/2001:db8::7/udp/1/quic-v1"), dual)
    v6_only = ["::1", "2001:db8::5"]
    assert not routable(Multiaddr("/ip4/198.51.100.7/tcp/1"), v6_only)
