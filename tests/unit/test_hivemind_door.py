"""The hivemind door's pure parts: the pace a request must keep, the budgets a door reserves from
the resource manager (per peer, per source address, in all), and the storage's quotas and
fairness (the largest holder loses first). No trio: time and peers are passed in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.hivemind.door import Door
from volunteer.hivemind.errors import HivemindBusy
from volunteer.hivemind.framing import BodyPace
from volunteer.hivemind.limits import DHTLimits, DoorLimits
from volunteer.hivemind.serializer import DictionaryValue, dumps
from volunteer.hivemind.storage import WHOLE, Storage, footprint
from volunteer.net.identity import KeyPair
from volunteer.net.resources import ResourceLimits, ResourceManager

NOW = 1_000_000.0
ALICE, BOB, CAROL = (KeyPair.from_seed(bytes([n]) * 32).peer_id for n in (1, 2, 3))
HOME, AWAY = "/ip4/127.0.0.1/tcp/4001", "/ip4/127.0.0.2/tcp/4001"


# --- pace --------------------------------------------------------------------------------------


def test_pace_gives_grace_then_asks_the_minimum_rate_with_early_bytes_banked():
    pace = BodyPace(min_rate=1000, grace=2.0, now=10.0)
    assert pace.deadline == 12.0 and not pace.too_slow(11.9) and pace.too_slow(12.0)
    pace.on_data(500)  # half a second's worth
    assert pace.deadline == 12.5
    pace.on_data(10_000)  # a burst banks ten seconds
    assert pace.deadline == 22.5 and not pace.too_slow(20.0)
    with pytest.raises(ValueError):
        BodyPace(min_rate=0, grace=1, now=0)


@given(st.lists(st.integers(0, 10_000), max_size=50))
def test_pace_deadline_only_moves_forward_and_tracks_the_bytes(chunks):
    pace = BodyPace(min_rate=64 * 1024, grace=5.0, now=0.0)
    last = pace.deadline
    for chunk in chunks:
        pace.on_data(chunk)
        assert pace.deadline >= last
        last = pace.deadline
    assert pace.deadline == pytest.approx(5.0 + sum(chunks) / (64 * 1024))


# --- door --------------------------------------------------------------------------------------


def door(per_peer=100, per_address=150, total=200, **resources) -> Door:
    manager = ResourceManager(ResourceLimits(**resources))
    return Door(manager, "hivemind-test", DoorLimits(per_peer, per_address, total, max_request=50))


def test_a_peer_holds_its_share_and_no_more():
    d = door()
    first, second = d.open(ALICE, HOME), d.open(ALICE, HOME)
    first.grow(60, NOW)
    with pytest.raises(HivemindBusy, match="peer_request_bytes"):
        second.grow(50, NOW)
    second.grow(40, NOW)
    assert d.held_by(ALICE) == 100 and d.held == 100
    # the bytes count in the peer's own scope too, beside its yamux windows
    assert d.manager.peer_memory(ALICE) == 100
    assert d.refusals["peer_request_bytes"] == 1
    assert d.manager.refusals() == {"hivemind-test-peer": {"memory": 1}}
    first.release()
    first.release()  # idempotent
    second.release()
    assert d.held == 0 and d.manager.peer_memory(ALICE) == 0 and d.manager.memory == 0
    assert not d._peers and not d._addresses  # no table grows with peers that once called


def test_one_address_holds_its_share_whatever_identities_it_uses():
    d = door()
    d.open(ALICE, HOME).grow(100, NOW)
    with pytest.raises(HivemindBusy, match="address_request_bytes"):
        d.open(BOB, HOME).grow(60, NOW)
    # another address is served from what is left of the total
    carol = d.open(CAROL, AWAY)
    carol.grow(100, NOW)
    with pytest.raises(HivemindBusy, match="total_request_bytes|address_request_bytes"):
        d.open(BOB, HOME).grow(50, NOW)
    assert d.manager.refusals()["hivemind-test-address"] == {"memory": 1}
    carol.release()
    assert d.held == 100 and d.held_by(CAROL) == 0


def test_all_peers_hold_the_total_and_the_node_its_own_budget():
    d = door(per_peer=100, per_address=100, total=150)
    d.open(ALICE, HOME).grow(100, NOW)
    with pytest.raises(HivemindBusy, match="total_request_bytes"):
        d.open(CAROL, AWAY).grow(60, NOW)
    assert d.manager.refusals() == {"hivemind-test": {"memory": 1}}
    # the resource manager's own peer budget binds as well
    small = door(peer_memory=30)
    with pytest.raises(HivemindBusy, match="peer_memory"):
        small.open(ALICE, HOME).grow(40, NOW)
    assert small.manager.refusals() == {"peer": {"memory": 1}}


def test_a_full_door_drops_the_newest_calls_of_the_largest_address_for_a_smaller_one():
    d = door(per_peer=100, per_address=150, total=200)
    dropped = []
    calls = []
    for peer, nbytes in ((ALICE, 100), (BOB, 30), (BOB, 20)):
        call = d.open(peer, HOME)
        call.evict = lambda call=call: dropped.append(call)
        call.grow(nbytes, NOW)
        calls.append(call)
    carol = d.open(CAROL, AWAY)
    with pytest.raises(HivemindBusy) as refused:
        carol.grow(100, NOW)
    assert refused.value.reason == "total_request_bytes"
    # HOME holds 150, more than CAROL's address would with 100: its newest calls go, as few as
    # make room (50 bytes: BOB's two), never ALICE's older one
    assert d.evict_for(carol, 100, now=NOW)
    assert dropped == [calls[2], calls[1]] and all(call.evicted for call in dropped)
    assert d.refusals["evicted"] == 2 and d.manager.refusals()["hivemind-test"] == {"memory": 1, "evicted": 2}
    released = []
    d.listen(lambda: released.append(True))
    for call in dropped:
        call.release()  # what their drivers do as they unwind
    assert released == [True]  # a listener is called once
    carol.grow(100, NOW)
    # the largest address is never made room for, nor one that would become the largest
    alice_again = d.open(ALICE, HOME)
    with pytest.raises(HivemindBusy):
        alice_again.grow(50, NOW)
    assert not d.evict_for(alice_again, 50, now=NOW)


def test_slow_refusals_are_counted_with_the_others():
    d = door()
    d.refuse("slow_body", ALICE, now=NOW)
    assert d.refusals["slow_body"] == 1 and d.manager.refusals() == {"hivemind-test": {"slow_body": 1}}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 80), st.booleans()), max_size=40))
def test_door_accounting_never_exceeds_its_limits_and_returns_to_zero(steps):
    d = door()
    peers = [(ALICE, HOME), (BOB, HOME), (CAROL, AWAY)]
    open_ = []
    for who, nbytes, release in steps:
        if release and open_:
            open_.pop(0).release()
            continue
        reservation = d.open(*peers[who])
        try:
            reservation.grow(nbytes, NOW)
        except HivemindBusy:
            pass
        open_.append(reservation)
        assert d.held <= 200
        assert all(d.held_by(peer) <= 100 for peer, _ in peers)
        assert d.held == sum(r.held for r in open_)
    for reservation in open_:
        reservation.release()
    assert d.held == 0 and d.manager.memory == 0 and not d._peers and not d._addresses


# --- storage -----------------------------------------------------------------------------------


def small(**overrides) -> DHTLimits:
    return DHTLimits(**{"entry_overhead": 100, "max_stored_bytes": 1000, "max_stored_bytes_per_peer": 600, **overrides})


def test_entries_cost_their_value_their_subkey_in_memory_and_overhead():
    storage = Storage(small())
    assert storage.store(1, b"v" * 10, NOW + 10, NOW, holder=ALICE)
    assert storage.held_by(ALICE) == 110
    subkey = ("ab", "cd")
    assert storage.store_subkey(2, subkey, b"v", NOW + 10, NOW, holder=ALICE)
    assert storage.held_by(ALICE) == 110 + 1 + footprint(subkey) + 100
    assert footprint(subkey) > len(dumps(subkey))  # memory, not wire bytes
    # a regular value replacing a dictionary frees its sub-keys
    assert storage.store(2, b"r", NOW + 20, NOW, holder=BOB)
    assert storage.held_by(ALICE) == 110 and storage.held_by(BOB) == 101
    assert storage.stored_bytes == 211 and storage.entries == 2


def test_a_peer_stores_up_to_its_quota():
    storage = Storage(small())
    for key in range(5):
        assert storage.store(key, b"x" * 20, NOW + 10, NOW, holder=ALICE)  # 120 each
    assert not storage.store(9, b"x" * 20, NOW + 10, NOW, holder=ALICE)
    assert storage.refusals["peer_quota"] == 1
    # replacing its own entry frees what it held: still within the quota
    assert storage.store(0, b"y" * 20, NOW + 20, NOW, holder=ALICE)
    # this node's own stores are not held to a peer's quota
    assert storage.store(9, b"x" * 20, NOW + 10, NOW)


def test_a_full_storage_takes_room_from_the_largest_holder_first():
    storage = Storage(small(max_stored_bytes_per_peer=1000))
    for key in range(5):
        assert storage.store(key, b"x" * 20, NOW + 10, NOW, holder=ALICE)  # 600
    for key in range(10, 13):
        assert storage.store(key, b"x" * 20, NOW + 10, NOW, holder=BOB)  # 360: 960 in all
    # CAROL's first entry pushes out ALICE's oldest, not BOB's
    assert storage.store(20, b"x" * 20, NOW + 10, NOW, holder=CAROL)
    assert storage.get(0, NOW) is None and storage.get(10, NOW) is not None and storage.evicted == 1
    assert storage.stored_bytes <= 1000
    # the largest holder cannot push out a smaller one
    assert not storage.store(30, b"x" * 20, NOW + 10, NOW, holder=ALICE)
    assert storage.refusals["storage_full"] == 1
    assert storage.held_by(BOB) == 360 and storage.get(20, NOW) is not None


def test_a_full_key_gives_up_a_subkey_of_its_largest_holder():
    storage = Storage(small(max_subkeys=3, max_stored_bytes=10_000, max_stored_bytes_per_peer=10_000))
    assert storage.store_subkey(1, "a1", b"v", NOW + 10, NOW, holder=ALICE)
    assert storage.store_subkey(1, "a2", b"v", NOW + 20, NOW, holder=ALICE)
    assert storage.store_subkey(1, "b1", b"v", NOW + 30, NOW, holder=BOB)
    # full: ALICE (two) loses its soonest-expiring sub-key to CAROL ...
    assert storage.store_subkey(1, "c1", b"v", NOW + 5, NOW, holder=CAROL)
    assert set(storage.get(1, NOW).value.items) == {"a2", "b1", "c1"}
    # ... but ALICE cannot push out another's for a third of its own
    assert not storage.store_subkey(1, "a3", b"v", NOW + 40, NOW, holder=ALICE)
    assert storage.refusals["key_full"] == 1


def test_oversized_subkeys_and_values_are_refused_and_counted():
    reasons = []
    storage = Storage(small(max_subkey_bytes=8, max_value_bytes=16), on_refusal=reasons.append)
    assert not storage.store_subkey(1, "x" * 20, b"v", NOW + 10, NOW, holder=ALICE)
    assert not storage.fits_subkey(9) and storage.fits_subkey(8)
    assert not storage.store(1, b"v" * 17, NOW + 10, NOW, holder=ALICE)
    assert reasons == ["subkey_size", "subkey_size", "value_size"]


def test_expiry_gives_the_bytes_back():
    storage = Storage(small())
    assert storage.store_subkey(1, "a", b"v", NOW + 5, NOW, holder=ALICE)
    assert storage.store_subkey(1, "b", b"v", NOW + 50, NOW, holder=ALICE)
    assert storage.store(2, b"v", NOW + 5, NOW, holder=BOB)
    assert storage.expire(NOW + 10) == 2
    assert set(storage.get(1, NOW + 10).value.items) == {"b"}
    assert storage.held_by(BOB) == 0 and storage.entries == 1


ops = st.lists(
    st.tuples(
        st.sampled_from(["store", "subkey", "expire"]),
        st.integers(0, 5),  # key
        st.integers(0, 3),  # sub-key
        st.integers(0, 200),  # value bytes
        st.integers(1, 100),  # expires after
        st.sampled_from([None, ALICE, BOB, CAROL]),
    ),
    max_size=60,
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(ops)
def test_storage_accounting_matches_what_it_holds(steps):
    limits = small(max_subkeys=3, max_stored_keys=4)
    storage = Storage(limits)
    now = NOW
    for op, key, sub, size, ttl, holder in steps:
        now += 1
        if op == "expire":
            storage.expire(now)
        elif op == "store":
            storage.store(key, b"v" * size, now + ttl, now, holder=holder)
        else:
            storage.store_subkey(key, f"s{sub}", b"v" * size, now + ttl, now, holder=holder)
        # what is counted is what is held, entry by entry; no holder past its quota
        costs: dict = {}
        for key_id, item in storage._data.items():
            entries = item.value.items.items() if isinstance(item.value, DictionaryValue) else [(None, item)]
            for subkey, entry in entries:
                cost = len(entry.value) + limits.entry_overhead + (footprint(subkey) if subkey is not None else 0)
                held = storage._entries[(key_id, subkey if subkey is not None else WHOLE)]
                assert held.cost == cost
                costs[held.holder] = costs.get(held.holder, 0) + cost
        assert storage.stored_bytes == sum(costs.values()) <= limits.max_stored_bytes
        assert len(storage) <= limits.max_stored_keys
        for holder_, held_bytes in costs.items():
            assert storage.held_by(holder_) == held_bytes
            assert holder_ is None or held_bytes <= limits.max_stored_bytes_per_peer
