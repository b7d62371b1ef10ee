"""The pure reservation schedule: which relays to (re)reserve, refresh at 3/4 TTL, back-off, wake-ups."""

from __future__ import annotations

from volunteer.net import limits
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.circuit import Limit
from volunteer.net.nat.schedule import Reservation, ReservationSchedule

RELAYS = [KeyPair.generate().peer_id for _ in range(3)]
ADDRS = [Multiaddr(f"/ip4/198.51.100.{i}/tcp/4001/p2p/{peer}") for i, peer in enumerate(RELAYS)]


def granted(index: int, at: float, ttl: float = 3600.0) -> Reservation:
    return Reservation(RELAYS[index], [ADDRS[index]], expire_unix=0, ttl=ttl, granted_at=at, limit=Limit())


def test_refresh_at_three_quarters_of_the_lifetime_or_earlier_for_skew():
    assert granted(0, at=100.0, ttl=3600).refresh_at() == 100.0 + 2700
    # A short TTL: skew allowance would put the refresh before 3/4 ... but never below the minimum.
    assert granted(0, at=0.0, ttl=60).refresh_at() == 60 - limits.CLOCK_SKEW_ALLOWANCE
    assert granted(0, at=0.0, ttl=1).refresh_at() == limits.MIN_RESERVATION_REFRESH


def test_reserve_until_want_is_met_then_sleep_until_the_first_refresh():
    schedule = ReservationSchedule(ADDRS, want=2)
    assert [s.addr for s in schedule.due(0.0)] == ADDRS and not schedule.satisfied(0.0)
    due = schedule.due(0.0)
    schedule.on_reserved(due[0], granted(0, at=0.0, ttl=120), rtt=0.01)
    schedule.on_reserved(due[1], granted(1, at=0.0, ttl=3600), rtt=None)
    assert schedule.satisfied(0.0) and schedule.held(0.0) == 2
    assert schedule.next_wakeup(0.0) == 90.0  # the 120 s reservation, at 3/4
    assert schedule.circuit_addrs() == [ADDRS[0].encapsulate("/p2p-circuit"), ADDRS[1].encapsulate("/p2p-circuit")]
    # At 90 s the first one is due for a refresh and comes first.
    assert not schedule.satisfied(90.0)
    assert schedule.due(90.0)[0].reservation.relay == RELAYS[0]


def test_failures_back_off_exponentially_up_to_the_cap():
    schedule = ReservationSchedule(ADDRS[:1], want=1, max_backoff=10.0)
    status = schedule.relays[0]
    waits = []
    now = 0.0
    for _ in range(6):
        assert schedule.due(now) == [status]
        schedule.on_failed(status, "refused", now)
        waits.append(status.retry_at - now)
        assert schedule.due(now) == [] and schedule.next_wakeup(now) == status.retry_at
        now = status.retry_at
    assert waits == [2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert status.last_error == "refused" and status.failures == 6
    schedule.on_reserved(status, granted(0, at=now), rtt=None)
    assert status.failures == 0 and status.last_error == ""


def test_a_lost_relay_is_reserved_again_and_spares_do_not_spin():
    schedule = ReservationSchedule(ADDRS, want=1)
    first, second, third = schedule.relays
    schedule.on_reserved(first, granted(0, at=0.0), rtt=None)
    schedule.on_failed(third, "unreachable", now=0.0)
    # Satisfied: the failing spare's past retry time must not wake us again and again.
    assert schedule.next_wakeup(100.0) == 2700.0
    assert schedule.on_relay_lost(RELAYS[0]) and not schedule.on_relay_lost(RELAYS[1])
    assert not schedule.reservations and not schedule.satisfied(100.0)
    assert [s.addr for s in schedule.due(100.0)] == ADDRS  # the lost relay, the untried one, the retried one
    assert schedule.next_wakeup(100.0) == 100.0  # the spare's retry is past: look now


def test_nothing_to_do_sleeps_max_backoff():
    schedule = ReservationSchedule([], want=2, max_backoff=60.0)
    assert schedule.due(5.0) == [] and schedule.next_wakeup(5.0) == 65.0
