"""``SendLock``: the FIFO lock that keeps one writer at a time on a Noise or yamux connection.

trio's ``Lock.acquire`` passes through the scheduler even when nobody holds the lock, and a
connection takes two such locks per write (yamux's, then Noise's): two scheduler passes per
message on the hot path of every expert call. Uncontended, this one takes the lock without
yielding; it still raises ``Cancelled`` first if the task is cancelled (before a Noise frame is
encrypted, so a cancelled write never burns a nonce), and a contended acquire waits in FIFO
order as ``trio.StrictFIFOLock`` does. Every write under it reaches the socket, which yields.
"""

from __future__ import annotations

import trio


class SendLock:
    """``async with lock:`` a FIFO mutex whose uncontended acquire does not yield."""

    def __init__(self) -> None:
        self._lock = trio.StrictFIFOLock()

    async def __aenter__(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self._lock.release()

    def locked(self) -> bool:
        """Whether a writer holds it now."""
        return self._lock.locked()


__all__ = ["SendLock"]
