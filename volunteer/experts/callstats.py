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
import ipaddress
import math
from functools import lru_cache
from typing import TYPE_CHECKING, TypedDict

from .tensors import BLOCKWISE8_64, BLOCKWISE8_256, FLOAT16, NONE

if TYPE_CHECKING:
    from ..net.multiaddr import Multiaddr
    from .receipts import Receipt

AUTO = "auto"  # a trainer's compression setting: the encoding each call's link calls for
RATE_SMOOTHING = 0.3  # weight of the newest call in a host's moving link figures
# A call that moved its bytes within its round trip was not held by them: its transfer time
# counts as this fraction of the round trip (the link is at least that fast).
LATENCY_BOUND_FLOOR = 0.1
# Payload bytes of a call in float16, per payload byte in the encoding it used.
AS_HALF = {NONE: 0.5, FLOAT16: 1.0, BLOCKWISE8_64: 2 / (1 + 4 / 64), BLOCKWISE8_256: 2 / (1 + 4 / 256)}
# A call moving fewer payload bytes (both ways) measures latency, not the link's rate: its
# timing does not move the host's link figures (tiny tensors on a busy machine look "slow").
MIN_RATE_SAMPLE_BYTES = 16 * 1024
# 8-bit is worth its rounding and its CPU only where it saves at least this much wire time per
# call: on loopback or a LAN a call's bytes outlast its (tiny) round trip, yet take microseconds.
MIN_WIRE_SAVING_S = 0.005
# float16 is worth its conversions only off the machine and its wired LAN: where a round trip takes
# under this, or where halving a call's bytes would save under MIN_HALF_SAVING_S of wire time, the
# tensors travel as they are (loopback: float16 made a small forward+backward 1-2 ms slower)
FAST_LINK_RTT_S = 0.001
MIN_HALF_SAVING_S = 0.0005


@dataclasses.dataclass
class CallReport:
    """What one call cost (times in seconds, on the caller's clock; None when it did not happen)."""

    op: str = ""
    compression: str = NONE  # the encoding the call's tensors travelled in
    started: float = 0.0
    sent: float | None = None  # the request's last byte handed to the stream
    first_reply: float | None = None  # the reply header arrived
    done: float | None = None
    bytes_out: int = 0  # tensor payload sent
    bytes_in: int = 0  # tensor payload received
    server_s: float | None = None  # the volunteer's time on the call, from its reply
    kept: int | None = None  # forward: the volunteer's key for the inputs it kept for the backward
    resent_inputs: bool = False  # backward: the volunteer had forgotten them, so they went again
    receipt: Receipt | None = None  # forward/backward: the reply's receipts.Receipt (checked against what arrived)

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



class HostCallStatus(TypedDict):
    """``HostSummary.snapshot()``: one host of one expert as a trainer saw it (ms; payload
    bytes in all and per call)."""

    uid: str
    peer: str
    path: str
    calls: int
    failures: int
    rtt_ms: float | None
    bytes_out: int
    bytes_in: int
    bytes_out_per_call: int
    bytes_in_per_call: int
    network_ms_per_call: float
    server_ms_per_call: float
    last_call_ms: float | None


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

    def snapshot(self) -> HostCallStatus:
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
    """Per (expert, host) summaries of a trainer's calls, and what each host's link makes the
    bytes of a call cost: ``bytes_cost(peer)``, the seconds a call's payload takes on the wire in
    float16 over the round trip (moving figures of the calls' throughput and payload). A call's
    throughput is its share of the links it crosses, as the step that waits for all calls sees it."""

    def __init__(self) -> None:
        self._hosts: dict[tuple[str, str], HostSummary] = {}
        self._links: dict[str, tuple[float, float]] = {}  # peer -> (bytes/s, float16 bytes per call), moving

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
        self._note_link(peer, report, summary.rtt)

    def failed(self, uid: str, peer: str) -> None:
        """Count one failed call."""
        self._summary(uid, peer).failures += 1

    def bytes_cost(self, peer: str) -> float | None:
        """Seconds a call's payload to ``peer`` takes on the wire in float16, in round trips
        (None before a call to it was measured): above 1 the bytes, not the latency, make it slow."""
        link = self._links.get(peer)
        rtt = self.rtt(peer)
        if link is None or not rtt:
            return None
        rate, half_bytes = link
        return half_bytes / rate / rtt

    def wire_seconds(self, peer: str) -> float | None:
        """Seconds a call's payload to ``peer`` takes on the wire in float16 (None before a call
        to it was measured)."""
        link = self._links.get(peer)
        if link is None:
            return None
        rate, half_bytes = link
        return half_bytes / rate

    def snapshot(self, prefix: str | None = None) -> dict[str, list[HostCallStatus]]:
        """``{uid: [per-host summary, ...]}``, for uids under ``prefix`` (all when None)."""
        out: dict[str, list[HostCallStatus]] = {}
        for (uid, _), summary in sorted(self._hosts.items()):
            if prefix is None or uid == prefix or uid.startswith(prefix + "."):
                out.setdefault(uid, []).append(summary.snapshot())
        return out

    def _summary(self, uid: str, peer: str) -> HostSummary:
        key = (uid, peer)
        if key not in self._hosts:
            self._hosts[key] = HostSummary(uid, peer)
        return self._hosts[key]

    def rtt(self, peer: str) -> float | None:
        """The shortest round trip measured to ``peer`` (None before one was)."""
        rtts = [h.rtt for (_, p), h in self._hosts.items() if p == peer and h.rtt]
        return min(rtts) if rtts else None

    def _note_link(self, peer: str, report: CallReport, rtt: float | None) -> None:
        moved = report.bytes_out + report.bytes_in
        network = report.network_s
        if moved < MIN_RATE_SAMPLE_BYTES or network is None or not rtt:
            return
        transfer = max(network - rtt, LATENCY_BOUND_FLOOR * rtt)
        sample = (moved / transfer, moved * AS_HALF.get(report.compression, 1.0))
        old = self._links.get(peer)
        if old is None:
            self._links[peer] = sample
        else:
            self._links[peer] = (
                (1 - RATE_SMOOTHING) * old[0] + RATE_SMOOTHING * sample[0],
                (1 - RATE_SMOOTHING) * old[1] + RATE_SMOOTHING * sample[1],
            )


# Addresses that are this machine or its LAN: a call there never goes lossy, whatever a loaded
# machine's round trips say (loopback, RFC 1918, link-local, IPv6 unique-local). Not 100.64/10 (a
# carrier's NAT is the internet) nor the documentation ranges Python calls private (our WAN rig's
# emulated homes live there).
LOCAL_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "::1/128", "fc00::/7", "fe80::/10",
))


# Host names that are this machine (RFC 6761 ``localhost``) or its LAN (mDNS ``.local``): a
# multiaddr not dialled yet may name its host so.
LOCAL_NAMES = ("localhost",)
LOCAL_NAME_SUFFIXES = (".localhost", ".local")
PATHS_REMEMBERED = 4096  # addresses whose verdict is_local_path keeps (it runs on every auto call)


@lru_cache(maxsize=PATHS_REMEMBERED)
def is_local_address(ip: str) -> bool:
    """Whether ``ip`` (an IPv4 or IPv6 literal) is this machine or its LAN (``LOCAL_NETWORKS``)."""
    try:
        address = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    return any(address in network for network in LOCAL_NETWORKS if network.version == address.version)


@lru_cache(maxsize=PATHS_REMEMBERED)
def is_local_path(addr: Multiaddr) -> bool:
    """Whether a connection to ``addr`` stays on this machine or its LAN: the in-memory transport,
    an IP address in ``LOCAL_NETWORKS`` or a local host name. A relayed circuit
    (``R_ADDR/p2p/R/p2p-circuit/...``) is judged by ``R_ADDR``, the hop we send on: through a
    relay on this machine or its LAN it counts as local (the relay's other leg is out of sight;
    exact tensors there cost bytes, never a result), through a relay on the internet it is an
    internet path, whatever the target's own addresses say. What a path is, not how fast a
    loaded machine made it look (cached: a trainer asks it on every call)."""
    components = addr.components
    if not components:
        return False
    name, value = components[0]
    if name == "memory":
        return True  # the in-memory transport: this very process
    if value is None:
        return False
    if name in ("ip4", "ip6"):
        return is_local_address(value)
    if name in ("dns", "dns4", "dns6", "dnsaddr"):
        host = value.lower().rstrip(".")
        return host in LOCAL_NAMES or host.endswith(LOCAL_NAME_SUFFIXES)
    return False


def choose_compression(
    setting: str, bytes_cost: float | None, wire_seconds: float | None = None, rtt: float | None = None,
    *, local: bool = False,
) -> str:
    """The wire encoding of one call: ``setting`` itself unless it is ``auto``; then none on a
    fast link (``rtt`` under ``FAST_LINK_RTT_S``, or float16 saving under ``MIN_HALF_SAVING_S``
    of ``wire_seconds``), else float16 (tensors.serialize keeps values float16 cannot hold
    faithfully in another encoding), or 8-bit blockwise where the link makes a call's float16
    bytes cost more than its round trip (``CallStats.bytes_cost`` above 1: a home uplink shared
    by a step's calls) and halving them saves at least ``MIN_WIRE_SAVING_S`` (``wire_seconds``:
    ``CallStats.wire_seconds``, the payload's time on the wire in float16). ``local``: the call
    goes directly to this machine or its LAN (``is_local_address``): none, always."""
    if setting != AUTO:
        return setting
    if local:
        return NONE
    if rtt is not None and rtt < FAST_LINK_RTT_S:
        return NONE
    if wire_seconds is not None and math.isfinite(wire_seconds) and wire_seconds < MIN_HALF_SAVING_S:
        return NONE
    if bytes_cost is None or not math.isfinite(bytes_cost) or bytes_cost <= 1.0:
        return FLOAT16
    if wire_seconds is None or not math.isfinite(wire_seconds) or wire_seconds / 2 < MIN_WIRE_SAVING_S:
        return FLOAT16
    return BLOCKWISE8_64


__all__ = ["AUTO", "FAST_LINK_RTT_S", "LOCAL_NETWORKS", "is_local_address", "is_local_path", "MIN_HALF_SAVING_S", "MIN_RATE_SAMPLE_BYTES", "MIN_WIRE_SAVING_S", "CallReport", "CallStats", "HostSummary", "choose_compression"]
