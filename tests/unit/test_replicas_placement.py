"""Automatic placement (pure): least-replicated first, capacity-bounded, spread by hash, and the
re-check rule (move only from over- to under-replicated, never drop a sole copy)."""

from __future__ import annotations

from collections import defaultdict

from volunteer.replicas.config import ReplicasConfig
from volunteer.replicas.grid import GridSpec
from volunteer.replicas.placement import (
    capacity,
    catch_up_source,
    expert_memory_bytes,
    place,
    recheck_delay,
    tie_break,
)

GRID = GridSpec("expert", (4, 8), "ffn", 16, replicas=2)
UIDS = list(GRID.uids())


def hosts_of(assignment: dict[str, set[str]], versions: dict | None = None) -> dict[str, dict[str, int]]:
    """uid → {peer: version} from peer → uids."""
    hosts: dict[str, dict[str, int]] = defaultdict(dict)
    for peer, uids in assignment.items():
        for uid in uids:
            hosts[uid][peer] = (versions or {}).get((peer, uid), 0)
    return hosts


def test_first_placement_takes_unhosted_before_under_target_before_full():
    hosts = {uid: {"a": 0, "b": 0} for uid in UIDS[:20]}  # full
    hosts.update({uid: {"a": 0} for uid in UIDS[20:28]})  # one host: below target
    # UIDS[28:] nobody hosts
    result = place([GRID], hosts, me="me", capacity=6)
    assert set(result.add) == set(UIDS[28:]) | set(result.add[4:])
    assert set(result.add[:4]) == set(UIDS[28:])
    assert set(result.add[4:]) <= set(UIDS[20:28])
    assert result.drop == () and set(result.host) == set(result.add)


def test_capacity_bounds_the_choice_and_zero_takes_nothing():
    assert len(place([GRID], {}, me="me", capacity=8).host) == 8
    assert place([GRID], {}, me="me", capacity=0).host == ()
    assert len(place([GRID], {}, me="me", capacity=100).host) == len(UIDS)


def test_four_volunteers_joining_at_once_spread_over_the_grid():
    choices = [set(place([GRID], {}, me=f"peer-{n}", capacity=8).host) for n in range(4)]
    assert all(len(c) == 8 for c in choices)
    assert len(set.union(*choices)) > 16  # the same 8 for everyone would cover 8
    assert len({frozenset(c) for c in choices}) == 4


def test_placement_is_deterministic():
    assert place([GRID], {}, me="x", capacity=5) == place([GRID], {}, me="x", capacity=5)
    assert tie_break("x", "expert.0.0") == tie_break("x", "expert.0.0") != tie_break("y", "expert.0.0")


def test_recheck_moves_nothing_when_nothing_is_under_target():
    assignment = {"me": set(UIDS[:8]), "b": set(UIDS), "c": set(UIDS)}  # UIDS[:8] have 3 hosts, the rest 2
    result = place([GRID], hosts_of(assignment), me="me", capacity=8, hosting=assignment["me"])
    assert result.add == result.drop == ()


def test_recheck_moves_an_over_replicated_expert_to_an_under_replicated_one():
    assignment = {"me": {UIDS[0]}, "b": {UIDS[0]}, "c": {UIDS[0]}, "d": set(UIDS[1:]), "e": set(UIDS[2:])}
    hosts = hosts_of(assignment)
    # UIDS[0] has 3 hosts (target 2); UIDS[1] has 1: whichever of me/b/c ranks first may move
    movers = [p for p in ("me", "b", "c") if place([GRID], hosts, me=p, capacity=len(assignment[p]), hosting=assignment[p]).drop]
    assert len(movers) == 1  # exactly one holder leaves it, so UIDS[0] keeps its 2 replicas
    mover = movers[0]
    result = place([GRID], hosts, me=mover, capacity=len(assignment[mover]), hosting=assignment[mover])
    assert result.drop == (UIDS[0],) and result.add == (UIDS[1],) and result.host == (UIDS[1],)


def test_the_stalest_holder_is_the_one_that_moves():
    assignment = {"me": {UIDS[0]}, "b": {UIDS[0]}, "c": {UIDS[0]}, "d": set(UIDS[1:-1])}
    versions = {("me", UIDS[0]): 5, ("b", UIDS[0]): 90, ("c", UIDS[0]): 100}
    hosts = hosts_of(assignment, versions)
    assert place([GRID], hosts, me="me", capacity=1, hosting={UIDS[0]}).drop == (UIDS[0],)
    assert place([GRID], hosts, me="b", capacity=1, hosting={UIDS[0]}).drop == ()
    assert place([GRID], hosts, me="c", capacity=1, hosting={UIDS[0]}).drop == ()


def test_never_drops_an_expert_it_alone_hosts():
    # every expert I host has only me; lots of experts have nobody: no move is allowed
    mine = set(UIDS[:4])
    hosts = hosts_of({"me": mine})
    result = place([GRID], hosts, me="me", capacity=4, hosting=mine)
    assert result.drop == () and set(result.host) == mine


def test_at_target_experts_are_not_moved_even_when_others_are_under():
    mine = set(UIDS[:4])
    hosts = hosts_of({"me": mine, "b": mine})  # exactly 2 replicas each
    assert place([GRID], hosts, me="me", capacity=4, hosting=mine).drop == ()


def test_spare_capacity_on_recheck_adds_without_dropping():
    mine = {UIDS[0]}
    result = place([GRID], hosts_of({"me": mine}), me="me", capacity=3, hosting=mine)
    assert result.drop == () and len(result.add) == 2 and UIDS[0] in result.host


def test_experts_outside_every_grid_are_kept_and_reported():
    mine = {"legacy.0", UIDS[0]}
    result = place([GRID], hosts_of({"me": mine}), me="me", capacity=2, hosting=mine)
    assert result.outside == ("legacy.0",) and "legacy.0" in result.host and result.drop == ()


def test_moves_per_recheck_are_bounded():
    mine = set(UIDS[:6])
    trained = {(peer, uid): 5 for peer in ("me", "b", "c") for uid in mine}  # updates reached every copy
    hosts = hosts_of({"me": mine, "b": mine, "c": mine}, trained)  # 3 replicas each, the rest unhosted
    for moves in (0, 1, 3):
        # me ranks first (by hash) on some of them; never more than `moves` change
        result = place([GRID], hosts, me="me", capacity=6, hosting=mine, max_moves=moves)
        assert len(result.drop) == len(result.add) <= moves


def test_sequential_rechecks_converge_to_every_expert_at_target():
    # four volunteers of capacity 16 (64 slots for 32 experts x 2 replicas), joining one by one
    peers = [f"peer-{n}" for n in range(4)]
    assignment: dict[str, set[str]] = {}
    for peer in peers:
        assignment[peer] = set(place([GRID], hosts_of(assignment), me=peer, capacity=16).host)
    for _round in range(200):  # bounded: converges well before
        counts = {uid: sum(uid in a for a in assignment.values()) for uid in UIDS}
        if all(count == 2 for count in counts.values()):
            break
        for peer in peers:
            result = place([GRID], hosts_of(assignment), me=peer, capacity=16, hosting=assignment[peer])
            assignment[peer] = set(result.host)
            assert len(assignment[peer]) <= 16
    counts = {uid: sum(uid in a for a in assignment.values()) for uid in UIDS}
    assert all(count == 2 for count in counts.values()), counts


def test_simultaneous_rechecks_never_drop_an_expert_below_target():
    # everyone decides from the same snapshot, then all apply at once
    assignment = {f"p{n}": set(UIDS[:8]) for n in range(5)}  # 5 replicas of the first 8
    snapshot = hosts_of(assignment)
    results = {p: place([GRID], snapshot, me=p, capacity=8, hosting=assignment[p], max_moves=8) for p in assignment}
    after = {p: set(r.host) for p, r in results.items()}
    for uid in UIDS[:8]:
        assert sum(uid in a for a in after.values()) >= GRID.replicas


def test_catch_up_source_is_the_freshest_other_replica():
    hosts = {"e.0": {"me": 50, "a": 10, "b": 30}}
    assert catch_up_source(hosts, "e.0", me="me") == "b"
    assert catch_up_source({"e.0": {"me": 3}}, "e.0", me="me") is None
    assert catch_up_source({}, "e.0", me="me") is None


def test_capacity_rules():
    config = ReplicasConfig(default_capacity=8)
    assert capacity(config=config) == 8
    assert capacity(max_experts=3, gpu_memory_bytes=10**12, bytes_per_expert=1, config=config) == 3
    per_expert = expert_memory_bytes(1_000_000)
    assert per_expert == 16_000_000
    assert capacity(gpu_memory_bytes=10 * per_expert + 5, bytes_per_expert=per_expert) == 10


def test_a_full_volunteer_makes_room_by_giving_up_its_most_replicated_expert():
    from volunteer.replicas.placement import make_room_for

    hosts = {"e.0": {"me": 5, "a": 5, "b": 5}, "e.1": {"me": 7, "a": 7}, "e.2": {"me": 9}, "e.3": {"me": 1, "a": 1}}
    assert make_room_for("x.0", hosts, me="me", hosting=["e.0", "e.1", "e.2"]) == "e.0"  # two others hold it
    # equally held: the stalest copy here goes
    assert make_room_for("x.0", hosts, me="me", hosting=["e.1", "e.3"]) == "e.3"
    # sole copies are never given up for another sole copy
    assert make_room_for("x.0", hosts, me="me", hosting=["e.2"]) is None
    assert make_room_for("e.0", hosts, me="me", hosting=["e.0"]) is None


def test_only_proven_hosts_make_a_hosted_copy_droppable():
    grid = GridSpec("rep", (2,), "ffn", 8, replicas=2)
    # three fresher squatters declare rep.0, which "me" holds; rep.1 has no host
    hosts = {"rep.0": {"me": 2, "s1": 10, "s2": 10, "s3": 10}}
    fooled = place([grid], hosts, me="me", capacity=1, hosting=["rep.0"])
    assert fooled.drop == ("rep.0",)  # on their word alone, our copy looks spare
    kept = place([grid], hosts, me="me", capacity=1, hosting=["rep.0"], proven={"rep.0": {"me": 2}})
    assert kept.drop == () and kept.host == ("rep.0",)
    # two replicas we caught up from or synced with do make it spare: the move goes ahead
    proven = {"rep.0": {"me": 2, "s1": 10, "s2": 10}}
    moved = place([grid], hosts, me="me", capacity=1, hosting=["rep.0"], proven=proven)
    assert moved.drop == ("rep.0",) and moved.add == ("rep.1",)


def test_untrained_duplicates_all_move_to_unhosted_experts_in_one_recheck():
    # two donors started together picked from the same empty view: about a quarter of their picks
    # overlap and as many experts have no host. No update reached any copy (version 0) and the
    # other donor proved its copies (a first sync round merged them): moving a duplicate to an
    # unhosted expert loses no training and downloads nothing, so max_moves does not hold it back
    grid = GridSpec("g", (16,), "ffn", 16, replicas=1)
    donors = ["donor-a", "donor-b"]
    assignment = {d: set(place([grid], {}, me=d, capacity=8).host) for d in donors}
    duplicates = assignment["donor-a"] & assignment["donor-b"]
    assert len(duplicates) >= 2
    for first, second in (donors, donors[::-1]):  # one re-checks, then the other, seeing the first's moves
        view = hosts_of(assignment)
        result = place([grid], view, me=first, capacity=8, hosting=assignment[first], proven=view, max_moves=1)
        assignment[first] = set(result.host)
    assert assignment["donor-a"] | assignment["donor-b"] == set(grid.uids())
    assert not assignment["donor-a"] & assignment["donor-b"]


def test_a_trained_duplicate_still_moves_at_most_max_moves_per_recheck():
    grid = GridSpec("g", (16,), "ffn", 16, replicas=1)
    mine = {f"g.{n}" for n in range(4)}
    trained = {(p, uid): 3 for p in ("me", "b") for uid in mine}
    view = hosts_of({"me": mine, "b": mine}, trained)
    result = place([grid], view, me="me", capacity=4, hosting=mine, proven=view, max_moves=1)
    assert len(result.drop) <= 1
    # nor does an untrained copy move for free to an expert someone hosts (it would download it)
    pairs = GridSpec("p", (16,), "ffn", 16, replicas=2)
    mine = {f"p.{n}" for n in range(4)}
    view = hosts_of({"me": mine, "b": mine, "c": mine, "d": {f"p.{n}" for n in range(4, 16)}})
    result = place([pairs], view, me="me", capacity=4, hosting=mine, proven=view, max_moves=1)
    assert len(result.drop) == 1 and result.add[0] not in mine


def test_recheck_delays_are_spread_per_volunteer_within_the_jitter():
    delays = {peer: recheck_delay(peer, 1, 120.0, 0.25) for peer in (f"peer-{n}" for n in range(50))}
    assert all(90.0 <= d <= 150.0 for d in delays.values())
    assert len({round(d, 3) for d in delays.values()}) == len(delays)  # not in step
    assert recheck_delay("peer-1", 1, 120.0, 0.25) == delays["peer-1"]  # stable per (peer, count)
    assert recheck_delay("peer-1", 2, 120.0, 0.25) != delays["peer-1"]
