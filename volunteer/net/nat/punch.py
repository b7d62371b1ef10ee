"""The decisions of a DCUtR hole punch, pure: no sockets, no clock (``now`` is passed in).

Both sides run a ``PunchPlan`` for one relayed connection. The initiator (B, who received the
relayed connection) starts an attempt when it sends CONNECT and learns the round trip when the
peer's CONNECT comes back; it then sends SYNC and dials half a round trip later, which is when
the peer (A) receives SYNC and dials at once, so both SYNs cross in the NATs' mappings.

Roles of the upgrade: the spec makes B the client (Noise initiator) and A the server; go-libp2p
v0.32 and older swap them, so the last attempt swaps them too and either kind of peer succeeds
within ``max_attempts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..transport.base import Direction
from .. import limits
from ..multiaddr import Multiaddr


def attempt_roles(attempt: int, max_attempts: int = limits.DCUTR_MAX_ATTEMPTS) -> tuple[Direction, Direction]:
    """(initiator B's role, responder A's role) for an attempt (1-based): spec roles, swapped on the last."""
    if attempt == max_attempts and max_attempts > 1:
        return Direction.INBOUND, Direction.OUTBOUND
    return Direction.OUTBOUND, Direction.INBOUND


@dataclass
class PunchOutcome:
    """What happened to one hole punch (shown by the dashboard and the benchmark)."""

    peer: str
    success: bool = False
    attempts: int = 0
    rtt: float | None = None  # relayed round trip, measured by CONNECT
    seconds: float = 0.0  # from the relayed connection to the direct one
    error: str = ""
    roles_swapped: bool = False

    @property
    def rtts(self) -> float | None:
        """The time to a direct connection in relayed round trips (a figure the benchmark compares)."""
        return self.seconds / self.rtt if self.rtt else None


@dataclass(frozen=True)
class PunchStep:
    """What to do for one attempt: dial ``addrs`` at ``dial_at`` with our upgrade ``role``.
    No addresses means there is nothing to punch this attempt (the peer is not observable)."""

    attempt: int
    role: Direction
    addrs: tuple[Multiaddr, ...]
    dial_at: float

    @property
    def expects_inbound_punch(self) -> bool:
        """As the upgrade's client, the peer's SYN may reach our listener before ours leaves: such
        an inbound connection is this punch and keeps our (client) role."""
        return self.role is Direction.OUTBOUND and bool(self.addrs)


@dataclass
class PunchPlan:
    """One side's bookkeeping for a hole punch with ``peer`` over one relayed connection."""

    peer: str
    started_at: float
    initiator: bool = True
    max_attempts: int = limits.DCUTR_MAX_ATTEMPTS
    attempt: int = 0
    outcome: PunchOutcome = field(init=False)
    _connect_sent_at: float | None = field(default=None, init=False)
    _remote_addrs: tuple[Multiaddr, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        self.outcome = PunchOutcome(self.peer)

    @property
    def attempts_left(self) -> bool:
        """Whether another attempt may start (none after a success)."""
        return not self.outcome.success and self.attempt < self.max_attempts

    def our_role(self, attempt: int) -> Direction:
        """Our role in the upgrade of ``attempt``'s punched connection."""
        initiator_role, responder_role = attempt_roles(attempt, self.max_attempts)
        return initiator_role if self.initiator else responder_role

    # --- initiator (B) -----------------------------------------------------------------------
    def connect_sent(self, now: float) -> int:
        """B sent CONNECT: a new attempt starts; returns its number."""
        if not self.attempts_left:
            raise ValueError("no hole punch attempts left")
        self.attempt += 1
        self.outcome.attempts = self.attempt
        self._connect_sent_at = now
        return self.attempt

    def connect_received(self, remote_addrs: Sequence[Multiaddr], now: float) -> PunchStep:
        """B got A's CONNECT: the round trip is measured; send SYNC and dial at ``dial_at``."""
        if self._connect_sent_at is None:
            raise ValueError("CONNECT received before one was sent")
        rtt = max(0.0, now - self._connect_sent_at)
        self._connect_sent_at = None
        self.outcome.rtt = rtt
        role = self.our_role(self.attempt)
        self.outcome.roles_swapped = role is Direction.INBOUND
        step = PunchStep(self.attempt, role, tuple(remote_addrs), dial_at=now + rtt / 2)
        if not step.addrs:
            self.outcome.error = "the peer sent no addresses to punch"
        return step

    # --- responder (A) -----------------------------------------------------------------------
    def peer_connect(self, remote_addrs: Sequence[Multiaddr]) -> int:
        """A got B's CONNECT: a new attempt starts (A answers with its own CONNECT)."""
        if not self.attempts_left:
            raise ValueError("no hole punch attempts left")
        self.attempt += 1
        self.outcome.attempts = self.attempt
        self._remote_addrs = tuple(remote_addrs)
        return self.attempt

    def sync_received(self, now: float) -> PunchStep:
        """A got SYNC: dial now (B dials half a round trip after sending it, i.e. at the same moment)."""
        role = self.our_role(self.attempt)
        self.outcome.roles_swapped = role is Direction.OUTBOUND
        return PunchStep(self.attempt, role, self._remote_addrs, dial_at=now)

    # --- either side -------------------------------------------------------------------------
    def succeeded(self, now: float) -> PunchOutcome:
        """A direct connection is up."""
        self.outcome.success = True
        self.outcome.error = ""
        return self.finish(now)

    def failed(self, error: str, now: float) -> PunchOutcome:
        """The punch ended without a direct connection (``error`` says why)."""
        self.outcome.error = error
        return self.finish(now)

    def finish(self, now: float) -> PunchOutcome:
        """Close the books: the outcome's duration is measured from ``started_at``."""
        self.outcome.seconds = max(0.0, now - self.started_at)
        return self.outcome


__all__ = ["PunchOutcome", "PunchPlan", "PunchStep", "attempt_roles"]
