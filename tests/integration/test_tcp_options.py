"""What every TCP connection of ours is set up for: request/reply traffic (expert calls, DHT
requests), whose replies are short flows with nothing behind a lost tail."""

from __future__ import annotations

import errno
import socket
import sys
from contextlib import asynccontextmanager

import pytest
import trio

from volunteer.net.multiaddr import Multiaddr
from volunteer.net.transport.tcp import TCP_THIN_LINEAR_TIMEOUTS, TcpTransport


def _options(sock) -> tuple[int, int]:
    return (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
            sock.getsockopt(socket.IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS))


@asynccontextmanager
async def _both_ends():
    """One of our dialed TCP connections and the end our listener accepted: their sockets,
    (dialed, accepted), closed on exit."""
    accepted: list = []
    got = trio.Event()

    async def keep(conn) -> None:
        accepted.append(conn)
        got.set()
        await trio.sleep_forever()  # the connection lives as long as its handler

    async with trio.open_nursery() as nursery:
        [listening] = await nursery.start(TcpTransport().listen, Multiaddr("/ip4/127.0.0.1/tcp/0"), keep)
        dialed = await TcpTransport().dial(listening)
        with trio.fail_after(10):
            await got.wait()
        try:
            yield dialed.stream.socket, accepted[0].stream.socket
        finally:
            await dialed.stream.aclose()
            await accepted[0].stream.aclose()
            nursery.cancel_scope.cancel()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_THIN_LINEAR_TIMEOUTS is a Linux option")
async def test_dialed_and_accepted_connections_retransmit_thin_flows_at_linear_intervals():
    async with _both_ends() as (dialed, accepted):
        # without linear timeouts two back-to-back timeouts on a lossy 300 ms path doubled to
        # seconds, and held a training step for 5 to 10 s
        assert _options(dialed) == (1, 1)
        assert _options(accepted) == (1, 1)


@pytest.mark.skipif(not hasattr(socket, "TCP_NOTSENT_LOWAT"), reason="TCP_NOTSENT_LOWAT is not on this platform")
async def test_dialed_and_accepted_connections_hold_few_unsent_bytes_in_the_kernel():
    """trio's SocketStream default, kept by our TcpStream: a bulk stream's writes wait once
    16 KiB are queued unsent, instead of queueing seconds of a slow link ahead of a small reply."""
    from volunteer.net.transport.tcpstream import NOTSENT_LOWAT

    async with _both_ends() as ends:
        for sock in ends:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT) == NOTSENT_LOWAT


class _ResetOnArrival:
    """A connected socket whose peer reset it before the dialer read its address (getpeername:
    ENOTCONN), as a listener that is shutting down does; all else is the real socket's."""

    def __init__(self, sock) -> None:
        self._sock = sock

    def getpeername(self):
        raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")

    def __getattr__(self, name):
        return getattr(self._sock, name)


async def test_a_dial_reset_before_its_address_is_read_closes_its_socket(monkeypatch):
    # the dial fails, and the socket is closed, not left for the garbage collector (a
    # ResourceWarning, once in thirty runs of test_moe_audits as volunteers came and went)
    listener = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    dialed: list = []
    connect = TcpTransport._connect

    async def connect_then_reset(family, sockaddr, bind):
        sock = await connect(family, sockaddr, bind)
        dialed.append(sock)
        return _ResetOnArrival(sock)

    monkeypatch.setattr(TcpTransport, "_connect", staticmethod(connect_then_reset))
    port = listener.getsockname()[1]
    with listener, pytest.raises(OSError):
        await TcpTransport().dial(Multiaddr(f"/ip4/127.0.0.1/tcp/{port}"))
    assert dialed and dialed[0].fileno() == -1
