"""The libp2p perf protocol (`/perf/1.0.0`, specs: perf/perf.md), server and client.

The client sends the number of bytes it wants back as a big-endian u64, uploads its bytes and
closes its write side; the server reads everything, then sends the requested number of bytes and
closes. The server is on by default on every node, so it is bounded: a peer may run only a few
perf streams at once and move only so many bytes a minute, or it could burn a volunteer's uplink.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from ..errors import RemoteProtocolError, ResourceLimitExceeded
from .identity import PeerID
from .service import BaseService, Handler
from .streams import BufferedStream

PERF = "/perf/1.0.0"
BLOCK = memoryview(bytes(1 << 20))  # what we send: zeros, one MiB per write, never reallocated
RECEIVE_SIZE = 1 << 20


@dataclass
class PerfLimits:
    """Bounds of the perf server (per remote peer, and for the whole node)."""

    max_streams_per_peer: int = 2
    max_streams_total: int = 8
    # Bytes moved (both directions) in any 60-second window.
    max_bytes_per_minute_per_peer: int = 2 << 30
    max_bytes_per_minute_total: int = 8 << 30
    window: float = 60.0


class ByteBudget:
    """Sliding-window byte accounting (sans-I/O: ``now`` passed in)."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._spent: deque[tuple[float, int]] = deque()
        self._total = 0

    def used(self, now: float) -> int:
        while self._spent and self._spent[0][0] <= now - self.window:
            self._total -= self._spent.popleft()[1]
        return self._total

    def try_spend(self, amount: int, now: float) -> bool:
        """Spend ``amount`` if it fits in the window; returns whether it did."""
        if self.used(now) + amount > self.limit:
            return False
        if self._spent and self._spent[-1][0] == now:
            self._spent[-1] = (now, self._spent[-1][1] + amount)
        else:
            self._spent.append((now, amount))
        self._total += amount
        return True


@dataclass
class PerfServerStats:
    streams: int = 0
    refused: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0


class PerfServer(BaseService):
    """Serves `/perf/1.0.0` within PerfLimits, as a Host service (a standard one: ``StackOptions.perf``)."""

    def __init__(self, limits: PerfLimits | None = None, clock: Callable[[], float] = trio.current_time) -> None:
        self.limits = limits or PerfLimits()
        self.clock = clock
        self.stats = PerfServerStats()
        self._active: dict[PeerID, int] = {}
        self._budgets: dict[PeerID, ByteBudget] = {}
        self._total_budget = ByteBudget(self.limits.max_bytes_per_minute_total, self.limits.window)

    def _spend(self, peer: PeerID, amount: int) -> None:
        now = self.clock()
        budget = self._budgets.get(peer)
        if budget is None:
            budget = self._budgets[peer] = ByteBudget(self.limits.max_bytes_per_minute_per_peer, self.limits.window)
        if budget.used(now) + amount > budget.limit or not self._total_budget.try_spend(amount, now):
            raise ResourceLimitExceeded(f"perf byte budget exceeded for {peer.short()}")
        budget.try_spend(amount, now)
        # Forget idle peers so the table stays small.
        if len(self._budgets) > 1024:
            for other in [p for p, b in self._budgets.items() if b.used(now) == 0]:
                del self._budgets[other]

    def handlers(self) -> dict[str, Handler]:
        return {PERF: self.handle}

    async def handle(self, stream) -> None:
        """Serve one perf stream (refused by a reset past the per-peer and total stream limits)."""
        peer: PeerID = stream.remote_peer
        active = self._active.get(peer, 0)
        if active >= self.limits.max_streams_per_peer or sum(self._active.values()) >= self.limits.max_streams_total:
            self.stats.refused += 1
            await stream.reset()
            return
        self._active[peer] = active + 1
        self.stats.streams += 1
        try:
            await self._serve(stream, peer)
        except ResourceLimitExceeded:
            self.stats.refused += 1
            await stream.reset()
        finally:
            self._active[peer] -= 1
            if not self._active[peer]:
                del self._active[peer]

    async def _serve(self, stream, peer: PeerID) -> None:
        buffered = BufferedStream(stream)
        (wanted,) = struct.unpack(">Q", await buffered.receive_exactly(8, "perf request"))
        self._spend(peer, wanted)
        pending = len(buffered.take_buffered())
        while True:
            if pending:
                self._spend(peer, pending)
                self.stats.bytes_received += pending
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                break
            pending = len(data)
        await send_zeros(stream, wanted, lambda n: _count(self.stats, n))
        await stream.send_eof()


def _count(stats: PerfServerStats, n: int) -> None:
    stats.bytes_sent += n


async def send_zeros(stream, count: int, progress: Callable[[int], None] | None = None) -> None:
    """Write ``count`` zero bytes in big blocks."""
    remaining = count
    while remaining:
        chunk = BLOCK if remaining >= len(BLOCK) else BLOCK[:remaining]
        await stream.send_all(chunk)
        remaining -= len(chunk)
        if progress:
            progress(len(chunk))


@dataclass
class PerfResult:
    """One perf run, as ``volunteer perf`` prints it."""

    peer: str
    path: str
    setup_seconds: float
    upload_bytes: int
    download_bytes: int
    upload_seconds: float
    download_seconds: float
    streams: int
    total_seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    transport: str = ""  # quic, tcp, memory or relay: what carried the connection

    @property
    def upload_mbps(self) -> float:
        return self.upload_bytes / self.upload_seconds / 1e6 if self.upload_seconds > 0 else 0.0

    @property
    def download_mbps(self) -> float:
        return self.download_bytes / self.download_seconds / 1e6 if self.download_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "peer": self.peer,
            "path": self.path,
            "transport": self.transport,
            "streams": self.streams,
            "setup_ms": round(self.setup_seconds * 1000, 3),
            "upload_bytes": self.upload_bytes,
            "download_bytes": self.download_bytes,
            "upload_seconds": round(self.upload_seconds, 6),
            "download_seconds": round(self.download_seconds, 6),
            "upload_MBps": round(self.upload_mbps, 2),
            "download_MBps": round(self.download_mbps, 2),
            "upload_Mbitps": round(self.upload_mbps * 8, 1),
            "download_Mbitps": round(self.download_mbps * 8, 1),
            "total_seconds": round(self.total_seconds, 6),
            "errors": self.errors,
        }


async def perf_stream(
    stream,
    upload: int,
    download: int,
    on_upload: Callable[[int], None] | None = None,
    on_download: Callable[[int], None] | None = None,
) -> tuple[float, float]:
    """Run one perf exchange on an open `/perf/1.0.0` stream. Returns (upload_s, download_s).

    Raises RemoteProtocolError if the server sends back a different number of bytes than asked.
    """
    started = trio.current_time()
    await stream.send_all(struct.pack(">Q", download))
    await send_zeros(stream, upload, on_upload)
    await stream.send_eof()
    uploaded_at = trio.current_time()
    received = 0
    while True:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            break
        received += len(data)
        if received > download:
            raise RemoteProtocolError(f"perf server sent more than the {download} bytes asked for")
        if on_download:
            on_download(len(data))
    finished = trio.current_time()
    if received != download:
        raise RemoteProtocolError(f"perf server sent {received} bytes, expected {download}")
    await stream.aclose()
    return uploaded_at - started, finished - uploaded_at
