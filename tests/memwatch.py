"""How much this process's resident memory grew while an attack ran: the peak, not the end.

Linux keeps the peak resident size (``VmHWM`` in /proc/self/status) and resets it when "5" is
written to /proc/self/clear_refs; that catches a spike inside one synchronous call (a decode) that
no sampling task could see. Where the reset is not allowed, a trio task samples the resident size
every few milliseconds instead (``sample`` must then run in a nursery), and the test says so.
Memory freed earlier in the process is given back to the system before the baseline is taken,
so that growth which would reuse it still shows.
"""

from __future__ import annotations

import ctypes
import gc
import os

import trio

MiB = 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def _hwm() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _trim() -> None:
    # memory an earlier test freed stays in this process's heap (glibc keeps it), and growth
    # that reuses it would not show: give it back to the system first (glibc only; elsewhere
    # the measure is only less strict)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakGrowth:
    """Peak resident growth from ``start()`` on (``growth``, bytes; ``mib`` for messages)."""

    def __init__(self) -> None:
        self.baseline = 0
        self.sampled = 0
        self.hwm = False

    def start(self) -> "PeakGrowth":
        gc.collect()
        _trim()
        self.baseline = self.sampled = rss()
        try:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")
            self.hwm = True
        except OSError:
            self.hwm = False
        return self

    @classmethod
    def watching(cls, nursery: trio.Nursery) -> "PeakGrowth":
        """Started now, with its sampling task in ``nursery``."""
        watch = cls().start()
        nursery.start_soon(watch.sample)
        return watch

    async def sample(self, period: float = 0.005) -> None:
        """Sample the resident size until cancelled (what counts where the peak cannot be reset)."""
        while True:
            self.sampled = max(self.sampled, rss())
            await trio.sleep(period)

    @property
    def growth(self) -> int:
        peak = max(self.sampled, rss(), _hwm() if self.hwm else 0)
        return peak - self.baseline

    @property
    def mib(self) -> str:
        how = "peak" if self.hwm else "sampled peak"
        return f"{self.growth / MiB:.0f} MiB ({how})"


__all__ = ["MiB", "PeakGrowth", "rss"]
