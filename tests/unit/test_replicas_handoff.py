"""The hand-off plan (pure): only experts no other live replica holds are pushed, to receivers
with spare capacity, capacity-bounded, most trained first, with fallbacks."""

from __future__ import annotations

from volunteer.replicas.handoff import plan_handoff
from volunteer.replicas.placement import claim_is_suspect, suspect_claims
from volunteer.replicas.transfer import PushClaim, handed_off_version


def test_experts_with_other_replicas_need_no_push():
    plan = plan_handoff({"e.0": 5, "e.1": 3}, {"e.0": {"me": 5, "b": 4}, "e.1": {"me": 3}}, {"c": 4}, me="me")
    assert plan.covered == ("e.0",)
    assert [p.uid for p in plan.pushes] == ["e.1"] and plan.pushes[0].candidates == ("c",)
    assert plan.pushes[0].version == 3


def test_capacity_bounds_what_each_receiver_is_given_first():
    mine = {f"e.{n}": n for n in range(5)}
    plan = plan_handoff(mine, {}, {"b": 2, "c": 1}, me="me")
    firsts = [p.candidates[0] for p in plan.pushes]
    assert firsts.count("b") == 2 and firsts.count("c") == 1
    assert len(plan.stranded) == 2
    # the most trained experts got the room
    assert {p.uid for p in plan.pushes} == {"e.4", "e.3", "e.2"} and set(plan.stranded) == {"e.0", "e.1"}


def test_fallback_candidates_are_listed_after_the_first_and_bounded():
    plan = plan_handoff({"e.0": 1}, {}, {"a": 5, "b": 3, "c": 1, "d": 1}, me="me", max_candidates=3)
    assert plan.pushes[0].candidates[:2] == ("a", "b") and len(plan.pushes[0].candidates) == 3


def test_no_receivers_strands_everything_and_never_picks_itself_or_full_peers():
    plan = plan_handoff({"e.0": 1, "e.1": 2}, {}, {"me": 9, "full": 0}, me="me")
    assert plan.pushes == () and set(plan.stranded) == {"e.0", "e.1"}


def test_equally_free_receivers_are_spread_by_hash():
    mine = {f"e.{n}": 0 for n in range(40)}
    plan = plan_handoff(mine, {}, {f"p{n}": 100 for n in range(4)}, me="me")
    firsts = [p.candidates[0] for p in plan.pushes]
    assert set(firsts) == {"p0", "p1", "p2", "p3"}  # most-spare-first balances them
    assert max(firsts.count(p) for p in set(firsts)) - min(firsts.count(p) for p in set(firsts)) <= 1


def test_a_claim_far_above_the_others_is_suspect_and_a_near_one_is_not():
    assert claim_is_suspect(10**9, [40, 42], factor=2.0, margin=1000)
    assert not claim_is_suspect(1080, [40, 42, 10**9], factor=2.0, margin=1000)  # lower median: 42
    assert not claim_is_suspect(10**9, [], factor=2.0, margin=1000)  # nothing to compare
    assert suspect_claims({"a": 40, "b": 42, "liar": 10**9}, factor=2.0, margin=1000) == {"liar"}


def test_a_handed_off_state_is_hosted_at_its_declared_version_when_the_header_claims_far_more():
    claim = PushClaim(declared=True, sole=True, version=7)
    assert handed_off_version(10**9, claim, factor=2.0, margin=1000) == 7  # the signed record wins
    # a declaration lags training by a heartbeat: a little above it is the pusher's fresh version
    assert handed_off_version(12, claim, factor=2.0, margin=1000) == 12
    # only a tombstone was seen: nothing declared, so a huge header counts from 0
    tombstoned = PushClaim(declared=True, sole=True)
    assert handed_off_version(10**9, tombstoned, factor=2.0, margin=1000) == 0
    assert handed_off_version(4, tombstoned, factor=2.0, margin=1000) == 4
    assert handed_off_version(10**9, None, factor=2.0, margin=1000) == 10**9  # no DHT to ask
