"""aioquic's sans-I/O ``QuicConnection``, configured for libp2p and with flow control that waits
for the application.

aioquic grants a peer more credit as soon as bytes *arrive* (it doubles a window once half of it
is received), so a peer could make us buffer without bound while nobody reads. ``Engine`` grants
credit from what the application has *read* instead: a stream may hold at most its window of
unread bytes, a connection at most its window of all streams together. What that and the rest
take of aioquic beyond its public interface sits in ``aioquic_adapter.py``.

Its congestion control is ``QuicLimits.congestion`` (``congestion.py``); with repairs on and the
path losing, its loss detection waits for a block's repairs (``loss_thresholds``).
"""

from __future__ import annotations

import ssl

from aioquic.quic.configuration import QuicConfiguration

from ... import limits
from ...tls import ALPN, Certificate
from .aioquic_adapter import PACKET_THRESHOLD, AdaptedConnection
from .congestion import ALGORITHMS, LinuxLikePacer, LossAccounting
from .repair import BLOCK_SIZE
from .settings import QuicLimits

REPAIRED_TIME_THRESHOLD = 5 / 4  # round trips after which a packet is lost, with repairs on (aioquic: 9/8)
MIN_DATAGRAM = 1200  # RFC 9000: every QUIC path carries datagrams this large


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
        congestion_control_algorithm=ALGORITHMS[quic_limits.congestion],
    )


class Engine(AdaptedConnection):
    """A ``QuicConnection`` whose credit follows what the application read (see the module docstring),
    which asks a client for its certificate when it is the server, and which bounds peer streams."""

    def __init__(self, *, configuration: QuicConfiguration, quic_limits: QuicLimits, **kwargs) -> None:
        super().__init__(configuration=configuration, **kwargs)
        self.quic_limits = quic_limits
        self.read_offsets: dict[int, int] = {}  # stream id -> bytes the application has read
        self.read_total = 0
        # the peer's concurrent bidirectional streams; libp2p uses no unidirectional ones
        self.limit_peer_streams(quic_limits.max_streams, 0)
        if quic_limits.congestion == "ours":
            self.replace_pacer(LinuxLikePacer(max_datagram_size=self.datagram_size, congestion=self.congestion))

    def loss_thresholds(self) -> tuple[int, float]:
        """aioquic's (a packet is lost once three later ones are acknowledged or 9/8 of a round
        trip passed); while repairs are on and the path loses, once a block and three more are,
        or 5/4 of a round trip passed: the receiver rebuilds a lost member when the block's
        repairs arrive (at most an eighth of a round trip after it, see ``RepairEncoder.wait_for``)
        and acknowledges it up to its ACK delay later. Otherwise every rebuilt packet would be
        sent again for nothing."""
        if self.congestion.tolerant:
            return PACKET_THRESHOLD + BLOCK_SIZE, REPAIRED_TIME_THRESHOLD
        return super().loss_thresholds()

    def raise_datagram_size(self, size: int) -> int:
        """Send datagrams of up to ``size`` bytes from now on (never more than the peer accepts);
        returns the size in force. For paths whose MTU we know (loopback)."""
        return self.set_datagram_size(max(self.datagram_size, min(size, self.peer_max_udp_payload)))

    def lower_datagram_size(self, size: int) -> int:
        """Send datagrams of at most ``size`` bytes from now on (room for what repairs add)."""
        return self.set_datagram_size(min(self.datagram_size, max(size, MIN_DATAGRAM)))

    @property
    def congestion(self) -> LossAccounting:
        """The congestion controller (ours: every configuration here names one of congestion.py's)."""
        cc = self.congestion_controller
        assert isinstance(cc, LossAccounting)
        return cc

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
        granted = self.stream_limit(stream_id)
        if granted is not None and self.stream_limit_wanted(stream_id, granted) != granted:
            return True
        return self.connection_limit_wanted(self.connection_limit) != self.connection_limit

    # --- flow control from application reads -----------------------------------------------
    def connection_limit_wanted(self, current: int) -> int:
        """What was read plus the window, once that grants at least half a window more."""
        window = self.quic_limits.connection_window
        wanted = self.read_total + window
        return wanted if wanted - current >= window // 2 else current

    def stream_limit_wanted(self, stream_id: int, current: int) -> int:
        """The same for one stream and its window."""
        window = self.quic_limits.stream_window
        wanted = self.read_offsets.get(stream_id, 0) + window
        return wanted if wanted - current >= window // 2 else current


__all__ = ["Engine", "QuicLimits", "configuration"]
