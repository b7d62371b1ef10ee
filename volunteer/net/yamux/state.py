"""Per-stream state of a yamux session: where its opening handshake and its two directions stand,
and its flow-control counters."""

from __future__ import annotations

import enum
from .. import limits
from .budget import StreamBudget


class Opening(enum.Enum):
    """Where a stream's opening handshake stands."""

    SYN_SENT = "syn-sent"  # ours: waiting for the peer's ACK
    SYN_RECEIVED = "syn-received"  # theirs: waiting for the application to accept (we then ACK)
    ESTABLISHED = "established"


class Phase(enum.Enum):
    """Which directions of a stream are still open."""

    OPEN = "open"
    LOCAL_CLOSED = "local-closed"  # we sent FIN; the peer may still send
    REMOTE_CLOSED = "remote-closed"  # the peer sent FIN; we may still send
    CLOSED = "closed"  # both FINs
    RESET = "reset"  # RST either way: both directions aborted


class StreamState:
    __slots__ = (
        "stream_id", "send_window", "recv_window", "recv_credit", "consumed", "last_update",
        "opening", "phase", "budget", "reading",
    )

    def __init__(self, stream_id: int, window: int, now: float, opening: Opening, budget: StreamBudget | None = None) -> None:
        self.stream_id = stream_id
        self.send_window = limits.YAMUX_INITIAL_WINDOW  # the peer's grant to us (spec default)
        self.recv_window = window  # the window we currently grant
        self.recv_credit = limits.YAMUX_INITIAL_WINDOW  # what the peer may still send us
        self.consumed = 0  # bytes the application read since our last window update
        self.last_update = now
        self.opening = opening
        self.phase = Phase.OPEN
        self.budget = budget  # unread bytes are reserved there
        self.reading = True  # False once our application closed the stream: data is no longer read

    @property
    def local_fin(self) -> bool:
        return self.phase is Phase.LOCAL_CLOSED or self.phase is Phase.CLOSED

    @property
    def remote_fin(self) -> bool:
        return self.phase is Phase.REMOTE_CLOSED or self.phase is Phase.CLOSED

    @property
    def reset(self) -> bool:
        return self.phase is Phase.RESET

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED or self.phase is Phase.RESET

    def finish_local(self) -> None:
        self.phase = Phase.CLOSED if self.phase is Phase.REMOTE_CLOSED else Phase.LOCAL_CLOSED

    def finish_remote(self) -> None:
        self.phase = Phase.CLOSED if self.phase is Phase.LOCAL_CLOSED else Phase.REMOTE_CLOSED
