"""aioquic's sans-I/O ``QuicConnection``, configured for libp2p and with flow control that waits
for the application.

aioquic grants a peer more credit as soon as bytes *arrive* (it doubles a window once half of it
is received), so a peer could make us buffer without bound while nobody reads. ``Engine`` grants
credit from what the application has *read* instead: a stream may hold at most its window of
unread bytes, a connection at most its window of all streams together. The two overrides touch
aioquic internals (pinned in pyproject.toml); tests/unit/test_quic_engine.py guards them.
"""

from __future__ import annotations

import ssl

from aioquic.buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import pull_quic_transport_parameters

from ... import limits
from ...tls import ALPN, Certificate
from .settings import QuicLimits


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

    def raise_datagram_size(self, size: int) -> int:
        """Send datagrams of up to ``size`` bytes from now on (never more than the peer accepts);
        returns the size in force. For paths whose MTU we know (loopback)."""
        # aioquic sets it untyped in __init__, so mypy may or may not know its type (it depends on order)
        current = int(getattr(self, "_max_datagram_size"))
        size = max(current, min(size, self.peer_max_udp_payload))
        self._max_datagram_size = size
        self._loss._pacer._max_datagram_size = size
        # reno and cubic keep their own copy, for their window arithmetic
        setattr(self._loss._cc, "_max_datagram_size", size)
        return size

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
