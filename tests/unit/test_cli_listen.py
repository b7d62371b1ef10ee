"""Where the one-shot diagnostics (ping, perf) listen: QUIC only when a punch may follow."""

from __future__ import annotations

import argparse

from volunteer.cli.netcmds import EPHEMERAL_LISTEN, listen_addrs
from volunteer.net.multiaddr import Multiaddr

PEER = "12D3KooWNHTAyCUGbSf6NZ9eSLN1Y8HmcoiNiW4bXTUiCuutYhcg"
RELAY = "12D3KooWDxk9bF8xP2kxxKoQSjfyEvKwbqvWpRLesWjfrcd72X46"


def test_a_direct_tcp_target_needs_no_quic_listener():
    args = argparse.Namespace(listen=[])
    assert listen_addrs(args, Multiaddr(f"/ip4/192.0.2.1/tcp/4001/p2p/{PEER}")) == ["/ip4/0.0.0.0/tcp/0"]


def test_relayed_and_quic_targets_and_unknown_ones_listen_on_both():
    args = argparse.Namespace(listen=[])
    relayed = Multiaddr(f"/ip4/192.0.2.1/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{PEER}")
    quic = Multiaddr(f"/ip4/192.0.2.1/udp/4001/quic-v1/p2p/{PEER}")
    for target in (relayed, quic, None):
        assert listen_addrs(args, target) == EPHEMERAL_LISTEN


def test_addresses_given_are_used_as_given():
    args = argparse.Namespace(listen=["/ip4/127.0.0.2/tcp/0"])
    assert listen_addrs(args, Multiaddr(f"/ip4/192.0.2.1/tcp/4001/p2p/{PEER}")) == ["/ip4/127.0.0.2/tcp/0"]
