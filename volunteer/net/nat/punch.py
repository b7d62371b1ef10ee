"""The decisions of a DCUtR hole punch, pure: no sockets, no clock (``now`` is passed in).

Both sides run a ``PunchPlan`` for one relayed connection. The initiator (B, who received the
relayed connection) starts an attempt when it sends CONNECT and learns the round trip when the
peer's CONNECT comes back; it then sends SYNC and dials half a round trip later, which is when
the peer (A) receives SYNC and dials at once, so both SYNs cross in the NATs' mappings.

Roles of the upgrade: the spec makes B the client (Noise initiator) and A the server; go-libp2p
v0.32 and older swap them, so the last attempt swaps them too and either kind of peer succeeds
within ``max_attempts``. Over QUIC the client dials and the server sends random UDP packets to
the client's address until the client's dial arrives (go-libp2p's ``holePunch``): the same roles
decide who does which. Both transports are tried at once; the first direct connection wins.

A failed attempt is bounded by the relayed round trip (``budget``), not by dial and handshake
timeouts, so the next attempt's CONNECT comes long before the other side stops waiting for it.
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


def punch_budget(rtt: float | None) -> float:
    """Seconds one attempt's dials and handshakes may take: DCUTR_PUNCH_RTTS relayed round trips,
    within [DCUTR_MIN_PUNCH, DCUTR_MAX_PUNCH] (the maximum when the round trip is unknown)."""
    if rtt is None:
        return limits.DCUTR_MAX_PUNCH
    return min(limits.DCUTR_MAX_PUNCH, max(limits.DCUTR_MIN_PUNCH, limits.DCUTR_PUNCH_RTTS * rtt))


def punch_gaps(seed: float, budget: float = limits.QUIC_HOLE_PUNCH_TIMEOUT) -> list[float]:
    """The pauses between UDP punch packets: from QUIC_HOLE_PUNCH_FIRST_GAP, each a little longer
    with jitter (``seed`` in [0, 1) picks it), at most QUIC_HOLE_PUNCH_MAX_GAP, until ``budget``
    seconds are spent (go-libp2p's ``holePunch``; DCUtR asks for 10-200 ms)."""
    gaps: list[float] = []
    gap, spent, jitter = limits.QUIC_HOLE_PUNCH_FIRST_GAP, 0.0, seed
    while spent + gap <= budget:
        gaps.append(gap)
        spent += gap
        jitter = (jitter * 7.3 + 0.37) % 1.0  # deterministic for a seed: tests can replay it
        gap = min(limits.QUIC_HOLE_PUNCH_MAX_GAP, gap * (1.2 + 0.3 * jitter))
    return gaps


def should_repunch(last_try: float | None, now: float, *, punching: bool, has_direct: bool) -> bool:
    """After a network change (our addresses or reachability), punch a relayed peer again unless
    a punch is running, a direct connection exists, or the last try was under
    DCUTR_REPUNCH_INTERVAL ago."""
    if punching or has_direct:
        return False
    return last_try is None or now - last_try >= limits.DCUTR_REPUNCH_INTERVAL


DIRECT = "direct"  # our dial reached the peer
REVERSED = "reversed"  # the peer's dial (or SYN) reached our listener first
FAILED = "failed"


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
    transport: str = ""  # what the direct connection runs on: "quic" or "tcp"
    result: str = FAILED  # DIRECT, REVERSED or FAILED

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
    budget: float = limits.DCUTR_MAX_PUNCH  # seconds the dials and handshakes may take

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
    _offered: bool = field(default=True, init=False)  # our last CONNECT named addresses (A)
    # attempts counted by transport and result: {"quic": {"direct": 1}, "tcp": {"failed": 1}}
    tally: dict[str, dict[str, int]] = field(default_factory=dict, init=False)

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

    def connect_received(self, remote_addrs: Sequence[Multiaddr], now: float, *, pinged: float | None = None) -> PunchStep:
        """B got A's CONNECT: the round trip is measured; send SYNC and dial at ``dial_at``.
        ``pinged``: a round trip measured beside the exchange on the relayed connection (a muxer
        ping, which A's muxer answers at once): A may hold its CONNECT back while it waits for its
        observed addresses, and half of that wait in our dial timing would miss its SYN."""
        if self._connect_sent_at is None:
            raise ValueError("CONNECT received before one was sent")
        rtt = max(0.0, now - self._connect_sent_at)
        if pinged is not None:
            rtt = min(rtt, max(0.0, pinged))
        self._connect_sent_at = None
        self.outcome.rtt = rtt
        role = self.our_role(self.attempt)
        self.outcome.roles_swapped = role is Direction.INBOUND
        step = PunchStep(self.attempt, role, tuple(remote_addrs), dial_at=now + rtt / 2, budget=punch_budget(rtt))
        if not step.addrs:
            self.outcome.error = "the peer sent no addresses to punch"
        return step

    # --- responder (A) -----------------------------------------------------------------------
    def peer_connect(self, remote_addrs: Sequence[Multiaddr], now: float | None = None, *, offered: bool = True) -> int:
        """A got B's CONNECT (and answers with its own at ``now``, naming addresses or not:
        ``offered``): a new attempt starts."""
        if not self.attempts_left:
            raise ValueError("no hole punch attempts left")
        self.attempt += 1
        self.outcome.attempts = self.attempt
        self._remote_addrs = tuple(remote_addrs)
        self._connect_sent_at = now
        self._offered = offered
        return self.attempt

    def responder_role(self) -> Direction:
        """A's role in this attempt's upgrade: the spec's, except when A's CONNECT named no
        address. B then has nothing to dial and takes A's dial as a plain inbound connection, of
        which it is the server, so A dials as the client (B does the same, ``_their_dial``)."""
        return self.our_role(self.attempt) if self._offered else Direction.OUTBOUND

    def sync_received(self, now: float) -> PunchStep:
        """A got SYNC: dial now (B dials half a round trip after sending it, i.e. at the same moment).
        From our CONNECT to B's SYNC is one relayed round trip: it sizes the attempt's budget."""
        role = self.responder_role()
        self.outcome.roles_swapped = role is Direction.OUTBOUND
        if self._connect_sent_at is not None:
            self.outcome.rtt = max(0.0, now - self._connect_sent_at)
            self._connect_sent_at = None
        return PunchStep(self.attempt, role, self._remote_addrs, dial_at=now, budget=punch_budget(self.outcome.rtt))

    # --- either side -------------------------------------------------------------------------
    def attempt_ended(self, tried: Sequence[str], transport: str | None, result: str) -> None:
        """Count an attempt: over ``transport`` with ``result`` (DIRECT or REVERSED) when it gave a
        direct connection, else FAILED for every transport ``tried``."""
        if transport is not None and result != FAILED:
            counts = self.tally.setdefault(transport, {})
            counts[result] = counts.get(result, 0) + 1
            return
        for name in tried:
            counts = self.tally.setdefault(name, {})
            counts[FAILED] = counts.get(FAILED, 0) + 1

    def succeeded(self, now: float, transport: str = "", result: str = DIRECT) -> PunchOutcome:
        """A direct connection is up (over ``transport``; ``result``: DIRECT or REVERSED)."""
        self.outcome.success = True
        self.outcome.error = ""
        self.outcome.transport = transport
        self.outcome.result = result
        return self.finish(now)

    def failed(self, error: str, now: float) -> PunchOutcome:
        """The punch ended without a direct connection (``error`` says why)."""
        self.outcome.error = error
        return self.finish(now)

    def finish(self, now: float) -> PunchOutcome:
        """Close the books: the outcome's duration is measured from ``started_at``."""
        self.outcome.seconds = max(0.0, now - self.started_at)
        return self.outcome


__all__ = [
    "DIRECT",
    "FAILED",
    "REVERSED",
    "PunchOutcome",
    "PunchPlan",
    "PunchStep",
    "attempt_roles",
    "punch_budget",
    "punch_gaps",
    "should_repunch",
]
