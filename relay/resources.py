"""Reservation and circuit accounting for the relay (sans-I/O: ``now`` is always passed in).

Pure bookkeeping: who holds a reservation until when, how many circuits each peer has, who is
sending requests too fast, and counters of refusals by reason for the metrics.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from dataclasses import dataclass

from volunteer.net.identity import PeerID
from volunteer.net.nat.circuit import (
    NO_RESERVATION,
    OK,
    RESERVATION_REFUSED,
    RESOURCE_LIMIT_EXCEEDED,
    status_name,
)

from .limits import RelayLimits

RATE_WINDOW = 60.0


@dataclass
class ReservationSlot:
    peer: PeerID
    ip: str
    expires: float  # monotonic


class RateLimiter:
    """At most ``limit`` events per key in any RATE_WINDOW seconds; bounded memory."""

    def __init__(self, limit: int, max_keys: int = 65536) -> None:
        self.limit = limit
        self.max_keys = max_keys
        self._events: dict[object, deque[float]] = {}

    def allow(self, key: object, now: float) -> bool:
        events = self._events.get(key)
        if events is None:
            if len(self._events) >= self.max_keys:
                self._prune(now)
                if len(self._events) >= self.max_keys:
                    return False
            events = self._events[key] = deque()
        while events and events[0] <= now - RATE_WINDOW:
            events.popleft()
        if len(events) >= self.limit:
            return False
        events.append(now)
        return True

    def _prune(self, now: float) -> None:
        for key in [k for k, v in self._events.items() if not v or v[-1] <= now - RATE_WINDOW]:
            del self._events[key]


class RelayResources:
    """Decides RESERVE and CONNECT requests within RelayLimits."""

    def __init__(self, limits: RelayLimits | None = None) -> None:
        self.limits = limits or RelayLimits()
        self.reservations: dict[PeerID, ReservationSlot] = {}
        self.circuits: Counter[PeerID] = Counter()
        self.open_circuits = 0
        self.refusals: Counter[str] = Counter()
        self.bytes_relayed = 0
        self.circuits_total = 0
        self._reserve_by_peer = RateLimiter(self.limits.reserve_rate_per_peer)
        self._reserve_by_ip = RateLimiter(self.limits.reserve_rate_per_ip)
        self._connect_by_peer = RateLimiter(self.limits.connect_rate_per_peer)

    def _refuse(self, status: int, reason: str | None = None) -> int:
        self.refusals[reason or status_name(status)] += 1
        return status

    def expire(self, now: float) -> None:
        for peer in [p for p, slot in self.reservations.items() if slot.expires <= now]:
            del self.reservations[peer]

    def reserve(self, peer: PeerID, ip: str, now: float) -> tuple[int, float]:
        """(status, monotonic expiry). A refresh by a peer that holds a reservation extends it."""
        self.expire(now)
        if not self._reserve_by_peer.allow(peer, now) or not self._reserve_by_ip.allow(ip, now):
            return self._refuse(RESOURCE_LIMIT_EXCEEDED, "reserve_rate"), 0.0
        existing = self.reservations.get(peer)
        if existing is None:
            if len(self.reservations) >= self.limits.max_reservations:
                return self._refuse(RESERVATION_REFUSED, "max_reservations"), 0.0
            per_ip = sum(1 for slot in self.reservations.values() if slot.ip == ip)
            if per_ip >= self.limits.max_reservations_per_ip:
                return self._refuse(RESERVATION_REFUSED, "max_reservations_per_ip"), 0.0
        expires = now + self.limits.reservation_ttl
        self.reservations[peer] = ReservationSlot(peer, ip, expires)
        return OK, expires

    def drop_reservation(self, peer: PeerID) -> None:
        """The peer's last connection to us closed: its reservation is no longer valid (spec)."""
        self.reservations.pop(peer, None)

    def has_reservation(self, peer: PeerID, now: float) -> bool:
        slot = self.reservations.get(peer)
        return slot is not None and slot.expires > now

    def open_circuit(self, source: PeerID, target: PeerID, now: float) -> int:
        if not self._connect_by_peer.allow(source, now):
            return self._refuse(RESOURCE_LIMIT_EXCEEDED, "connect_rate")
        if not self.has_reservation(target, now):
            return self._refuse(NO_RESERVATION)
        if self.open_circuits >= self.limits.max_circuits:
            return self._refuse(RESOURCE_LIMIT_EXCEEDED, "max_circuits")
        for peer in (source, target):
            if self.circuits[peer] >= self.limits.max_circuits_per_peer:
                return self._refuse(RESOURCE_LIMIT_EXCEEDED, "max_circuits_per_peer")
        self.circuits[source] += 1
        self.circuits[target] += 1
        self.open_circuits += 1
        self.circuits_total += 1
        return OK

    def close_circuit(self, source: PeerID, target: PeerID) -> None:
        for peer in (source, target):
            self.circuits[peer] -= 1
            if self.circuits[peer] <= 0:
                del self.circuits[peer]
        self.open_circuits -= 1

    def refused(self, reason: str) -> None:
        """Count a refusal decided outside this class (malformed message, failed stop, …)."""
        self.refusals[reason] += 1
