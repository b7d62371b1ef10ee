"""Idle request streams kept per (peer, protocol), for request/response protocols that allow
one request after another on a stream (the DHT, expert calls).

Opening a stream costs a yamux frame each way and a protocol negotiation; a trainer calling the
same expert a hundred times a second, or a DHT lookup asking the same peer again, reuses one.
The server side of such a protocol waits ``SERVE_IDLE`` for the next request and then closes;
the pool trusts a stream for less than that (``POOL_IDLE``), so a request is never sent on a
stream the server is about to drop.
"""

from __future__ import annotations

from collections import defaultdict

import trio

from .identity import PeerID
from .streams import BufferedStream, close_quietly

POOL_IDLE = 20.0  # seconds an idle stream is reused
SERVE_IDLE = 30.0  # servers close a stream idle this long
MAX_IDLE_PER_KEY = 32


class StreamPool:
    """Idle streams of one Host, by (peer, protocol)."""

    def __init__(self, host, max_idle: int = MAX_IDLE_PER_KEY, idle: float = POOL_IDLE) -> None:
        self.host = host
        self.max_idle = max_idle
        self.idle = idle
        self._idle: dict[tuple[PeerID, str], list[tuple[BufferedStream, float]]] = defaultdict(list)

    def take(self, peer: PeerID, protocol: str) -> BufferedStream | None:
        """A recently used stream to ``peer`` speaking ``protocol``, or None."""
        streams = self._idle.get((peer, protocol))
        now = trio.current_time()
        while streams:
            stream, since = streams.pop()
            if now - since < self.idle and not stream.stream.connection.is_closed:
                return stream
            self._discard(stream)
        return None

    async def open(self, peer: PeerID, protocol: str) -> tuple[BufferedStream, bool]:
        """A pooled stream, or a new one: (stream, reused)."""
        stream = self.take(peer, protocol)
        if stream is not None:
            return stream, True
        conn = await self.host.connect(peer)
        return BufferedStream(await conn.new_stream([protocol])), False

    def give(self, peer: PeerID, protocol: str, stream: BufferedStream) -> None:
        """Return a stream whose last exchange completed cleanly."""
        streams = self._idle[(peer, protocol)]
        if len(streams) < self.max_idle:
            streams.append((stream, trio.current_time()))
        else:
            self._discard(stream)

    def _discard(self, stream: BufferedStream) -> None:
        try:
            self.host._nursery.start_soon(close_quietly, stream)
        except RuntimeError:
            pass  # the host is shutting down: its connections, and this stream, go with it


def pool_of(host) -> StreamPool:
    """The Host's shared pool (created on first use)."""
    pool = getattr(host, "stream_pool", None)
    if pool is None:
        pool = host.stream_pool = StreamPool(host)
    return pool


__all__ = ["POOL_IDLE", "SERVE_IDLE", "StreamPool", "pool_of"]
