"""How much of what we sent a path lost, as its transport sees it: TCP's retransmitted bytes
(``TCP_INFO``), QUIC's bytes declared lost. The Host ranks a connection that loses packets with
nothing to repair them after one that repairs them (QUIC with repair datagrams)."""

from __future__ import annotations

import socket
import struct
import sys
from dataclasses import dataclass

from .. import limits

# struct tcp_info (linux/tcp.h): tcpi_bytes_sent and tcpi_bytes_retrans (u64, Linux 5.5 and later)
_BYTES_SENT_AT = 200
_TCP_INFO_LENGTH = 216


@dataclass(frozen=True)
class PathLoss:
    """Bytes we sent on a connection and how many of them the path lost; ``repaired``: lost
    packets are rebuilt at the receiver without a round trip (QUIC with repairs)."""

    sent: int
    lost: int
    repaired: bool = False

    @property
    def share(self) -> float:
        return self.lost / self.sent if self.sent else 0.0

    def hurts(self) -> bool:
        """Whether the loss costs round trips, once enough bytes went: unrepaired loss of
        ``LOSSY_PATH_SHARE`` or more; or, repaired, more than the repairs absorb
        (``QUIC_LOSS_TOLERANCE``: loss that heavy is a full queue dropping runs of packets, which
        TCP's congestion control handles at least as well)."""
        if self.repaired:
            return self.sent >= limits.REPAIRED_PATH_MIN_BYTES and self.share >= limits.QUIC_LOSS_TOLERANCE
        return self.sent >= limits.LOSSY_PATH_MIN_BYTES and self.share >= limits.LOSSY_PATH_SHARE


def tcp_loss(sock: socket.socket) -> PathLoss | None:
    """What the kernel retransmitted of what ``sock`` sent (None where TCP_INFO lacks the figures)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LENGTH)
    except OSError:
        return None
    if len(info) < _TCP_INFO_LENGTH:
        return None
    sent, retransmitted = struct.unpack_from("QQ", info, _BYTES_SENT_AT)
    # bytes_sent counts the retransmissions too
    return PathLoss(sent=sent - retransmitted, lost=retransmitted)


__all__ = ["PathLoss", "tcp_loss"]
