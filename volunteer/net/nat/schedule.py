"""When the relay client (re)reserves, and on which relays: pure, ``now`` passed in.

``ReservationSchedule`` keeps ``want`` reservations among a list of relays: a reservation is
refreshed at 3/4 of its lifetime (earlier by the clock-skew allowance when that is later than 3/4),
a relay that refused or could not be reached is retried after 2^failures seconds (capped), and a
relay we lost the connection to is reserved again (the spec: a reservation lives only as long as
the connection to its relay). The driver (``relay_client.ReservationManager``) asks ``due(now)``
what to try, reports each result, and sleeps until ``next_wakeup(now)`` or an event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import limits
from ..identity import PeerID
from ..multiaddr import Multiaddr
from .circuit import Limit


@dataclass
class Reservation:
    """A slot on a relay, as the relay granted it."""

    relay: PeerID
    relay_addrs: list[Multiaddr]  # the relay's addresses, ending in /p2p/RELAY
    expire_unix: int
    ttl: float  # seconds from when it was granted, as we trust it (capped, skew-adjusted)
    granted_at: float  # trio clock
    limit: Limit
    voucher: bytes | None = None

    @property
    def circuit_addrs(self) -> list[Multiaddr]:
        """Where others reach us through this relay (``…/p2p/RELAY/p2p-circuit``)."""
        return [addr.encapsulate("/p2p-circuit") for addr in self.relay_addrs]

    def refresh_at(self) -> float:
        """When to refresh: at 3/4 of the lifetime, and never later than skew allows."""
        lifetime = min(self.ttl * 0.75, self.ttl - limits.CLOCK_SKEW_ALLOWANCE)
        return self.granted_at + max(limits.MIN_RESERVATION_REFRESH, lifetime)


@dataclass
class RelayStatus:
    """One relay as the schedule sees it (and the dashboard shows it)."""

    addr: Multiaddr
    reservation: Reservation | None = None
    last_error: str = ""
    failures: int = 0
    retry_at: float = 0.0  # trio clock: no new attempt before this after a failure
    rtt: float | None = None


class ReservationSchedule:
    """Which relays to (re)reserve and when; see the module docstring."""

    def __init__(self, relays: Sequence[Multiaddr | str], want: int = limits.WANT_RESERVATIONS,
                 max_backoff: float = limits.RESERVATION_MAX_BACKOFF) -> None:
        self.want = want
        self.max_backoff = max_backoff
        self.relays = [RelayStatus(Multiaddr(addr)) for addr in relays]

    @property
    def reservations(self) -> list[Reservation]:
        """The reservations we hold, in the relays' order."""
        return [status.reservation for status in self.relays if status.reservation]

    def circuit_addrs(self) -> list[Multiaddr]:
        """The circuit addresses of every reservation we hold (what we advertise)."""
        return [addr for reservation in self.reservations for addr in reservation.circuit_addrs]

    def held(self, now: float) -> int:
        """Reservations that need no refresh yet."""
        return sum(1 for s in self.relays if s.reservation and s.reservation.refresh_at() > now)

    def satisfied(self, now: float) -> bool:
        """Whether we hold ``want`` reservations that need nothing until later."""
        return self.held(now) >= self.want

    def due(self, now: float) -> list[RelayStatus]:
        """Relays to try now, best first: reservations due for a refresh, then relays without one
        that are not backing off. Try them in order until ``satisfied(now)``."""
        refresh = [s for s in self.relays if s.reservation and s.reservation.refresh_at() <= now]
        fresh = [s for s in self.relays if not s.reservation and now >= s.retry_at]
        return refresh + fresh

    def backoff(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failures in a row: 2^failures, capped."""
        return min(self.max_backoff, 2.0 ** min(failures, 64))

    def on_reserved(self, status: RelayStatus, reservation: Reservation, rtt: float | None) -> None:
        """The relay granted (or refreshed) a reservation."""
        status.reservation = reservation
        status.failures = 0
        status.last_error = ""
        status.rtt = rtt

    def on_failed(self, status: RelayStatus, error: str, now: float) -> None:
        """The relay refused or could not be reached: back off."""
        status.reservation = None
        status.failures += 1
        status.last_error = error
        status.retry_at = now + self.backoff(status.failures)

    def on_relay_lost(self, relay: PeerID) -> bool:
        """Our last connection to ``relay`` closed: its reservation is gone. True if we held one."""
        lost = False
        for status in self.relays:
            if status.reservation and status.reservation.relay == relay:
                status.reservation = None
                lost = True
        return lost

    def next_wakeup(self, now: float) -> float:
        """When the driver must look again: the next refresh or retry, or ``max_backoff`` from now."""
        if self.satisfied(now):
            # Spare relays (backing off, or holding a surplus reservation past its refresh time)
            # need nothing until a held reservation does: waking for them would spin.
            times = [r.refresh_at() for r in self.reservations if r.refresh_at() > now]
        else:
            times = [r.refresh_at() for r in self.reservations]
            times += [max(now, s.retry_at) for s in self.relays if not s.reservation and s.failures]
        return min(times, default=now + self.max_backoff)


__all__ = ["RelayStatus", "Reservation", "ReservationSchedule"]
