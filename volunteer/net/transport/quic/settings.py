"""The bounds of a QUIC connection, in a module of their own: naming them loads no aioquic
(a Host that never speaks QUIC never pays for importing it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ... import limits


CONGESTION_CONTROLS = ("cubic", "ours")


@dataclass(frozen=True)
class QuicLimits:
    """The bounds of one QUIC connection (defaults from volunteer.net.limits)."""

    max_streams: int = limits.QUIC_MAX_STREAMS
    stream_window: int = limits.QUIC_STREAM_WINDOW
    connection_window: int = limits.QUIC_CONNECTION_WINDOW
    send_buffer: int = limits.QUIC_SEND_BUFFER
    accept_backlog: int = limits.QUIC_ACCEPT_BACKLOG
    idle_timeout: float = limits.QUIC_IDLE_TIMEOUT
    keepalive_interval: float = limits.QUIC_KEEPALIVE_INTERVAL
    max_datagram: int = limits.QUIC_MAX_DATAGRAM
    loopback_datagram: int = limits.QUIC_LOOPBACK_DATAGRAM
    repairs: bool = True  # offer repair datagrams to peers that speak them (repair.py)
    # congestion control (congestion.py): "ours" (RepairAwareReno: measured faster on lossy long
    # paths, docs/ARCHITECTURE.md) or "cubic" (aioquic's own); VOLUNTEER_QUIC_CONGESTION chooses
    # for a whole process (benchmarks/wan.py --quic-congestion)
    congestion: str = field(default_factory=lambda: os.environ.get("VOLUNTEER_QUIC_CONGESTION", "ours"))

    def __post_init__(self) -> None:
        if self.congestion not in CONGESTION_CONTROLS:
            raise ValueError(f"QUIC congestion control {self.congestion!r}: one of {', '.join(CONGESTION_CONTROLS)}")


__all__ = ["CONGESTION_CONTROLS", "QuicLimits"]
