"""One rate limiter for the whole stack: a token bucket per key, pure (time is passed in).

    limiter = RateLimiter(rate=2.0, burst=10)      # 2 per second on average, bursts of 10
    if not limiter.allow(peer, now=trio.current_time()):
        refuse()

Keys are whatever the caller limits by: a PeerID, a source IP, a (peer, protocol) pair, or one
constant for a global limit. Memory is bounded by ``max_keys``: past it the least recently used
key is forgotten (it starts again with a full bucket), so an attacker minting keys can neither
grow the table nor lock honest keys out of it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

DEFAULT_MAX_KEYS = 65536


class RateLimiter:
    """Token buckets of ``burst`` tokens refilled at ``rate`` per second, one per key."""

    def __init__(self, rate: float, burst: float, *, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if rate < 0 or burst <= 0 or max_keys <= 0:
            raise ValueError("rate must be >= 0, burst and max_keys > 0")
        self.rate = float(rate)
        self.burst = float(burst)
        self.max_keys = max_keys
        self._buckets: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()

    def tokens(self, key: Hashable, *, now: float) -> float:
        """Tokens ``key`` has at ``now`` (``burst`` for a key never seen)."""
        entry = self._buckets.get(key)
        if entry is None:
            return self.burst
        tokens, last = entry
        return min(self.burst, tokens + max(0.0, now - last) * self.rate)

    def allow(self, key: Hashable, *, now: float, cost: float = 1.0) -> bool:
        """Take ``cost`` tokens from ``key``'s bucket if it has them; False (nothing taken) if not."""
        tokens = self.tokens(key, now=now)
        ok = tokens >= cost
        self._put(key, tokens - cost if ok else tokens, now)
        return ok

    def delay(self, key: Hashable, *, now: float, cost: float = 1.0) -> float:
        """Seconds until ``key`` could spend ``cost`` (0 if it can now); a cost above ``burst``
        counts as ``burst``, so one big spend waits for a full bucket and then overdraws it."""
        need = min(cost, self.burst) - self.tokens(key, now=now)
        if need <= 0:
            return 0.0
        return float("inf") if self.rate == 0 else need / self.rate

    def spend(self, key: Hashable, *, now: float, cost: float) -> None:
        """Take ``cost`` tokens unconditionally (the bucket may go negative: a debt paid by waiting)."""
        self._put(key, self.tokens(key, now=now) - cost, now)

    def forget(self, key: Hashable) -> None:
        self._buckets.pop(key, None)

    def __len__(self) -> int:
        return len(self._buckets)

    def _put(self, key: Hashable, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)


__all__ = ["RateLimiter"]
