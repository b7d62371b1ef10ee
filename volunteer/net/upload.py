"""A volunteer's upload, capped and counted in one place (``volunteer join --max-upload``).

One ``UploadMeter`` is built by the node and handed to every service that sends bulk bytes:
the expert server's replies, replica sync's contributions, the state service's catch-up
answers and the replica manager's hand-off pushes. They share its token bucket, so the cap is on
everything the volunteer uploads, and its ``sent`` counts each purpose apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypedDict

import trio

from .ratelimit import RateLimiter

REPLIES = "replies"  # expert replies to trainers
SYNC = "sync"  # replica sync contributions
CATCH_UP = "catch_up"  # states served to a joining replica
HAND_OFF = "hand_off"  # sole copies pushed on leave
PURPOSES = (REPLIES, SYNC, CATCH_UP, HAND_OFF)

_BUCKET = "upload"  # the one key of the shared bucket



class UploadStatus(TypedDict):
    """``UploadMeter.snapshot()``: the cap (None: none) and the bytes sent, in all and by purpose."""

    limit_bps: float | None
    bytes_sent: int
    by_purpose: dict[str, int]


class UploadMeter:
    """Bytes per second shared by every upload of one volunteer (``rate`` None: counted only).

    ``take(n, purpose)`` waits until ``n`` bytes may go and counts them; a write larger than one
    second's worth waits for a full bucket and then overdraws it (paid back by the next writes)."""

    def __init__(self, rate: float | None = None, *, clock: Callable[[], float] = trio.current_time) -> None:
        if rate is not None and rate <= 0:
            raise ValueError("an upload cap must be above zero (None: no cap)")
        self.rate = float(rate) if rate else None
        self.clock = clock
        self._bucket = RateLimiter(rate=self.rate, burst=self.rate, max_keys=1) if self.rate else None
        self.sent: Counter[str] = Counter()  # bytes sent, by purpose

    @property
    def total(self) -> int:
        """Bytes sent for every purpose together."""
        return sum(self.sent.values())

    async def take(self, nbytes: int, purpose: str) -> None:
        """Wait until ``nbytes`` may be sent under the cap, then count them under ``purpose``."""
        if nbytes <= 0:
            return
        if self._bucket is not None:
            while (wait := self._bucket.delay(_BUCKET, now=self.clock(), cost=nbytes)) > 0:
                await trio.sleep(wait)
            self._bucket.spend(_BUCKET, now=self.clock(), cost=nbytes)
        self.sent[purpose] += nbytes

    def snapshot(self) -> UploadStatus:
        """The cap and the bytes sent, in all and by purpose (``volunteer status``)."""
        return {"limit_bps": self.rate, "bytes_sent": self.total, "by_purpose": {p: self.sent[p] for p in PURPOSES}}


async def send_metered(stream: Any, chunks: Iterable[Any], meter: "UploadMeter | None", purpose: str) -> None:
    """Write ``chunks`` in order, each through ``meter`` when there is one."""
    for chunk in chunks:
        if meter is not None:
            await meter.take(len(chunk), purpose)
        await stream.send_all(chunk)


__all__ = ["CATCH_UP", "HAND_OFF", "PURPOSES", "REPLIES", "SYNC", "UploadMeter", "send_metered"]
