"""Which connection a datagram on a shared UDP socket belongs to, and who may start one. Pure.

One socket listens, dials and punches (go-libp2p's ``quicreuse``), so everything arriving on it
is routed by its destination connection ID (repair datagrams too): a known ID goes to its connection; an unknown one
may start a connection only if it is a full-sized QUIC v1 Initial and the source address (and
everyone together) has a free handshake slot; anything else (punch packets, stray datagrams,
garbage) is dropped and counted by reason. No sockets and no clock: ``now`` is passed in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ... import limits
from . import repair

# RFC 9000 section 14.1: a client's Initial is padded to at least 1200 bytes (anti-amplification)
MIN_INITIAL_SIZE = 1200
QUIC_VERSION_1 = 0x00000001
SUPPORTED_VERSIONS = (QUIC_VERSION_1,)
MAX_CID_LENGTH = 20


@dataclass(frozen=True)
class Route:
    """What the header of a datagram says: its destination connection ID and whether it may
    open a connection (a full-sized Initial of a version we speak)."""

    destination_cid: bytes
    opens_connection: bool


def route(datagram: bytes, cid_length: int = limits.QUIC_CONNECTION_ID_LENGTH) -> Route | None:
    """The route of ``datagram``, or None when it is not a QUIC packet we could act on."""
    if not datagram:
        return None
    first = datagram[0]
    if first == repair.MARKER:
        # a repair or hello (repair.py): addressed to a connection like its short-header packets
        cid = repair.connection_id(datagram)
        return Route(cid, False) if cid else None
    if not first & 0x80:
        # a short header (the bulk of traffic): the fixed bit, then our connection ID
        if not first & 0x40 or len(datagram) < 1 + cid_length:
            return None
        return Route(bytes(datagram[1 : 1 + cid_length]), False)
    # a long header (RFC 9000 section 17.2): flags, version, DCID length and DCID; the rest is
    # the connection's business (aioquic parses it again)
    if len(datagram) < 6:
        return None
    version = int.from_bytes(datagram[1:5], "big")
    cid_len = datagram[5]
    if cid_len > MAX_CID_LENGTH or len(datagram) < 6 + cid_len:
        return None
    destination_cid = bytes(datagram[6 : 6 + cid_len])
    initial = version == QUIC_VERSION_1 and (first & 0x30) == 0x00  # v1 long packet type 0: Initial
    opens = (
        initial
        and first & 0x40 != 0  # the fixed bit
        and len(datagram) >= MIN_INITIAL_SIZE
        and cid_len >= 8  # RFC 9000 section 7.2: a client's first DCID has 8 bytes or more
    )
    return Route(destination_cid, opens)


class Admission:
    """Bounds on inbound handshakes in flight: per source address and in all; drops by reason."""

    def __init__(
        self,
        max_pending: int = limits.QUIC_MAX_PENDING_HANDSHAKES,
        per_address: int = limits.QUIC_ADDRESS_PENDING_HANDSHAKES,
        max_connections: int = limits.QUIC_MAX_CONNECTIONS_PER_ENDPOINT,
    ) -> None:
        self.max_pending = max_pending
        self.per_address = per_address
        self.max_connections = max_connections
        self.pending: Counter[str] = Counter()
        self.connections = 0
        self.dropped: Counter[str] = Counter()

    def admit(self, address: str) -> bool:
        """Whether a handshake from ``address`` may start now; a yes takes a slot (``done`` frees it)."""
        if self.connections >= self.max_connections:
            self.dropped["connection_limit"] += 1
            return False
        if sum(self.pending.values()) >= self.max_pending:
            self.dropped["pending_handshakes"] += 1
            return False
        if self.pending[address] >= self.per_address:
            self.dropped["address_pending_handshakes"] += 1
            return False
        self.pending[address] += 1
        self.connections += 1
        return True

    def handshake_over(self, address: str) -> None:
        """The handshake from ``address`` ended (either way): its slot is free."""
        self.pending[address] -= 1
        if self.pending[address] <= 0:
            del self.pending[address]

    def connection_over(self) -> None:
        """A connection admitted here ended."""
        self.connections = max(0, self.connections - 1)

    def drop(self, reason: str) -> None:
        """Count a datagram dropped for ``reason`` (unparseable, unknown connection, ...)."""
        self.dropped[reason] += 1


__all__ = ["Admission", "MIN_INITIAL_SIZE", "Route", "SUPPORTED_VERSIONS", "route"]
