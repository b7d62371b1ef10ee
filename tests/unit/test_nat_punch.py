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


def test_a_ping_beside_the_connect_times_the_dial_when_the_reply_was_held_back():
    """A held its CONNECT 2 s (waiting for its addresses); the muxer ping measured 20 ms."""
    plan = PunchPlan("peer", started_at=100.0)
    plan.connect_sent(now=100.0)
    step = plan.connect_received(ADDRS, now=102.0, pinged=0.02)
    assert plan.outcome.rtt == pytest.approx(0.02)
    assert step.dial_at == pytest.approx(102.01)
    plan = PunchPlan("peer", started_at=100.0)
    plan.connect_sent(now=100.0)
    plan.connect_received(ADDRS, now=100.02, pinged=0.5)  # a ping slower than the reply changes nothing
    assert plan.outcome.rtt == pytest.approx(0.02)


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


def test_a_failed_attempt_is_bounded_by_the_round_trip():
    from volunteer.net import limits
    from volunteer.net.nat.punch import punch_budget

    assert punch_budget(None) == limits.DCUTR_MAX_PUNCH
    assert punch_budget(0.001) == limits.DCUTR_MIN_PUNCH  # a lost SYN still gets its retransmission
    assert punch_budget(0.4) == pytest.approx(limits.DCUTR_PUNCH_RTTS * 0.4)
    assert punch_budget(3.0) == limits.DCUTR_MAX_PUNCH
    # three failed attempts fit in one stream timeout of the other side's wait for CONNECT
    assert limits.DCUTR_MAX_PUNCH + 3.0 < limits.DCUTR_STREAM_TIMEOUT
    plan = PunchPlan("peer", started_at=0.0)
    plan.connect_sent(now=0.0)
    assert plan.connect_received(ADDRS, now=0.3).budget == pytest.approx(punch_budget(0.3))


def test_the_responder_measures_the_round_trip_from_its_connect_to_the_sync():
    from volunteer.net.nat.punch import punch_budget

    plan = PunchPlan("peer", started_at=0.0, initiator=False)
    plan.peer_connect(ADDRS, now=10.0)
    step = plan.sync_received(now=10.5)
    assert plan.outcome.rtt == pytest.approx(0.5) and step.budget == pytest.approx(punch_budget(0.5))


def test_udp_punch_gaps_grow_with_jitter_within_bounds():
    from volunteer.net import limits
    from volunteer.net.nat.punch import punch_gaps

    gaps = punch_gaps(0.42)
    assert gaps[0] == limits.QUIC_HOLE_PUNCH_FIRST_GAP
    assert all(b >= a for a, b in zip(gaps, gaps[1:]))
    assert max(gaps) <= limits.QUIC_HOLE_PUNCH_MAX_GAP
    assert sum(gaps) <= limits.QUIC_HOLE_PUNCH_TIMEOUT
    assert punch_gaps(0.42) == gaps and punch_gaps(0.9) != gaps  # the seed is the jitter
    assert sum(punch_gaps(0.1, budget=0.5)) <= 0.5


def test_network_changes_punch_again_but_not_too_often():
    from volunteer.net import limits
    from volunteer.net.nat.punch import should_repunch

    assert should_repunch(None, 0.0, punching=False, has_direct=False)
    assert not should_repunch(None, 0.0, punching=True, has_direct=False)
    assert not should_repunch(None, 0.0, punching=False, has_direct=True)
    assert not should_repunch(100.0, 100.0 + limits.DCUTR_REPUNCH_INTERVAL - 1, punching=False, has_direct=False)
    assert should_repunch(100.0, 100.0 + limits.DCUTR_REPUNCH_INTERVAL, punching=False, has_direct=False)


def test_attempts_are_counted_by_transport_and_result():
    from volunteer.net.nat.punch import DIRECT, FAILED, REVERSED

    plan = PunchPlan("peer", started_at=0.0)
    plan.attempt_ended(["quic", "tcp"], None, FAILED)
    plan.attempt_ended(["quic", "tcp"], "tcp", REVERSED)
    plan.attempt_ended(["quic"], "quic", DIRECT)
    assert plan.tally == {"quic": {"failed": 1, "direct": 1}, "tcp": {"failed": 1, "reversed": 1}}
    outcome = plan.succeeded(now=1.0, transport="quic", result=DIRECT)
    assert outcome.transport == "quic" and outcome.result == DIRECT

