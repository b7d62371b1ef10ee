"""An in-memory transport (`/memory/N`) for fast tests: the same interface as TCP, no sockets."""

from __future__ import annotations

import errno
import itertools

import trio

from ...errors import MultiaddrError
from ..multiaddr import Multiaddr
from .base import InboundHandler, RawConnection

MAX_PENDING_ACCEPTS = 128


class MemoryNetwork:
    """A namespace of /memory/N listeners; tests may make private ones to stay isolated."""

    def __init__(self) -> None:
        self._listeners: dict[int, trio.MemorySendChannel] = {}
        self._numbers = itertools.count(1)
        self._clients = itertools.count(1 << 32)

    def _allocate(self, number: int) -> int:
        if number == 0:
            number = next(self._numbers)
            while number in self._listeners:
                number = next(self._numbers)
        if number in self._listeners:
            raise OSError(errno.EADDRINUSE, f"/memory/{number} is in use")
        return number


DEFAULT_NETWORK = MemoryNetwork()


def _memory_number(addr: Multiaddr) -> int | None:
    names = addr.protocols()
    if names and names[0] == "memory" and (len(names) == 1 or (len(names) == 2 and names[1] == "p2p")):
        return int(addr.value_at(0))
    return None


class MemoryTransport:
    """Dial and listen on /memory/N addresses of one MemoryNetwork."""

    def __init__(self, network: MemoryNetwork | None = None) -> None:
        self.network = network or DEFAULT_NETWORK

    def can_dial(self, addr: Multiaddr) -> bool:
        return _memory_number(addr) is not None

    def can_listen(self, addr: Multiaddr) -> bool:
        return _memory_number(addr) is not None

    async def dial(self, addr: Multiaddr, **_options) -> RawConnection:
        number = _memory_number(addr)
        if number is None:
            raise MultiaddrError(f"{addr} is not a memory address")
        channel = self.network._listeners.get(number)
        if channel is None:
            raise OSError(errno.ECONNREFUSED, f"nobody listens on /memory/{number}")
        import trio.testing  # imported on first use: it pulls in test tooling a CLI start does not need

        ours, theirs = trio.testing.memory_stream_pair()
        local = Multiaddr(f"/memory/{next(self.network._clients)}")
        remote = Multiaddr(f"/memory/{number}")
        try:
            channel.send_nowait(RawConnection(theirs, remote, local, self))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            raise OSError(errno.ECONNREFUSED, f"/memory/{number} is not accepting") from None
        await trio.lowlevel.checkpoint()
        return RawConnection(ours, local, remote, self)

    async def listen(self, addr: Multiaddr, handler: InboundHandler, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        wanted = _memory_number(addr)
        if wanted is None:
            raise MultiaddrError(f"{addr} is not a memory address")
        number = self.network._allocate(wanted)
        send, receive = trio.open_memory_channel(MAX_PENDING_ACCEPTS)
        self.network._listeners[number] = send
        try:
            async with trio.open_nursery() as nursery:
                task_status.started([Multiaddr(f"/memory/{number}")])
                async for raw in receive:
                    nursery.start_soon(handler, raw)
        finally:
            del self.network._listeners[number]
            send.close()
