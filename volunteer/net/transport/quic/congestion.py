"""Congestion control for QUIC connections that may carry repair datagrams (``repair.py``).

Two choices (``QuicLimits.congestion``), both counting the same things, which the session shows
and the lossy-path switch reads (``PathLoss``: sent, declared lost, lost in congestion
avoidance lately, rebuilt by the peer), and both with a loss detection that waits, while repairs
are on, for a block's repairs before it declares a packet lost (``Engine.loss_thresholds``), so a
rebuilt packet is neither declared lost nor sent again:
- ``ours`` (the default): New Reno that, while repairs are on, does not take sparse random loss
  for congestion (``RepairAwareReno``), paced as Linux paces TCP (``LinuxLikePacer``).
- ``cubic``: aioquic's own CUBIC, unchanged: every declared loss is a congestion signal, as RFC
  9265 asks of FEC schemes. On the WAN benchmark's far profile (300 ms, 1 % loss each way) its
  median step took 1.38x the limit against ours' 1.04x, its p95 steps about 1.5 to 2 times ours
  (docs/ARCHITECTURE.md has the runs).
"""

from __future__ import annotations

from aioquic.quic.congestion.base import register_congestion_control
from aioquic.quic.congestion.cubic import CubicCongestionControl
from aioquic.quic.congestion.reno import RenoCongestionControl
from aioquic.quic.recovery import QuicPacketPacer

from ... import limits
from ..pathloss import LossWindow


class LossAccounting:
    """What a congestion controller here counts besides its window (mixed in before aioquic's
    controller, whose congestion response it leaves alone). ``tolerant`` says that repairs are on
    and the path loses (``Engine.loss_thresholds`` waits for a block then); ``losing`` whether
    any recent packet was lost or rebuilt."""

    congestion_window: int
    ssthresh: int | None

    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)  # type: ignore[call-arg]
        self.tolerant = False
        self._sent = [0, 0]  # packets sent in the previous and the current window
        self._lost = [0, 0]
        self._repaired = [0, 0]  # our packets the peer rebuilt, in the same two windows
        self.lost_total = 0  # packets
        self.bytes_sent = 0
        self.bytes_lost = 0  # declared lost
        self.packets_sent = 0
        self.repaired_total = 0  # our packets the peer rebuilt
        # the same in congestion avoidance, lately: what the path loses, not what a slow start overshot
        self.steady = LossWindow(limits.REPAIRED_PATH_WINDOW)
        self.cuts = {"loss": 0, "persistent": 0}  # window cuts, by why

    def on_packet_sent(self, *, packet) -> None:
        super().on_packet_sent(packet=packet)  # type: ignore[misc]
        self.bytes_sent += packet.sent_bytes
        self.packets_sent += 1
        if not self.in_slow_start:
            self.steady.on_sent(packet.sent_bytes)
        self._sent[1] += 1
        if self._sent[1] >= limits.QUIC_LOSS_WINDOW:
            self._sent, self._lost = [self._sent[1], 0], [self._lost[1], 0]
            self._repaired = [self._repaired[1], 0]

    def count_lost(self, packets: list) -> None:
        """Count ``packets`` declared lost (whatever the controller then makes of them)."""
        self._lost[1] += len(packets)
        self.lost_total += len(packets)
        size = sum(packet.sent_bytes for packet in packets)
        self.bytes_lost += size
        if not self.in_slow_start:
            self.steady.on_lost(size)

    def note_repaired(self, count: int) -> None:
        """The peer rebuilt ``count`` more of our packets: the path loses, though nothing was
        declared lost (not congestion either: the count stays out of ``loss_rate``)."""
        self._repaired[1] += count
        self.repaired_total += count

    def tolerate(self, on: bool) -> None:
        """Repairs are on and the path loses (or no longer)."""
        self.tolerant = on

    @property
    def bytes_repaired(self) -> int:
        """About how many of the bytes we sent the peer rebuilt (it counts datagrams)."""
        return self.repaired_total * self.bytes_sent // max(1, self.packets_sent)

    @property
    def in_slow_start(self) -> bool:
        return self.ssthresh is None or self.congestion_window < self.ssthresh

    def loss_rate(self) -> float:
        return sum(self._lost) / max(1, sum(self._sent))

    @property
    def losing(self) -> bool:
        return sum(self._lost) + sum(self._repaired) > 0

    def on_persistent_congestion(self) -> None:
        super().on_persistent_congestion()  # type: ignore[misc]
        self.cuts["persistent"] += 1


class AccountedCubic(LossAccounting, CubicCongestionControl):
    """aioquic's CUBIC, counted (``LossAccounting``); every declared loss is congestion to it."""

    def on_packets_lost(self, *, now: float, packets) -> None:
        packets = list(packets)
        self.count_lost(packets)
        before = (self.ssthresh, self.congestion_window)
        super().on_packets_lost(now=now, packets=packets)
        # a congestion event sets both anew (to 0.7 of the flight, which may exceed a window slow start left behind)
        if (self.ssthresh, self.congestion_window) != before:
            self.cuts["loss"] += 1


class RepairAwareReno(LossAccounting, RenoCongestionControl):
    """aioquic's New Reno, except while repairs are on (``tolerant``).

    Then sparse loss is not congestion: random loss on a long path would halve the window every
    round trip. Loss beyond ``QUIC_LOSS_TOLERANCE`` of the recent packets (a full queue drops runs
    of them) is congestion again, as in BBRv2. Nor does a rising round trip end slow start
    (HyStart): our calls are bursts, and the parallel calls of one training step raise the round
    trip inside every burst by their own serialization on the uplink, whatever the window."""

    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self._tolerated_before = False
        self.cuts = {"untolerated": 0, "beyond_tolerance": 0, "persistent": 0}
        self._burst_peak = 0  # most bytes in flight in this burst (since the flight was last empty)
        self._last_burst_peak = 0

    def on_packet_acked(self, *, now: float, packet) -> None:
        # RFC 9002 section 7.8: a window the application does not fill must not grow. Our calls
        # are bursts; a window grown far past them (megabytes on a long path) paces nothing and
        # dumps each burst into the modem's queue at once, which overflows.
        if self.congestion_window >= 2 * max(self._burst_peak, self._last_burst_peak):
            self.bytes_in_flight -= packet.sent_bytes
        else:
            super().on_packet_acked(now=now, packet=packet)
        if self.bytes_in_flight <= 0:
            self._last_burst_peak, self._burst_peak = self._burst_peak, 0

    def on_packet_sent(self, *, packet) -> None:
        super().on_packet_sent(packet=packet)
        self._burst_peak = max(self._burst_peak, self.bytes_in_flight)

    def tolerate(self, on: bool) -> None:
        """Repairs are on (or off again). The first time, slow start resumes from where the
        losses that turned them on cut the window (repairs would have absorbed those losses)."""
        if on and not self._tolerated_before:
            self._tolerated_before = True
            self.ssthresh = None
        self.tolerant = on

    def on_rtt_measurement(self, *, now: float, rtt: float) -> None:
        if not self.tolerant:
            super().on_rtt_measurement(now=now, rtt=rtt)

    def on_packets_lost(self, *, now: float, packets) -> None:
        packets = list(packets)
        self.count_lost(packets)
        if self.tolerant and self.loss_rate() < limits.QUIC_LOSS_TOLERANCE:
            for packet in packets:
                self.bytes_in_flight -= packet.sent_bytes
            return
        window = self.congestion_window
        super().on_packets_lost(now=now, packets=packets)
        if self.congestion_window < window:
            self.cuts["beyond_tolerance" if self.tolerant else "untolerated"] += 1


class LinuxLikePacer(QuicPacketPacer):
    """aioquic paces a connection at its window per round trip, so a request as large as the
    window takes a whole extra round trip to leave even on an idle link. Linux paces TCP at
    twice that in slow start and 1.2 times after (``tcp_update_pacing_rate``); so does this."""

    def __init__(self, *, max_datagram_size: int, congestion: LossAccounting) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self.congestion = congestion

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        factor = limits.QUIC_PACING_SLOW_START if self.congestion.in_slow_start else limits.QUIC_PACING_AVOIDANCE
        super().update_rate(int(congestion_window * factor), smoothed_rtt)


# the algorithm names a configuration gives aioquic, by QuicLimits.congestion
ALGORITHMS = {"cubic": "volunteer-cubic", "ours": "volunteer-reno"}
register_congestion_control(ALGORITHMS["cubic"], AccountedCubic)
register_congestion_control(ALGORITHMS["ours"], RepairAwareReno)

__all__ = ["ALGORITHMS", "AccountedCubic", "LinuxLikePacer", "LossAccounting", "RepairAwareReno"]
