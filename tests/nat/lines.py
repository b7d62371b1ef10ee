"""Access lines of the NAT rig: delay, jitter, loss and bandwidth caps, and profiles of real ones.

A ``Link`` impairs one leg of the rig (a home router's WAN leg, or a host's own uplink). Its
delay, jitter and loss come from the userspace delayer (``delayer.py``; this kernel has no
netem); its caps are ``tc tbf`` qdiscs, one per direction, each with a modem queue of
``queue_ms`` at its rate (tail drop beyond it, as a cable or DSL modem does):

    uplink   (home -> internet): tbf on the home side's interface, before the delayer
    downlink (internet -> home): tbf on the upstream bridge's port, before the delayer

So the delayer only ever carries what the caps let through. ``PROFILES`` are the lines of the
WAN benchmark (down/up Mbit/s, one-way delay, loss); a path between two homes crosses two
lines, so its RTT is four one-way delays.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Sequence

MTU_FRAME = 1514  # an Ethernet frame of a full-size packet
MIN_BURST = 2 * MTU_FRAME  # tbf must hold at least one whole frame; two keep it from stalling
BURST_SECONDS = 0.002  # token bucket depth: 2 ms at the line's rate (a modem's burst is small)
MAX_MBIT = 10_000.0
MAX_QUEUE_MS = 2_000.0


@dataclasses.dataclass(frozen=True)
class Link:
    """Impairment of one leg: delay and jitter in ms and loss in percent (each direction), and
    optional caps in Mbit/s: ``up_mbit`` towards the upstream segment (the internet),
    ``down_mbit`` back; each cap queues up to ``queue_ms`` of its rate before it drops."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    up_mbit: float | None = None
    down_mbit: float | None = None
    queue_ms: float = 100.0

    @property
    def delays(self) -> bool:
        """Whether frames need the userspace delayer (delay, jitter or loss)."""
        return bool(self.delay_ms or self.jitter_ms or self.loss_pct)

    def problems(self) -> list[str]:
        """What is out of range (empty when the link is valid)."""
        out = []
        if not (0 <= self.delay_ms <= 10_000 and 0 <= self.jitter_ms <= 10_000 and 0 <= self.loss_pct <= 100):
            out.append("delay, jitter or loss out of range")
        for name in ("up_mbit", "down_mbit"):
            rate = getattr(self, name)
            if rate is not None and not 0 < rate <= MAX_MBIT:
                out.append(f"{name} must be within (0, {MAX_MBIT:g}]")
        if not 1 <= self.queue_ms <= MAX_QUEUE_MS:
            out.append(f"queue_ms must be within [1, {MAX_QUEUE_MS:g}]")
        return out


@dataclasses.dataclass(frozen=True)
class Profile:
    """A kind of home line: what a home on it gets (the WAN benchmark's rows)."""

    name: str
    down_mbit: float
    up_mbit: float
    delay_ms: float  # one way, this line only
    loss_pct: float = 0.0
    jitter_ms: float = 0.0

    def link(self, queue_ms: float = 100.0) -> Link:
        """The home router's WAN leg on this line."""
        return Link(self.delay_ms, self.jitter_ms, self.loss_pct, self.up_mbit, self.down_mbit, queue_ms)

    def rtt_ms(self, legs: int = 2) -> float:
        """Round trip between two homes on this line (``legs`` lines crossed one way)."""
        return 2 * legs * self.delay_ms


PROFILES = {
    p.name: p
    for p in (
        Profile("cable", down_mbit=50, up_mbit=10, delay_ms=20),
        Profile("dsl", down_mbit=16, up_mbit=2, delay_ms=35),
        Profile("fibre", down_mbit=300, up_mbit=100, delay_ms=8),
        Profile("far", down_mbit=100, up_mbit=20, delay_ms=75, loss_pct=0.5),
    )
}
# Where a relay or a bootstrap node lives: a datacenter line, far from nobody, never the bottleneck.
DATACENTER = Link(delay_ms=10)


def burst_bytes(mbit: float) -> int:
    """tbf bucket depth for a rate."""
    return max(MIN_BURST, int(mbit * 1e6 / 8 * BURST_SECONDS))


def queue_bytes(mbit: float, queue_ms: float) -> int:
    """The modem queue at a rate: ``queue_ms`` of it, never less than the bucket plus a frame."""
    return max(burst_bytes(mbit) + MTU_FRAME, int(mbit * 1e6 / 8 * queue_ms / 1000))


def cap_command(ns: str, ifname: str, mbit: float, queue_ms: float) -> list[str]:
    """The ``tc`` command that caps egress of ``ifname`` in namespace ``ns`` at ``mbit``."""
    return ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", ifname, "root", "tbf",
            "rate", f"{int(mbit * 1e6)}bit", "burst", str(burst_bytes(mbit)),
            "limit", str(queue_bytes(mbit, queue_ms))]


def caps_of(ns: str, ifname: str, timeout: float = 10.0) -> list[dict]:
    """The tbf qdiscs on ``ifname`` (``tc -j -s``): rate in bits/s, burst bytes, queue latency
    in µs (tc shows the byte limit as the time it takes to drain), bytes sent and drops."""
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", "-j", "-s", "qdisc", "show", "dev", ifname],
                         capture_output=True, text=True, timeout=timeout, check=True).stdout
    found = []
    for q in json.loads(out or "[]"):
        if q.get("kind") == "tbf":
            opts = q.get("options", {})
            found.append({"rate_bit": 8 * int(opts.get("rate", 0)), "burst": int(opts.get("burst", 0)),
                          "latency_us": int(opts.get("lat", 0)), "drops": int(q.get("drops", 0)),
                          "bytes": int(q.get("bytes", 0))})
    return found


def profile_names(names: Sequence[str]) -> list[Profile]:
    """Profiles by name, in order; KeyError naming the known ones for an unknown name."""
    try:
        return [PROFILES[n] for n in names]
    except KeyError as e:
        raise KeyError(f"unknown line profile {e.args[0]!r}; known: {', '.join(PROFILES)}") from None
