"""A TCP listening port belongs to one process: port reuse (SO_REUSEPORT, for dials from the
listening port that hole punching needs) must not let a second listener share it, or Linux
balances incoming connections between the two and half of one daemon's dials reach the other."""

from __future__ import annotations

import errno
import socket

import pytest
import trio

from volunteer.errors import ListenError
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.tcp import TcpTransport

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


async def _ignore(conn) -> None:
    await conn.aclose()


def _reuseport_listener() -> socket.socket:
    """A listener as another daemon's: SO_REUSEPORT set, so the kernel would share its port."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="the platform has no SO_REUSEPORT to share ports with")
async def test_a_port_another_process_listens_on_with_reuseport_is_refused():
    holder = _reuseport_listener()
    port = holder.getsockname()[1]
    try:
        async with trio.open_nursery() as nursery:
            with pytest.raises(OSError) as raised:
                await nursery.start(TcpTransport().listen, Multiaddr(f"/ip4/127.0.0.1/tcp/{port}"), _ignore)
            assert raised.value.errno == errno.EADDRINUSE
        async with open_stack(listen=[], options=QUIET) as host:
            with pytest.raises(ListenError, match=f"cannot listen on /ip4/127.0.0.1/tcp/{port}: address already in use"):
                await host.listen(f"/ip4/127.0.0.1/tcp/{port}")
    finally:
        holder.close()


async def test_two_hosts_cannot_listen_on_one_port_but_dials_still_leave_from_it():
    async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as first:
        port = int(str(first.listen_addrs[0]).rsplit("/", 1)[1])
        async with open_stack(listen=[], options=QUIET) as second:
            with pytest.raises(ListenError, match="address already in use"):
                await second.listen(f"/ip4/127.0.0.1/tcp/{port}")
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as other:
            # the listener's own dials still leave from its port (what hole punching relies on)
            await first.connect(other.full_addrs()[0])
            assert [str(c.local_addr) for c in first.connections()] == [f"/ip4/127.0.0.1/tcp/{port}"]
