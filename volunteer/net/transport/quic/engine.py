"""aioquic's sans-I/O ``QuicConnection``, configured for libp2p and with flow control that waits
for the application.

aioquic grants a peer more credit as soon as bytes *arrive* (it doubles a window once half of it
is received), so a peer could make us buffer without bound while nobody reads. ``Engine`` grants
credit from what the application has *read* instead: a stream may hold at most its window of
unread bytes, a connection at most its window of all streams together. The two overrides touch
aioquic internals (pinned in pyproject.toml); tests/unit/test_quic_core.py guards them.

Its congestion control is New Reno that, while repairs are on (``repair.py``), does not take
sparse random loss for congestion (``RepairAwareReno``); its pacer sends as Linux paces TCP
(``LinuxLikePacer``); with repairs on, its loss detection waits for a block (``_detect_loss``).
"""

from __future__ import annotations

import ssl

from aioquic.buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.congestion.base import register_congestion_control
from aioquic.quic.congestion.reno import RenoCongestionControl
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import pull_quic_transport_parameters
from aioquic.quic import recovery as aioquic_recovery
from aioquic.quic.recovery import QuicPacketPacer

from ... import limits
from ..pathloss import LossWindow
from ...tls import ALPN, Certificate
from .repair import BLOCK_SIZE
from .settings import QuicLimits


class RepairAwareReno(RenoCongestionControl):
    """aioquic's New Reno, except while repairs are on (``tolerant``, see ``tolerate``).

    Then sparse loss is not congestion: a rebuilt datagram is still declared lost by a sender
    that saw three later ones acknowledged first, and random loss on a long path would halve the
    window every round trip. Loss beyond ``QUIC_LOSS_TOLERANCE`` of the recent packets (a full
    queue drops runs of them) is congestion again, as in BBRv2. Nor does a rising round trip end
    slow start (HyStart): our calls are bursts, and the parallel calls of one training step raise
    the round trip inside every burst by their own serialization on the uplink, whatever the
    window. ``losing`` says whether any recent packet was lost."""

    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self.tolerant = False
        self._tolerated_before = False
        self._sent = [0, 0]  # packets sent in the previous and the current window
        self._lost = [0, 0]
        self.lost_total = 0  # packets
        self.bytes_sent = 0
        self.bytes_lost = 0  # declared lost
        self.packets_sent = 0
        self.repaired_total = 0  # our packets the peer rebuilt
        # the same in congestion avoidance, lately: what the path loses, not what a slow start overshot
        self.steady = LossWindow(limits.REPAIRED_PATH_WINDOW)
        self.cuts = {"untolerated": 0, "beyond_tolerance": 0, "persistent": 0}  # window cuts, by why
        self._repaired = [0, 0]  # our packets the peer rebuilt, in the same two windows
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
        self.bytes_sent += packet.sent_bytes
        self.packets_sent += 1
        if not self.in_slow_start:
            self.steady.on_sent(packet.sent_bytes)
        self._sent[1] += 1
        if self._sent[1] >= limits.QUIC_LOSS_WINDOW:
            self._sent, self._lost = [self._sent[1], 0], [self._lost[1], 0]
            self._repaired = [self._repaired[1], 0]

    def note_repaired(self, count: int) -> None:
        """The peer rebuilt ``count`` more of our packets: the path loses, though nothing was
        declared lost (not congestion either: the count stays out of ``loss_rate``)."""
        self._repaired[1] += count
        self.repaired_total += count

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

    def on_packets_lost(self, *, now: float, packets) -> None:
        packets = list(packets)
        self._lost[1] += len(packets)
        self.lost_total += len(packets)
        size = sum(packet.sent_bytes for packet in packets)
        self.bytes_lost += size
        if not self.in_slow_start:
            self.steady.on_lost(size)
        if self.tolerant and self.loss_rate() < limits.QUIC_LOSS_TOLERANCE:
            for packet in packets:
                self.bytes_in_flight -= packet.sent_bytes
            return
        window = self.congestion_window
        super().on_packets_lost(now=now, packets=packets)
        if self.congestion_window < window:
            self.cuts["beyond_tolerance" if self.tolerant else "untolerated"] += 1

    def on_persistent_congestion(self) -> None:
        super().on_persistent_congestion()
        self.cuts["persistent"] += 1


class LinuxLikePacer(QuicPacketPacer):
    """aioquic paces a connection at its window per round trip, so a request as large as the
    window takes a whole extra round trip to leave even on an idle link. Linux paces TCP at
    twice that in slow start and 1.2 times after (``tcp_update_pacing_rate``); so does this."""

    def __init__(self, *, max_datagram_size: int, congestion: RepairAwareReno) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self.congestion = congestion

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        factor = limits.QUIC_PACING_SLOW_START if self.congestion.in_slow_start else limits.QUIC_PACING_AVOIDANCE
        super().update_rate(int(congestion_window * factor), smoothed_rtt)


REPAIRED_TIME_THRESHOLD = 5 / 4  # round trips after which a packet is lost, with repairs on (aioquic: 9/8)
MIN_DATAGRAM = 1200  # RFC 9000: every QUIC path carries datagrams this large
CONGESTION_CONTROL = "volunteer-reno"
register_congestion_control(CONGESTION_CONTROL, RepairAwareReno)


def configuration(cert: Certificate, *, is_client: bool, quic_limits: QuicLimits) -> QuicConfiguration:
    """An aioquic configuration for libp2p: our certificate, ALPN ``libp2p``, no CA checks (the
    peer's certificate is checked against the libp2p rules after the handshake), our windows."""
    return QuicConfiguration(
        is_client=is_client,
        alpn_protocols=[ALPN],
        certificate=cert.certificate,
        private_key=cert.private_key,
        verify_mode=ssl.CERT_NONE,
        idle_timeout=quic_limits.idle_timeout,
        max_data=quic_limits.connection_window,
        max_stream_data=quic_limits.stream_window,
        max_datagram_size=quic_limits.max_datagram,
        connection_id_length=limits.QUIC_CONNECTION_ID_LENGTH,
        congestion_control_algorithm=CONGESTION_CONTROL,
    )


class Engine(QuicConnection):
    """A ``QuicConnection`` whose credit follows what the application read (see the module docstring),
    which asks a client for its certificate when it is the server, and which bounds peer streams."""

    def __init__(self, *, configuration: QuicConfiguration, quic_limits: QuicLimits, **kwargs) -> None:
        super().__init__(configuration=configuration, **kwargs)
        self.quic_limits = quic_limits
        self.read_offsets: dict[int, int] = {}  # stream id -> bytes the application has read
        self.peer_max_udp_payload = 65527  # RFC 9000's default when the peer does not say
        self.read_total = 0
        # the peer's concurrent bidirectional streams; libp2p uses no unidirectional ones
        self._local_max_streams_bidi.value = self._local_max_streams_bidi.sent = quic_limits.max_streams
        self._local_max_streams_uni.value = self._local_max_streams_uni.sent = 0
        self._loss._pacer = LinuxLikePacer(max_datagram_size=self.datagram_size, congestion=self.congestion)
        self._detect_loss_by_count = self._loss._detect_loss
        self._loss._detect_loss = self._detect_loss  # type: ignore[method-assign]

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        if not self._is_client:
            # libp2p TLS: the server MUST require the client's certificate (aioquic's default is not to)
            self.tls._request_client_certificate = True

    def _parse_transport_parameters(self, data: bytes, from_session_ticket: bool = False) -> None:
        super()._parse_transport_parameters(data, from_session_ticket)
        # aioquic checks the peer's max_udp_payload_size but does not keep it: read it again
        # (the parameters already parsed once, so this cannot fail)
        params = pull_quic_transport_parameters(Buffer(data=data))
        if params.max_udp_payload_size is not None:
            self.peer_max_udp_payload = params.max_udp_payload_size

    def _detect_loss(self, *, now: float, space) -> None:
        """aioquic's loss detection, which declares a packet lost once three later ones are
        acknowledged or 9/8 of a round trip passed; while repairs are on, once a block and three
        more are, or 5/4 of a round trip passed: the receiver rebuilds a lost member when the
        block's repairs arrive (at most an eighth of a round trip after it, see
        ``RepairEncoder.wait_for``) and acknowledges it up to its ACK delay later. Otherwise
        every rebuilt packet would be sent again for nothing."""
        if not self.congestion.tolerant:
            self._detect_loss_by_count(now=now, space=space)
            return
        # the thresholds are module constants of aioquic's: lend it ours for this one call
        by_count, by_time = aioquic_recovery.K_PACKET_THRESHOLD, aioquic_recovery.K_TIME_THRESHOLD
        aioquic_recovery.K_PACKET_THRESHOLD = by_count + BLOCK_SIZE
        aioquic_recovery.K_TIME_THRESHOLD = REPAIRED_TIME_THRESHOLD
        try:
            self._detect_loss_by_count(now=now, space=space)
        finally:
            aioquic_recovery.K_PACKET_THRESHOLD, aioquic_recovery.K_TIME_THRESHOLD = by_count, by_time

    def raise_datagram_size(self, size: int) -> int:
        """Send datagrams of up to ``size`` bytes from now on (never more than the peer accepts);
        returns the size in force. For paths whose MTU we know (loopback)."""
        return self._set_datagram_size(max(self.datagram_size, min(size, self.peer_max_udp_payload)))

    def lower_datagram_size(self, size: int) -> int:
        """Send datagrams of at most ``size`` bytes from now on (room for what repairs add)."""
        return self._set_datagram_size(min(self.datagram_size, max(size, MIN_DATAGRAM)))

    def _set_datagram_size(self, size: int) -> int:
        self._max_datagram_size = size
        self._loss._pacer._max_datagram_size = size
        # reno and cubic keep their own copy, for their window arithmetic
        setattr(self._loss._cc, "_max_datagram_size", size)
        return size

    @property
    def datagram_size(self) -> int:
        # aioquic sets it untyped in __init__, so mypy may or may not know its type (it depends on order)
        return int(getattr(self, "_max_datagram_size"))

    @property
    def congestion(self) -> RepairAwareReno:
        """The congestion controller (ours: every configuration here names it)."""
        cc = self._loss._cc
        assert isinstance(cc, RepairAwareReno)
        return cc

    def has_unsent_data(self) -> bool:
        """Whether a stream holds bytes (or a FIN) not sent yet: the pacer or the window holds
        them back, so more datagrams follow soon."""
        return any(len(s.sender._pending) or s.sender._pending_eof for s in self._streams.values())

    def peer_connection_id(self) -> bytes:
        """The connection ID our packets carry to the peer now (repairs are addressed by it)."""
        return bytes(self._peer_cid.cid)

    def consumed(self, stream_id: int, count: int) -> None:
        """The application read ``count`` more bytes of ``stream_id``: credit may be granted again."""
        self.read_offsets[stream_id] = self.read_offsets.get(stream_id, 0) + count
        self.read_total += count

    def forget(self, stream_id: int) -> None:
        """``stream_id`` is done: its read offset is no longer needed."""
        self.read_offsets.pop(stream_id, None)

    def discarded(self, count: int) -> None:
        """Bytes of a stream nobody will read (refused or already forgotten) arrived: they count
        as read for the connection's credit."""
        self.read_total += count

    def credit_due(self, stream_id: int) -> bool:
        """Whether reads on ``stream_id`` (or the connection) earned an update worth sending now."""
        stream = self._streams.get(stream_id)
        window = self.quic_limits.stream_window
        if stream is not None and stream.max_stream_data_local:
            if self.read_offsets.get(stream_id, 0) + window - stream.max_stream_data_local >= window // 2:
                return True
        connection_window = self.quic_limits.connection_window
        return self.read_total + connection_window - self._local_max_data.value >= connection_window // 2

    def host_connection_ids(self) -> list[bytes]:
        """Our connection IDs the peer may address packets to (the endpoint routes them here)."""
        return [bytes(cid.cid) for cid in self._host_cids]

    def peer_certificate(self):
        """The certificate the peer presented in the handshake (None if it presented none)."""
        return self.tls._peer_certificate

    def peer_certificate_chain_length(self) -> int:
        """How many certificates the peer sent beyond its own (libp2p allows none)."""
        return len(self.tls._peer_certificate_chain)

    def unacknowledged(self, stream_id: int) -> int:
        """Bytes written to ``stream_id`` that the peer has not acknowledged yet (0 when unknown)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        return stream.sender._buffer_stop - stream.sender._buffer_start

    def smoothed_rtt(self) -> float | None:
        """The loss detector's smoothed round trip, once it has a sample."""
        return self._loss._rtt_smoothed if self._loss._rtt_initialized else None

    # --- flow control from application reads -----------------------------------------------
    def _write_connection_limits(self, builder, space) -> None:
        limit = self._local_max_data
        window = self.quic_limits.connection_window
        wanted = self.read_total + window
        if wanted - limit.value >= window // 2:
            limit.value = wanted
        # aioquic doubles the credit once half of it has arrived: hide the arrivals from that rule
        used, limit.used = limit.used, 0
        try:
            super()._write_connection_limits(builder, space)
        finally:
            limit.used = used

    def _write_stream_limits(self, builder, space, stream) -> None:
        if stream.max_stream_data_local:
            window = self.quic_limits.stream_window
            wanted = self.read_offsets.get(stream.stream_id, 0) + window
            if wanted - stream.max_stream_data_local >= window // 2:
                stream.max_stream_data_local = wanted
        highest, stream.receiver.highest_offset = stream.receiver.highest_offset, 0
        try:
            super()._write_stream_limits(builder, space, stream)
        finally:
            stream.receiver.highest_offset = highest


__all__ = ["Engine", "QuicLimits", "configuration"]
