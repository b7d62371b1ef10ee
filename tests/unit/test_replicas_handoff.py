"""The hand-off plan (pure): only experts no other live replica holds are pushed, to receivers
with spare capacity, capacity-bounded, most trained first, with fallbacks."""

from __future__ import annotations

from volunteer.replicas.handoff import plan_handoff


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
