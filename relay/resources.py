"""Reservation and circuit accounting for the relay (sans-I/O: ``now`` is always passed in).

Pure bookkeeping: who holds a reservation until when, how many circuits each peer has, who is
sending requests too fast, and counters of refusals by reason for the metrics.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from volunteer.net.identity import PeerID
from volunteer.net.nat.circuit import (
    NO_RESERVATION,
    OK,
    RESERVATION_REFUSED,
    RESOURCE_LIMIT_EXCEEDED,
    status_name,
)
from volunteer.net.ratelimit import RateLimiter

from .limits import RelayLimits

@dataclass
class ReservationSlot:
    """One peer's reservation: from which IP, until when."""

    peer: PeerID
    ip: str
    expires: float  # monotonic


class RelayResources:
    """Decides RESERVE and CONNECT requests within RelayLimits."""

    def __init__(self, limits: RelayLimits | None = None) -> None:
        self.limits = limits or RelayLimits()
        self.reservations: dict[PeerID, ReservationSlot] = {}
        self.circuits: Counter[PeerID] = Counter()
        self.open_circuits = 0
        self.refusals: Counter[str] = Counter()
        self.bytes_relayed = 0
        self.bytes_by_direction = [0, 0]  # [sent by circuits' initiators, sent back to them]
        self.circuits_total = 0
        self._reserve_by_peer = self.limits.per_minute(self.limits.reserve_rate_per_peer)
        self._reserve_by_ip = self.limits.per_minute(self.limits.reserve_rate_per_ip)
        self._connect_by_peer = self.limits.per_minute(self.limits.connect_rate_per_peer)

    def _refuse(self, status: int, reason: str | None = None) -> int:
        self.refusals[reason or status_name(status)] += 1
        return status

    def expire(self, now: float) -> None:
        for peer in [p for p, slot in self.reservations.items() if slot.expires <= now]:
            del self.reservations[peer]

    def reserve(self, peer: PeerID, ip: str, now: float) -> tuple[int, float]:
        """(status, monotonic expiry). A refresh by a peer that holds a reservation extends it."""
        self.expire(now)
        if not self._reserve_by_peer.allow(peer, now=now) or not self._reserve_by_ip.allow(ip, now=now):
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
        if not self._connect_by_peer.allow(source, now=now):
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
