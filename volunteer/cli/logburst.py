"""One warning per burst of expert failures instead of one per failure.

An expert that breaks (out of memory, a bad checkpoint) fails every call, and a trainer calls it
many times a second: one warning line each buries everything else in the dashboard's log and in
the journal. ``BurstFilter`` (a ``logging.Filter`` on the expert server's logger) lets the first
failure of a burst through, holds back the rest for ``window`` seconds, and adds their count (per
expert) to the next failure it lets through. Pure over the records' own timestamps: no clock.
"""

from __future__ import annotations

import logging
from collections import Counter

FAILURE_LOGGER = "volunteer.experts.server"
FAILURE_PREFIX = "expert %s failed"  # the message format of an expert's failure in that logger
WINDOW_S = 10.0  # seconds after a failure that shown: the next failures are counted, not shown
TOP_EXPERTS = 3  # experts named in a summary (the most failing first)


class BurstFilter(logging.Filter):
    """Shows the first expert failure of each ``window``; counts the others into the next one shown."""

    def __init__(self, window: float = WINDOW_S) -> None:
        super().__init__()
        self.window = window
        self.shown_at: float | None = None  # the record time of the last failure shown
        self.held: Counter[str] = Counter()  # failures held back since, by expert

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith(FAILURE_PREFIX)):
            return True
        uid = str(record.args[0]) if isinstance(record.args, tuple) and record.args else "?"
        if self.shown_at is not None and record.created - self.shown_at < self.window:
            self.held[uid] += 1
            return False
        if self.held:
            record.msg = f"{record.msg}; {self.summary()}"
            self.held.clear()
        self.shown_at = record.created
        return True

    def summary(self) -> str:
        """The failures held back, in words: ``15 more expert failures (expert.0.1 ×9, …)``."""
        count = sum(self.held.values())
        names = ", ".join(f"{uid} ×{n}" for uid, n in self.held.most_common(TOP_EXPERTS))
        more = ", …" if len(self.held) > TOP_EXPERTS else ""
        return f"{count} more expert failure(s) held back before this one ({names}{more})".replace("%", "%%")


def install(logger_name: str = FAILURE_LOGGER) -> BurstFilter:
    """Put one ``BurstFilter`` on the expert server's logger (once per process)."""
    logger = logging.getLogger(logger_name)
    for existing in logger.filters:
        if isinstance(existing, BurstFilter):
            return existing
    burst = BurstFilter()
    logger.addFilter(burst)
    return burst


__all__ = ["BurstFilter", "install"]
