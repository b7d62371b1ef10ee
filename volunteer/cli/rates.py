"""Windowed figures for the dashboard: rates and ratios over the last ``RATE_WINDOW`` seconds
of cumulative counters (requests, samples, batches, bytes sent), sans-I/O: callers pass ``now``.

Every view (the live dashboard at 2 Hz, ``volunteer status`` polling, a script asking for
``--json``) reads the same window, so a second reader does not reset anyone's rate.
"""

from __future__ import annotations

from collections import deque

RATE_WINDOW = 10.0  # seconds a windowed figure (req/s, batch, upload) looks back
MIN_SPACING = 0.25  # samples closer together than this replace the newest instead of piling up
MAX_SAMPLES = 128  # per key: a bound even if the clock stalls or readers poll very fast
MAX_KEYS = 4096  # keys (expert uids) tracked; the oldest is dropped beyond


class Window:
    """Cumulative counters per key, sampled over time; ``delta`` is their growth over the window."""

    def __init__(self, span: float = RATE_WINDOW) -> None:
        self.span = span
        self._samples: dict[str, deque[tuple[float, tuple[float, ...]]]] = {}

    def observe(self, key: str, now: float, *values: float) -> None:
        """Record the counters of ``key`` at ``now``."""
        samples = self._samples.get(key)
        if samples is None:
            if len(self._samples) >= MAX_KEYS:
                self._samples.pop(next(iter(self._samples)))
            samples = self._samples[key] = deque(maxlen=MAX_SAMPLES)
        if len(samples) >= 2 and now - samples[-2][0] < MIN_SPACING:
            samples.pop()
        samples.append((now, tuple(values)))
        while len(samples) > 2 and now - samples[1][0] >= self.span:
            samples.popleft()  # keep one sample at or beyond the window's start

    def delta(self, key: str) -> tuple[float, tuple[float, ...]] | None:
        """(seconds covered, growth of each counter) over the window; None before two samples."""
        samples = self._samples.get(key)
        if not samples or len(samples) < 2:
            return None
        (start, first), (end, last) = samples[0], samples[-1]
        if end <= start:
            return None
        return end - start, tuple(b - a for a, b in zip(first, last))

    def rate(self, key: str, index: int = 0) -> float | None:
        """Counter ``index`` of ``key`` per second over the window."""
        found = self.delta(key)
        return None if found is None else found[1][index] / found[0]

    def ratio(self, key: str, numerator: int, denominator: int) -> float | None:
        """Growth of one counter over another's in the window (e.g. samples per batch); None when
        the denominator did not grow."""
        found = self.delta(key)
        if found is None or found[1][denominator] <= 0:
            return None
        return found[1][numerator] / found[1][denominator]

    def forget(self, keep: set[str]) -> None:
        """Drop every key not in ``keep`` (experts no longer hosted)."""
        for key in [k for k in self._samples if k not in keep]:
            del self._samples[key]


__all__ = ["MAX_KEYS", "RATE_WINDOW", "Window"]
