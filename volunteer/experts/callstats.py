"""Where a trainer's expert calls spend their time: per call a ``CallReport`` (filled in by
``call_expert``), per expert host a running summary (``CallStats``), and from those the wire
encoding a link calls for (``choose_compression``). Pure: times are the caller's clock.

A call's time splits into the volunteer's part (``server_s``: the reply says how long the call
spent on the volunteer, queued and computing) and the network's (everything else: the request's
and the reply's bytes on the wire, round trips, connection setup). The round trip to a host is
the connection's own measurement (yamux pings) when it has one, else estimated from the calls:
the smallest gap between our last request byte and the reply's first, less the volunteer's time.
"""

from __future__ import annotations

import dataclasses
import math

from .tensors import BLOCKWISE8_64, FLOAT16

AUTO = "auto"  # a trainer's compression setting: the encoding each call's link calls for
# A link whose calls move payload slower than this (bytes/s, both directions of a call together)
# gets 8-bit blockwise tensors instead of float16: there the bytes are the call's time.
SLOW_LINK_BYTES_PER_S = 1_000_000.0
RATE_SMOOTHING = 0.3  # weight of the newest call in a host's moving throughput
MIN_TRANSFER_BYTES = 64 * 1024  # smaller calls say more about round trips than about bandwidth


@dataclasses.dataclass
class CallReport:
    """What one call cost (times in seconds, on the caller's clock; None when it did not happen)."""

    op: str = ""
    started: float = 0.0
    sent: float | None = None  # the request's last byte handed to the stream
    first_reply: float | None = None  # the reply header arrived
    done: float | None = None
    bytes_out: int = 0  # tensor payload sent
    bytes_in: int = 0  # tensor payload received
    server_s: float | None = None  # the volunteer's time on the call, from its reply
    kept: int | None = None  # forward: the volunteer's key for the inputs it kept for the backward
    resent_inputs: bool = False  # backward: the volunteer had forgotten them, so they went again

    @property
    def total(self) -> float | None:
        """Seconds from the start to the last reply byte."""
        return None if self.done is None else self.done - self.started

    @property
    def network_s(self) -> float | None:
        """Seconds of the call not spent on the volunteer."""
        total = self.total
        return None if total is None else max(0.0, total - (self.server_s or 0.0))

    @property
    def rtt_sample(self) -> float | None:
        """The gap between our last request byte and the reply, less the volunteer's time."""
        if self.sent is None or self.first_reply is None:
            return None
        return max(0.0, self.first_reply - self.sent - (self.server_s or 0.0))


@dataclasses.dataclass
class HostSummary:
    """Running totals of one expert on one host."""

    uid: str
    peer: str
    path: str = ""
    calls: int = 0
    failures: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    network_s: float = 0.0
    server_s: float = 0.0
    rtt: float | None = None  # min over calls of CallReport.rtt_sample
    last_total: float | None = None

    def snapshot(self) -> dict:
        """Plain numbers for people and scripts (ms; payload bytes in all and per call)."""
        calls = max(1, self.calls)
        return {
            "uid": self.uid, "peer": self.peer, "path": self.path, "calls": self.calls, "failures": self.failures,
            "rtt_ms": None if self.rtt is None else round(self.rtt * 1e3, 2),
            "bytes_out": self.bytes_out, "bytes_in": self.bytes_in,
            "bytes_out_per_call": self.bytes_out // calls, "bytes_in_per_call": self.bytes_in // calls,
            "network_ms_per_call": round(self.network_s / calls * 1e3, 2),
            "server_ms_per_call": round(self.server_s / calls * 1e3, 2),
            "last_call_ms": None if self.last_total is None else round(self.last_total * 1e3, 2),
        }


class CallStats:
    """Per (expert, host) summaries of a trainer's calls, and each host's measured throughput."""

    def __init__(self) -> None:
        self._hosts: dict[tuple[str, str], HostSummary] = {}
        self._rates: dict[str, float] = {}  # peer -> bytes/s of its calls' transfers (moving)

    def record(self, uid: str, peer: str, report: CallReport, path: str = "", rtt: float | None = None) -> None:
        """Count one answered call; ``path`` and ``rtt`` (seconds) are the connection's, when it
        measured one (else the calls' own estimate stands)."""
        summary = self._summary(uid, peer)
        summary.calls += 1
        summary.path = path or summary.path
        summary.bytes_out += report.bytes_out
        summary.bytes_in += report.bytes_in
        summary.network_s += report.network_s or 0.0
        summary.server_s += report.server_s or 0.0
        summary.last_total = report.total
        sample = report.rtt_sample
        if rtt is not None:
            summary.rtt = rtt
        elif sample is not None:
            summary.rtt = sample if summary.rtt is None else min(summary.rtt, sample)
        self._note_rate(peer, report, summary.rtt)

    def failed(self, uid: str, peer: str) -> None:
        """Count one failed call."""
        self._summary(uid, peer).failures += 1

    def rate(self, peer: str) -> float | None:
        """Payload bytes/s the calls to ``peer`` moved lately (None before a big enough call)."""
        return self._rates.get(peer)

    def snapshot(self, prefix: str | None = None) -> dict[str, list[dict]]:
        """``{uid: [per-host summary, ...]}``, for uids under ``prefix`` (all when None)."""
        out: dict[str, list[dict]] = {}
        for (uid, _), summary in sorted(self._hosts.items()):
            if prefix is None or uid == prefix or uid.startswith(prefix + "."):
                out.setdefault(uid, []).append(summary.snapshot())
        return out

    def _summary(self, uid: str, peer: str) -> HostSummary:
        key = (uid, peer)
        if key not in self._hosts:
            self._hosts[key] = HostSummary(uid, peer)
        return self._hosts[key]

    def _note_rate(self, peer: str, report: CallReport, rtt: float | None) -> None:
        moved = report.bytes_out + report.bytes_in
        network = report.network_s
        if moved < MIN_TRANSFER_BYTES or network is None:
            return
        transfer = network - (rtt or 0.0)  # the round trip is not bandwidth
        if transfer <= 0:
            return
        sample = moved / transfer
        old = self._rates.get(peer)
        self._rates[peer] = sample if old is None else (1 - RATE_SMOOTHING) * old + RATE_SMOOTHING * sample


def choose_compression(setting: str, rate: float | None) -> str:
    """The wire encoding of one call: ``setting`` itself unless it is ``auto``; then float16
    (tensors.serialize keeps values float16 cannot hold faithfully in another encoding), or
    8-bit blockwise once the host's calls measure slower than ``SLOW_LINK_BYTES_PER_S``."""
    if setting != AUTO:
        return setting
    if rate is not None and math.isfinite(rate) and rate < SLOW_LINK_BYTES_PER_S:
        return BLOCKWISE8_64
    return FLOAT16


__all__ = ["AUTO", "CallReport", "CallStats", "HostSummary", "choose_compression"]
