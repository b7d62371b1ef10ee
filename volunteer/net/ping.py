"""ping (`/ipfs/ping/1.0.0`): 32 random bytes, echoed back; repeated on one stream."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import trio

from ..errors import RemoteProtocolError
from .limits import PING_PAYLOAD
from .service import BaseService, Handler, HostAPI
from .streams import BufferedStream

if TYPE_CHECKING:
    from .identity import PeerID
    from .multiaddr import Multiaddr

PING = "/ipfs/ping/1.0.0"
MAX_PINGS_PER_STREAM = 10_000  # a server answers this many pings on one stream, then closes it


async def serve_ping(stream) -> None:
    """Echo 32-byte pings until the peer closes the stream (or the bound is reached)."""
    buffered = BufferedStream(stream)
    for _ in range(MAX_PINGS_PER_STREAM):
        try:
            payload = await buffered.receive_exactly(PING_PAYLOAD, "ping")
        except RemoteProtocolError:
            break  # the peer closed between pings: the normal end of a ping stream
        await stream.send_all(payload)
    await stream.aclose()


class Pinger:
    """Client side of one ping stream: ``await pinger.ping()`` returns the RTT in seconds."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self._buffered = BufferedStream(stream)

    async def ping(self) -> float:
        payload = os.urandom(PING_PAYLOAD)
        started = trio.current_time()
        await self.stream.send_all(payload)
        echoed = await self._buffered.receive_exactly(PING_PAYLOAD, "ping reply")
        rtt = trio.current_time() - started
        if echoed != payload:
            raise RemoteProtocolError("ping reply does not match the payload")
        return rtt

    async def aclose(self) -> None:
        await self.stream.aclose()


class Ping(BaseService):
    """Serves ping on a Host (one of the standard services of ``net.stack``)."""

    def handlers(self) -> dict[str, Handler]:
        return {PING: serve_ping}

    async def open(self, target: PeerID | Multiaddr | str) -> Pinger:
        """A ping stream to ``target``: ``await pinger.ping()`` returns one RTT in seconds."""
        return Pinger(await self.host.new_stream(target, [PING]))


def ping_of(host: HostAPI) -> Ping:
    """The Host's ping service (one of the standard services of ``net.stack``)."""
    ping = host.service(Ping)
    if ping is None:
        raise RuntimeError("this host runs no Ping service")
    return ping
