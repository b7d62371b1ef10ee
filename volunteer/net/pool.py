"""Idle request streams kept per (peer, protocol), for request/response protocols that allow
one request after another on a stream (the DHT, expert calls). A Host service.

Opening a stream costs a yamux frame each way and a protocol negotiation; a trainer calling the
same expert a hundred times a second, or a DHT lookup asking the same peer again, reuses one.
The server side of such a protocol waits ``SERVE_IDLE`` for the next request and then closes;
the pool trusts a stream for less than that (``POOL_IDLE``), so a request is never sent on a
stream the server is about to drop.

    async with pool_of(host).stream(peer, protocol) as lease:
        await lease.stream.send_all(request)
        reply = await lease.stream.receive_length_prefixed(...)
    # a clean exit returns the stream to the pool; an exception (or a cancellation) resets it
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from . import limits
from .identity import PeerID
from .service import BaseService, HostAPI
from .streams import BufferedStream, close_quietly, reset_quietly

POOL_IDLE = limits.POOL_IDLE
SERVE_IDLE = limits.SERVE_IDLE


class Lease:
    """A stream on loan from the pool for one exchange; ``async with lease:`` gives it back.

    ``reused``: it served an earlier exchange (so the server may have dropped it meanwhile).
    ``discard()``: close it gracefully on exit instead of pooling it (the server ends the stream
    after this exchange, as the expert protocol does after an error reply). An exception (a
    cancellation too) leaving the block resets the stream: its state is unknown."""

    def __init__(self, pool: "StreamPool", key: tuple[PeerID, str], stream: BufferedStream, reused: bool) -> None:
        self._pool = pool
        self._key = key
        self.stream = stream
        self.reused = reused
        self.keep = True

    def discard(self) -> None:
        self.keep = False

    async def __aenter__(self) -> "Lease":
        return self

    async def __aexit__(self, kind, exc, tb) -> None:
        if kind is not None:
            with trio.CancelScope(shield=True):
                await reset_quietly(self.stream)
        elif self.keep:
            self._pool._give(self._key, self.stream)
        else:
            self._pool._close_soon(self.stream)


class StreamPool(BaseService):
    """Idle streams of one Host, by (peer, protocol)."""

    def __init__(self, max_idle: int = limits.MAX_IDLE_STREAMS_PER_KEY, idle: float = POOL_IDLE) -> None:
        self.max_idle = max_idle
        self.idle = idle
        self._idle: dict[tuple[PeerID, str], list[tuple[BufferedStream, float]]] = defaultdict(list)
        self._host: HostAPI | None = None

    async def run(self, host: HostAPI, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._host = host
        task_status.started()

    @asynccontextmanager
    async def stream(self, peer: PeerID, protocol: str) -> AsyncIterator[Lease]:
        """Lend a pooled stream to ``peer`` speaking ``protocol`` (or a new one) for one exchange."""
        async with await self.lend(peer, protocol) as lease:
            yield lease

    def take(self, peer: PeerID, protocol: str) -> BufferedStream | None:
        """A recently used stream to ``peer`` speaking ``protocol``, or None."""
        streams = self._idle.get((peer, protocol))
        now = trio.current_time()
        best = self._host.connection_to(peer) if self._host is not None and streams else None
        while streams:
            stream, since = streams.pop()
            # a stream on a connection that is no longer the best one (a direct path replaced a
            # relayed one, a repaired one a lossy one) is closed: the next exchange takes the best
            if now - since < self.idle and not stream.connection.is_closed and (best is None or stream.connection is best):
                return stream
            self._close_soon(stream)
        return None

    async def lend(self, peer: PeerID, protocol: str) -> Lease:
        """A Lease (use it with ``async with``); split from ``stream()`` for callers that tell a
        failure to open a stream from a failure of the exchange on it."""
        stream = self.take(peer, protocol)
        if stream is not None:
            return Lease(self, (peer, protocol), stream, reused=True)
        if self._host is None:
            raise RuntimeError("the stream pool is not running on a host")
        conn = await self._host.connect(peer)
        return Lease(self, (peer, protocol), BufferedStream(await conn.new_stream([protocol])), reused=False)

    def _give(self, key: tuple[PeerID, str], stream: BufferedStream) -> None:
        streams = self._idle[key]
        if len(streams) < self.max_idle:
            streams.append((stream, trio.current_time()))
        else:
            self._close_soon(stream)

    def _close_soon(self, stream: BufferedStream) -> None:
        if self._host is None:
            return
        try:
            self._host.start_soon(close_quietly, stream)
        except RuntimeError:
            pass  # the host is shutting down: its connections, and this stream, go with it


def pool_of(host: HostAPI) -> StreamPool:
    """The Host's shared pool (one of the standard services of ``net.stack``)."""
    pool = host.service(StreamPool)
    if pool is None:
        raise RuntimeError("this host runs no StreamPool service")
    return pool


__all__ = ["POOL_IDLE", "SERVE_IDLE", "Lease", "StreamPool", "pool_of"]
