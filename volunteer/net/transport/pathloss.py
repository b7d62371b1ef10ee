"""How much of what we sent a path lost, as its transport sees it: TCP's retransmitted bytes
(``TCP_INFO``), QUIC's bytes declared lost. The Host ranks a connection that loses packets with
nothing to repair them after one that repairs them (QUIC with repair datagrams)."""

from __future__ import annotations

import socket
import struct
import sys
from collections import deque
from dataclasses import dataclass

from .. import limits

# struct tcp_info (linux/tcp.h): tcpi_bytes_sent and tcpi_bytes_retrans (u64, Linux 5.5 and later)
_BYTES_SENT_AT = 200
_TCP_INFO_LENGTH = 216


@dataclass(frozen=True)
class PathLoss:
    """Bytes we sent on a connection and how many of them the path lost; ``repaired``: lost
    packets are rebuilt at the receiver without a round trip (QUIC with repairs), ``rebuilt``
    of them so far; ``steady``: the loss over the last bytes sent in congestion avoidance
    (see ``LossWindow``), where known."""

    sent: int
    lost: int
    repaired: bool = False
    steady: PathLoss | None = None
    rebuilt: int = 0

    @property
    def share(self) -> float:
        return self.lost / self.sent if self.sent else 0.0

    def hurts(self) -> bool:
        """Whether the loss costs round trips, once enough bytes went: unrepaired loss of
        ``LOSSY_PATH_SHARE`` or more. A repaired path hurts when its losses are those of a full
        modem queue, which drops runs of packets beyond repair and which TCP's congestion control
        handles at least as well: ``QUIC_LOSS_TOLERANCE`` or more of what it sent is lost unrepaired,
        and still lately in congestion avoidance (``REPAIRED_STEADY_SHARE``: a slow start
        overshooting the queue once is the sender's doing, not the path's); and either the loss
        is heavier than random loss on a line ever is (``FULL_QUEUE_SHARE``) or repairs rebuild
        next to nothing (under ``LOSSY_PATH_SHARE``: the line itself barely loses, so repairs
        are not what the path needs; a line that does lose, next to other flows that fill its
        queue, keeps its repairs)."""
        if not self.repaired:
            return self.sent >= limits.LOSSY_PATH_MIN_BYTES and self.share >= limits.LOSSY_PATH_SHARE
        if self.sent < limits.REPAIRED_PATH_MIN_BYTES or self.share < limits.QUIC_LOSS_TOLERANCE:
            return False
        steady = self.steady
        if steady is not None and (steady.sent < limits.LOSSY_PATH_MIN_BYTES
                                   or steady.share < limits.REPAIRED_STEADY_SHARE):
            return False
        return self.share >= limits.FULL_QUEUE_SHARE or self.rebuilt < limits.LOSSY_PATH_SHARE * self.sent


class LossWindow:
    """Bytes sent and bytes lost over about the last ``span`` bytes sent (between ``span`` and
    ``span`` plus a ``marks``-th of it), or since the start while fewer went: what a path loses
    now, not what it lost when the connection was young."""

    def __init__(self, span: int, marks: int = 8) -> None:
        self.step = max(1, span // marks)
        self._marks: deque[tuple[int, int]] = deque([(0, 0)], maxlen=marks + 1)
        self.sent = 0
        self.lost = 0

    def on_sent(self, size: int) -> None:
        self.sent += size
        if self.sent - self._marks[-1][0] >= self.step:
            self._marks.append((self.sent, self.lost))

    def on_lost(self, size: int) -> None:
        self.lost += size

    def recent(self) -> PathLoss:
        sent, lost = self._marks[0]
        return PathLoss(sent=self.sent - sent, lost=self.lost - lost)


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


__all__ = ["LossWindow", "PathLoss", "tcp_loss"]
