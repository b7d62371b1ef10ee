"""Lookup caches and the store fan-out plan (pure, fake ``now``)."""

from __future__ import annotations

import os

from volunteer.dht.caches import ClosestPeers, RecentValues, StorePlan, chunks
from volunteer.dht.records import owned_subkey, sign
from volunteer.dht.routing import Contact
from volunteer.net.identity import KeyPair, PeerID

NOW = 3000.0
KP = KeyPair.generate()


def contact() -> Contact:
    return Contact(PeerID(b"\x12\x20" + os.urandom(32)), (b"/a",))


def record(key: bytes, exp: float = NOW + 15):
    return sign(KP, key, owned_subkey(KP.peer_id), b"v", exp)


def test_recent_values_serve_fresh_results_without_expired_records() -> None:
    cache = RecentValues(max_keys=2)
    short, long = record(b"k", NOW + 2), record(b"k", NOW + 60)
    cache.put(b"k", {b"s": short, b"l": long}, NOW)
    assert cache.get(b"k", NOW + 1, max_age=5) == {b"s": short, b"l": long}
    assert cache.get(b"k", NOW + 3, max_age=5) == {b"l": long}  # never returns an expired record
    assert cache.get(b"k", NOW + 6, max_age=5) is None  # too old: ask the network
    assert cache.get(b"other", NOW, max_age=5) is None
    cache.forget(b"k")
    assert cache.get(b"k", NOW, max_age=5) is None


def test_recent_values_forget_the_oldest_lookup_first() -> None:
    cache = RecentValues(max_keys=2)
    cache.put(b"a", {}, NOW)
    cache.put(b"b", {}, NOW)
    cache.put(b"a", {}, NOW + 1)  # looked up again: now the newest
    cache.put(b"c", {}, NOW + 2)
    assert len(cache) == 2 and cache.get(b"b", NOW + 2, 10) is None and cache.get(b"a", NOW + 2, 10) == {}


def test_closest_peers_expire_and_stay_bounded() -> None:
    cache = ClosestPeers(max_age=30.0, max_keys=2)
    peers = [contact() for _ in range(3)]
    cache.put(b"k", peers, NOW)
    assert cache.get(b"k", NOW + 29.9) == peers
    assert cache.get(b"k", NOW + 30.0) is None
    cache.put(b"x", peers[:1], NOW)
    cache.put(b"y", peers[:2], NOW)
    assert len(cache) == 2 and cache.get(b"k", NOW) is None
    cache.forget(b"x")
    assert cache.get(b"x", NOW) is None and cache.get(b"y", NOW) == peers[:2]


def test_store_plan_sends_each_record_once_per_peer_batched() -> None:
    records = [record(b"a"), record(b"b"), record(b"a", NOW + 20)]
    plan = StorePlan(records)
    assert plan.keys == [b"a", b"b"]
    p, q, r = contact(), contact(), contact()
    # the closest known now: p for both keys, q for b
    first = plan.deliver({b"a": [p], b"b": [p, q]})
    assert sorted((c.peer, tuple(i)) for c, i in first) == sorted([(p.peer, (0, 1, 2)), (q.peer, (1,))])
    # the lookup then finds r closer for a; p and q were sent already
    second = plan.deliver({b"a": [r, p], b"b": [q]})
    assert [(c.peer, i) for c, i in second] == [(r.peer, [0, 2])]
    assert plan.deliver({b"a": [p, r], b"b": [p, q]}) == []
    plan.on_accepted([0, 1, 2])
    plan.on_accepted(i for i in [0, 2])
    assert plan.accepted == [2, 1, 2]


def test_chunks_split_at_the_request_bound() -> None:
    assert chunks(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    assert chunks([], 3) == []
