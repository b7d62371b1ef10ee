"""A node that turns out public gives its relay slots back (NatManager reserves while the first
AutoNAT verdict is pending, so that a NATed volunteer is reachable within a second)."""

from __future__ import annotations

from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.circuit import Limit
from volunteer.net.nat.relay_client import ReservationManager
from volunteer.net.nat.schedule import Reservation

RELAY = KeyPair.generate().peer_id
ADDR = Multiaddr(f"/ip4/203.0.113.7/tcp/4001/p2p/{RELAY}")


def test_set_want_zero_drops_the_reservations_and_restores_on_demand():
    manager = ReservationManager([ADDR], want=2)
    manager.relays[0].reservation = Reservation(RELAY, [ADDR], expire_unix=0, ttl=3600, granted_at=0.0, limit=Limit())
    assert manager.circuit_addrs() == [ADDR.encapsulate("/p2p-circuit")]
    manager.set_want(0)
    assert manager.want == 0 and manager.circuit_addrs() == [] and manager.schedule.satisfied(now=0.0)
    manager.set_want(2)  # private again: the schedule wants its slots back
    assert manager.want == 2 and not manager.schedule.satisfied(now=0.0)
    assert [status.addr for status in manager.schedule.due(now=0.0)] == [ADDR]
