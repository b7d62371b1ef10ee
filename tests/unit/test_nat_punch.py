"""The pure DCUtR punch plan: attempts, roles, addresses, when to dial, outcome (no trio, no sockets)."""

from __future__ import annotations

import pytest

from volunteer.net.transport.base import Direction
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.punch import PunchPlan, attempt_roles

ADDRS = (Multiaddr("/ip4/203.0.113.5/tcp/4001"), Multiaddr("/ip4/203.0.113.5/tcp/4002"))


def test_roles_follow_the_spec_then_swap_on_the_last_attempt():
    assert [attempt_roles(n, 3) for n in (1, 2, 3)] == [
        (Direction.OUTBOUND, Direction.INBOUND),
        (Direction.OUTBOUND, Direction.INBOUND),
        (Direction.INBOUND, Direction.OUTBOUND),
    ]
    assert attempt_roles(1, 1) == (Direction.OUTBOUND, Direction.INBOUND)  # one attempt: spec roles


def test_initiator_dials_half_a_round_trip_after_the_connect_reply():
    plan = PunchPlan("peer", started_at=100.0)
    assert plan.connect_sent(now=100.0) == 1
    step = plan.connect_received(ADDRS, now=100.2)
    assert step.attempt == 1 and step.role is Direction.OUTBOUND and step.addrs == ADDRS
    assert step.dial_at == pytest.approx(100.3)
    assert step.expects_inbound_punch
    assert plan.outcome.rtt == pytest.approx(0.2) and not plan.outcome.roles_swapped
    outcome = plan.succeeded(now=100.5)
    assert outcome.success and outcome.attempts == 1 and outcome.seconds == pytest.approx(0.5)
    assert outcome.rtts == pytest.approx(2.5)
    assert not plan.attempts_left


def test_responder_dials_on_sync_and_swaps_roles_on_the_last_attempt():
    plan = PunchPlan("peer", started_at=0.0, initiator=False, max_attempts=2)
    assert plan.peer_connect(ADDRS) == 1
    step = plan.sync_received(now=5.0)
    assert step.role is Direction.INBOUND and step.dial_at == 5.0 and not step.expects_inbound_punch
    assert plan.peer_connect(ADDRS[:1]) == 2
    last = plan.sync_received(now=6.0)
    assert last.role is Direction.OUTBOUND and last.addrs == ADDRS[:1] and plan.outcome.roles_swapped
    assert not plan.attempts_left
    with pytest.raises(ValueError):
        plan.peer_connect(ADDRS)


def test_no_addresses_means_nothing_to_dial_and_all_attempts_can_fail():
    plan = PunchPlan("peer", started_at=0.0, max_attempts=3)
    steps = []
    for attempt in range(3):
        plan.connect_sent(now=attempt)
        steps.append(plan.connect_received((), now=attempt + 0.1))
    assert all(not step.addrs and not step.expects_inbound_punch for step in steps)
    assert plan.outcome.error == "the peer sent no addresses to punch"
    assert steps[-1].role is Direction.INBOUND and plan.outcome.roles_swapped
    with pytest.raises(ValueError):
        plan.connect_sent(now=4)
    outcome = plan.failed("gave up", now=4.0)
    assert not outcome.success and outcome.attempts == 3 and outcome.error == "gave up" and outcome.seconds == 4.0


def test_a_reply_without_a_connect_is_a_bug_and_time_never_runs_backwards():
    plan = PunchPlan("peer", started_at=10.0)
    with pytest.raises(ValueError):
        plan.connect_received(ADDRS, now=10.0)
    plan.connect_sent(now=10.0)
    step = plan.connect_received(ADDRS, now=9.0)  # a clock that stepped back: no negative RTT
    assert plan.outcome.rtt == 0.0 and step.dial_at == 9.0
