"""A QUIC dial to an address nobody listens on fails as TCP's does: at once, with the reason
(ICMP port unreachable, no route), instead of waiting out the handshake timeout in silence."""

from __future__ import annotations

import socket
import sys

import pytest
import trio

from volunteer.errors import DialError
from volunteer.net.config import HostConfig
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.stack import open_stack

# a handshake timeout far beyond the test's bound: only a dial that fails on the error ends in time
PATIENT = HostConfig(handshake_timeout=300.0)


def closed_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ICMP errors on unconnected UDP sockets: Linux's IP_RECVERR")
@pytest.mark.parametrize("listen", [["/ip4/127.0.0.1/udp/0/quic-v1"], []], ids=["shared-socket", "own-socket"])
async def test_a_quic_dial_to_a_closed_port_fails_on_the_icmp_error(listen):
    with trio.fail_after(60):
        async with open_stack(listen=listen, config=PATIENT) as host:
            target = Multiaddr(f"/ip4/127.0.0.1/udp/{closed_udp_port()}/quic-v1/p2p/{KeyPair.generate().peer_id}")
            with pytest.raises(DialError) as failed:
                await host.connect(target)
            assert "refused" in str(failed.value).lower() or "unreachable" in str(failed.value).lower()


async def test_a_quic_dial_this_socket_cannot_send_to_fails_at_once():
    # a socket bound to loopback cannot send to a public address (EINVAL), as a home without
    # IPv6 cannot send to an IPv6 one (ENETUNREACH): the send error ends the dial
    with trio.fail_after(60):
        async with open_stack(listen=["/ip4/127.0.0.1/udp/0/quic-v1"], config=PATIENT) as host:
            target = Multiaddr(f"/ip4/203.0.113.77/udp/4001/quic-v1/p2p/{KeyPair.generate().peer_id}")
            with pytest.raises(DialError):
                await host.connect(target)
