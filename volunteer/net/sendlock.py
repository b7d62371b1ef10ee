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
    """``async with lock:`` a FIFO mutex whose uncontended acquire does not yield.

    A flag and a parking lot rather than ``trio.StrictFIFOLock``: its acquire and release each
    look up the current task and check ownership in Python, and a write takes three of these
    locks (the yamux stream's, the connection's, Noise's). A release hands the lock straight to
    the first waiter, so the order stays FIFO."""

    def __init__(self) -> None:
        self._held = False
        self._waiting = 0
        self._lot = trio.lowlevel.ParkingLot()

    async def __aenter__(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._held:
            self._held = True
            return
        self._waiting += 1
        try:
            await self._lot.park()  # woken by a release that hands the lock over: held for us
        finally:
            self._waiting -= 1

    async def __aexit__(self, *exc_info: object) -> None:
        # the first waiter owns it now (``_held`` stays set); a waiter cancelled but not yet
        # resumed is counted in ``_waiting`` and no longer parked, so look at whom it woke
        if not (self._waiting and self._lot.unpark()):
            self._held = False

    def locked(self) -> bool:
        """Whether a writer holds it now."""
        return self._held


__all__ = ["SendLock"]
