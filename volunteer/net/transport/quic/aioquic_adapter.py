"""Everything we need of aioquic beyond its public interface, in one place.

aioquic (pinned in pyproject.toml) offers a sans-I/O ``QuicConnection`` whose public methods cover
most of what libp2p needs; what they do not cover is reached here and nowhere else, as trio's
``_ssl.py`` wraps its engine only through one seam:
- flow control that waits for the application (aioquic doubles a window once half of it has
  *arrived*): the two methods that write MAX_DATA and MAX_STREAM_DATA, overridden so the owner
  decides the limit (``connection_limit_wanted``, ``stream_limit_wanted``);
- the peer's concurrent streams, the client certificate a libp2p server must require, the peer's
  ``max_udp_payload_size`` (checked by aioquic, not kept);
- the datagram size the connection, its pacer and its congestion controller each keep a copy of;
- the loss detection's thresholds, per connection (``loss_thresholds``): aioquic reads them from
  module constants, so its one loss-detection method is redone here with ours as arguments;
- read-only views: unsent and unacknowledged bytes, connection IDs, the peer's certificate, the
  smoothed round trip.

``PRIVATE_NAMES`` lists each private name used, by the class that holds it;
tests/unit/test_quic_aioquic_pins.py checks each one, so an aioquic upgrade fails there, loudly,
rather than somewhere in a transfer. Nothing here assigns a module global of aioquic's.
"""

from __future__ import annotations

from typing import Any, cast

from aioquic.buffer import Buffer
from aioquic.quic import recovery as aioquic_recovery
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import pull_quic_transport_parameters
from aioquic.quic.recovery import QuicPacketPacer, QuicPacketRecovery, QuicPacketSpace

# aioquic's thresholds (RFC 9002's kPacketThreshold and kTimeThreshold); read, never assigned
PACKET_THRESHOLD: int = aioquic_recovery.K_PACKET_THRESHOLD
TIME_THRESHOLD: float = aioquic_recovery.K_TIME_THRESHOLD

# (where, name, kind): "method" is a function on the class, "attribute" a value an instance has
PRIVATE_NAMES: tuple[tuple[str, str, str], ...] = (
    ("QuicConnection", "_initialize", "method"),
    ("QuicConnection", "_parse_transport_parameters", "method"),
    ("QuicConnection", "_write_connection_limits", "method"),
    ("QuicConnection", "_write_stream_limits", "method"),
    ("QuicConnection", "_local_max_data", "attribute"),
    ("QuicConnection", "_local_max_streams_bidi", "attribute"),
    ("QuicConnection", "_local_max_streams_uni", "attribute"),
    ("QuicConnection", "_loss", "attribute"),
    ("QuicConnection", "_max_datagram_size", "attribute"),
    ("QuicConnection", "_streams", "attribute"),
    ("QuicConnection", "_peer_cid", "attribute"),
    ("QuicConnection", "_host_cids", "attribute"),
    ("QuicConnection", "_is_client", "attribute"),
    ("QuicPacketRecovery", "_detect_loss", "method"),
    ("QuicPacketRecovery", "_on_packets_lost", "method"),
    ("QuicPacketRecovery", "_in_persistent_congestion", "method"),
    ("QuicPacketRecovery", "_cc", "attribute"),
    ("QuicPacketRecovery", "_pacer", "attribute"),
    ("QuicPacketRecovery", "_rtt_initialized", "attribute"),
    ("QuicPacketRecovery", "_rtt_initial", "attribute"),
    ("QuicPacketRecovery", "_rtt_latest", "attribute"),
    ("QuicPacketRecovery", "_rtt_smoothed", "attribute"),
    ("QuicPacketPacer", "_max_datagram_size", "attribute"),
    ("QuicCongestionControl", "_max_datagram_size", "attribute"),
    ("tls.Context", "_request_client_certificate", "attribute"),
    ("tls.Context", "_peer_certificate", "attribute"),
    ("tls.Context", "_peer_certificate_chain", "attribute"),
    ("QuicStreamSender", "_pending", "attribute"),
    ("QuicStreamSender", "_pending_eof", "attribute"),
    ("QuicStreamSender", "_buffer_start", "attribute"),
    ("QuicStreamSender", "_buffer_stop", "attribute"),
)

UNKNOWN_PEER_UDP_PAYLOAD = 65527  # RFC 9000's max_udp_payload_size when the peer does not say


def detect_loss(recovery: QuicPacketRecovery, *, now: float, space: QuicPacketSpace,
                packet_threshold: int, time_threshold: float) -> None:
    """aioquic 1.7.2's ``QuicPacketRecovery._detect_loss`` with its two thresholds as arguments
    (aioquic reads module constants, which one connection cannot change for itself alone)."""
    loss_delay = time_threshold * (
        max(recovery._rtt_latest, recovery._rtt_smoothed) if recovery._rtt_initialized else recovery._rtt_initial
    )
    by_count = space.largest_acked_packet - packet_threshold
    by_time = now - loss_delay
    lost = []
    space.loss_time = None
    for packet_number, packet in space.sent_packets.items():
        if packet_number > space.largest_acked_packet:
            break
        sent_time = cast(float, packet.sent_time)  # set once sent (aioquic types it optional)
        if packet_number <= by_count or sent_time <= by_time:
            lost.append(packet)
        else:
            loss_time = sent_time + loss_delay
            if space.loss_time is None or space.loss_time > loss_time:
                space.loss_time = loss_time
    recovery._on_packets_lost(now=now, packets=lost, space=space,
                              persistent_congestion=recovery._in_persistent_congestion(packets=lost))


class AdaptedConnection(QuicConnection):
    """aioquic's ``QuicConnection`` with the seams listed in the module docstring. Subclasses
    decide the credit (``connection_limit_wanted``, ``stream_limit_wanted``) and the loss
    thresholds (``loss_thresholds``); by default all three are aioquic's own."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.peer_max_udp_payload = UNKNOWN_PEER_UDP_PAYLOAD
        recovery = self._loss

        def detect(*, now: float, space: QuicPacketSpace) -> None:
            packet_threshold, time_threshold = self.loss_thresholds()
            detect_loss(recovery, now=now, space=space, packet_threshold=packet_threshold, time_threshold=time_threshold)

        # on this connection's loss detector only: nothing of aioquic's is shared or swapped
        recovery._detect_loss = detect  # type: ignore[method-assign]

    # --- what subclasses decide -----------------------------------------------------------------
    def loss_thresholds(self) -> tuple[int, float]:
        """(packets, round trips) after which an unacknowledged packet is lost, asked at every
        loss detection; aioquic's 3 and 9/8 here."""
        return PACKET_THRESHOLD, TIME_THRESHOLD

    def connection_limit_wanted(self, current: int) -> int:
        """The MAX_DATA to grant now, given the one granted (``current``); aioquic's own rule
        (double once half has arrived) is never applied."""
        return current

    def stream_limit_wanted(self, stream_id: int, current: int) -> int:
        """The MAX_STREAM_DATA to grant ``stream_id`` now, given the one granted."""
        return current

    # --- settings ---------------------------------------------------------------------------
    def limit_peer_streams(self, bidirectional: int, unidirectional: int) -> None:
        """How many streams of each kind the peer may have open at once (announced as the
        initial MAX_STREAMS)."""
        self._local_max_streams_bidi.value = self._local_max_streams_bidi.sent = bidirectional
        self._local_max_streams_uni.value = self._local_max_streams_uni.sent = unidirectional

    def replace_pacer(self, pacer: QuicPacketPacer) -> None:
        """Pace this connection's sending with ``pacer`` instead of aioquic's."""
        self._loss._pacer = pacer

    def set_datagram_size(self, size: int) -> int:
        """Send datagrams of ``size`` bytes from now on: the connection, its pacer and its
        congestion controller each keep a copy (for their window arithmetic). Returns it."""
        self._max_datagram_size = size
        self._loss._pacer._max_datagram_size = size
        setattr(self._loss._cc, "_max_datagram_size", size)
        return size

    # --- views ------------------------------------------------------------------------------
    @property
    def datagram_size(self) -> int:
        # aioquic sets it untyped in __init__, so mypy may or may not know its type (it depends on order)
        return int(getattr(self, "_max_datagram_size"))

    @property
    def congestion_controller(self) -> Any:
        """The congestion controller aioquic built from the configuration's algorithm name."""
        return self._loss._cc

    @property
    def connection_limit(self) -> int:
        """The MAX_DATA granted to the peer so far."""
        return int(self._local_max_data.value)

    def stream_limit(self, stream_id: int) -> int | None:
        """The MAX_STREAM_DATA granted on ``stream_id`` (None: no such stream, or one we may not receive on)."""
        stream = self._streams.get(stream_id)
        return stream.max_stream_data_local if stream is not None and stream.max_stream_data_local else None

    def has_unsent_data(self) -> bool:
        """Whether a stream holds bytes (or a FIN) not sent yet: the pacer or the window holds
        them back, so more datagrams follow soon."""
        return any(len(s.sender._pending) or s.sender._pending_eof for s in self._streams.values())

    def unacknowledged(self, stream_id: int) -> int:
        """Bytes written to ``stream_id`` that the peer has not acknowledged yet (0 when unknown)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        return stream.sender._buffer_stop - stream.sender._buffer_start

    def peer_connection_id(self) -> bytes:
        """The connection ID our packets carry to the peer now."""
        return bytes(self._peer_cid.cid)

    def host_connection_ids(self) -> list[bytes]:
        """Our connection IDs the peer may address packets to."""
        return [bytes(cid.cid) for cid in self._host_cids]

    def peer_certificate(self) -> Any:
        """The certificate the peer presented in the handshake (None if it presented none)."""
        return self.tls._peer_certificate

    def peer_certificate_chain_length(self) -> int:
        """How many certificates the peer sent beyond its own."""
        return len(self.tls._peer_certificate_chain)

    def smoothed_rtt(self) -> float | None:
        """The loss detector's smoothed round trip, once it has a sample."""
        return self._loss._rtt_smoothed if self._loss._rtt_initialized else None

    # --- the overrides ----------------------------------------------------------------------
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

    def _write_connection_limits(self, builder, space) -> None:
        limit = self._local_max_data
        limit.value = self.connection_limit_wanted(limit.value)
        # aioquic doubles the credit once half of it has arrived: hide the arrivals from that rule
        used, limit.used = limit.used, 0
        try:
            super()._write_connection_limits(builder, space)
        finally:
            limit.used = used

    def _write_stream_limits(self, builder, space, stream) -> None:
        if stream.max_stream_data_local:
            stream.max_stream_data_local = self.stream_limit_wanted(stream.stream_id, stream.max_stream_data_local)
        highest, stream.receiver.highest_offset = stream.receiver.highest_offset, 0
        try:
            super()._write_stream_limits(builder, space, stream)
        finally:
            stream.receiver.highest_offset = highest


__all__ = ["PACKET_THRESHOLD", "PRIVATE_NAMES", "TIME_THRESHOLD", "AdaptedConnection", "detect_loss"]
