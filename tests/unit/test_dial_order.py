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
