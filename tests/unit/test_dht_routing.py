"""Routing table core: buckets, ping-before-evict, replacement cache, back-off (pure, no trio)."""

from __future__ import annotations

import os
import random

import pytest

from volunteer.dht.config import DHTConfig
from volunteer.dht.routing import RTT_WEIGHT, Contact, RoutingTable, key_id, node_id
from volunteer.net.identity import KeyPair, PeerID


def fake_peer(rng: random.Random | None = None) -> PeerID:
    """A valid sha2-256 PeerID with no key behind it: cheap, and fine for routing."""
    return PeerID(b"\x12\x20" + (rng.randbytes(32) if rng else os.urandom(32)))


def peers_in_bucket(table: RoutingTable, index: int, count: int) -> list[PeerID]:
    out = []
    while len(out) < count:
        peer = fake_peer()
        if table.bucket_index(node_id(peer)) == index:
            out.append(peer)
    return out


@pytest.fixture
def table() -> RoutingTable:
    return RoutingTable(fake_peer(), DHTConfig(k=4, replacement_cache_size=3, max_failures=3))


def test_node_id_is_sha256_of_peer_bytes() -> None:
    peer = KeyPair.generate().peer_id
    assert node_id(peer) == key_id(peer.to_bytes())
    assert 0 <= node_id(peer) < 2**256


def test_insert_and_closest_match_brute_force() -> None:
    table = RoutingTable(fake_peer(), DHTConfig())
    peers = [fake_peer() for _ in range(300)]
    for i, peer in enumerate(peers):
        table.update(Contact(peer, (b"/addr",)), float(i))
    inserted = list(table.entries())
    assert len(inserted) == len(table) <= 300
    target = random.getrandbits(256)
    want = sorted((e.contact for e in inserted), key=lambda c: c.id ^ target)[:20]
    assert table.closest(target, 20, now=1000.0) == want
    # buckets far from us fill first; every entry sits in its own bucket
    for entry in inserted:
        assert table.bucket_for(entry.contact.peer) is not None


def test_self_and_client_mode_never_inserted(table: RoutingTable) -> None:
    assert table.update(Contact(table.local), 0.0) is None
    assert table.local not in table
    peer = fake_peer()
    assert table.update(Contact(peer), 0.0, client_mode=True) is None
    assert peer not in table
    table.update(Contact(peer), 1.0)
    assert peer in table
    table.update(Contact(peer), 2.0, client_mode=True)  # it lost reachability: drop it
    assert peer not in table


def test_update_refreshes_position_and_addrs(table: RoutingTable) -> None:
    a, b = peers_in_bucket(table, 255, 2)
    table.update(Contact(a, (b"old",)), 0.0)
    table.update(Contact(b), 1.0)
    table.update(Contact(a), 2.0)  # no addrs: keep the known ones
    bucket = table.bucket_for(a)
    assert [e.contact.peer for e in bucket.entries] == [b, a]
    assert table.get(a).contact.addrs == (b"old",)
    table.update(Contact(a, (b"new",)), 3.0)
    assert table.get(a).contact.addrs == (b"new",)


def test_full_bucket_pings_least_recently_seen(table: RoutingTable) -> None:
    first, *rest = peers_in_bucket(table, 255, 7)
    members = [first, *rest[:3]]
    for i, peer in enumerate(members):
        assert table.update(Contact(peer), float(i)) is None
    newcomer, other, third = rest[3:6]
    assert table.update(Contact(newcomer), 10.0) == first  # ping the oldest before evicting it
    assert newcomer not in table
    assert table.update(Contact(other), 11.0) is None  # one check at a time; it waits as a replacement
    bucket = table.bucket_for(first)
    assert list(bucket.replacements) == [newcomer, other]

    # the old contact answers: it stays (now most recent), newcomers keep waiting
    table.on_ping_result(first, True, 12.0)
    assert first in table and bucket.entries[-1].contact.peer == first
    assert bucket.pending is None
    # the next newcomer triggers a check of the new least-recently-seen entry
    assert table.update(Contact(third), 13.0) == members[1]
    table.on_ping_result(members[1], False, 14.0)
    assert members[1] not in table
    assert third in table  # most recently heard replacement promoted
    assert list(bucket.replacements) == [newcomer, other]
    # the table's index of entries follows the bucket: the promoted one in, the evicted one out
    assert table.get(members[1]) is None
    assert all(table.get(entry.contact.peer) is entry for entry in bucket.entries)


def test_replacement_cache_is_bounded(table: RoutingTable) -> None:
    peers = peers_in_bucket(table, 255, 4 + 10)
    for i, peer in enumerate(peers):
        table.update(Contact(peer), float(i))
    bucket = table.bucket_for(peers[0])
    assert len(bucket.entries) == 4
    assert list(bucket.replacements) == peers[-3:]


def test_overdue_ping_check_settles_on_expire(table: RoutingTable) -> None:
    members = peers_in_bucket(table, 255, 6)
    for i, peer in enumerate(members[:4]):
        table.update(Contact(peer), float(i))
    lru = table.update(Contact(members[4]), 10.0)
    assert lru == members[0]
    table.update(Contact(members[0]), 11.0)  # it spoke to us meanwhile: proof of life
    assert table.expire(10.0 + table.config.ping_timeout) == []
    assert members[0] in table
    lru = table.update(Contact(members[5]), 20.0)
    assert lru == members[1]
    assert table.expire(20.0) == []  # not yet due
    assert table.expire(20.0 + table.config.ping_timeout) == [members[1]]  # the driver never answered
    assert members[1] not in table and members[5] in table


def test_failure_backoff_and_eviction(table: RoutingTable) -> None:
    peers = peers_in_bucket(table, 255, 5)
    for i, peer in enumerate(peers[:4]):
        table.update(Contact(peer), float(i))
    table.update(Contact(peers[4]), 5.0)  # waits as replacement (and asks for a ping of peers[0])
    table.on_ping_result(peers[0], True, 5.5)
    target = node_id(peers[1])
    assert table.closest(target, 1, 6.0)[0].peer == peers[1]

    table.record_failure(peers[1], 6.0)
    entry = table.get(peers[1])
    assert entry.failures == 1 and entry.backed_off(6.5)
    # a backed-off peer is not the first choice, though still the nearest
    assert table.closest(target, 4, 6.5)[-1].peer == peers[1]
    assert not entry.backed_off(6.0 + table.config.failure_backoff)
    table.record_failure(peers[1], 8.0)
    assert entry.backoff_until == 8.0 + 2 * table.config.failure_backoff  # doubles
    table.update(Contact(peers[1]), 9.0)  # it answered: forgiven
    assert entry.failures == 0 and not entry.backed_off(9.0)

    for t in range(table.config.max_failures):
        table.record_failure(peers[2], 10.0 + t)
    assert peers[2] not in table
    assert peers[4] in table  # replacement promoted


def test_to_check_names_silent_and_failed_contacts(table: RoutingTable) -> None:
    a, b, c = peers_in_bucket(table, 255, 3)
    table.update(Contact(a), 0.0)
    table.update(Contact(b), 100.0)
    table.update(Contact(c), 100.0)
    table.record_failure(c, 100.0)
    assert table.to_check(100.5, max_age=60.0) == [a]  # c is still backing off
    assert sorted(table.to_check(101.0, max_age=60.0)) == sorted([a, c])
    assert table.to_check(101.0) == [c]  # default age: liveness_check_age (120 s)


def test_backoff_is_capped() -> None:
    table = RoutingTable(fake_peer(), DHTConfig(max_failures=100, max_failure_backoff=60.0))
    peer = fake_peer()
    table.update(Contact(peer), 0.0)
    for _ in range(50):
        table.record_failure(peer, 100.0)
    assert table.get(peer).backoff_until == 160.0


def test_failure_of_suspected_contact_evicts_at_once(table: RoutingTable) -> None:
    peers = peers_in_bucket(table, 255, 5)
    for i, peer in enumerate(peers[:4]):
        table.update(Contact(peer), float(i))
    assert table.update(Contact(peers[4]), 5.0) == peers[0]
    table.record_failure(peers[0], 6.0)  # e.g. the ping itself failed and the driver reported it so
    assert peers[0] not in table and peers[4] in table


def test_remove_and_unknown_peers(table: RoutingTable) -> None:
    peer = fake_peer()
    table.record_failure(peer, 0.0)  # unknown: nothing happens
    table.on_ping_result(peer, False, 0.0)
    table.update(Contact(peer), 0.0)
    table.remove(peer)
    assert peer not in table and len(table) == 0


def test_refresh_targets_fall_in_their_buckets(table: RoutingTable) -> None:
    for peer in peers_in_bucket(table, 255, 2) + peers_in_bucket(table, 254, 1):
        table.update(Contact(peer), 0.0)
    targets = table.refresh_targets(100.0, 60.0, random.Random(1))
    assert sorted(table.bucket_index(t) for t in targets) == [254, 255]
    assert table.refresh_targets(101.0, 60.0) == []  # refreshed just now


def test_closest_walks_buckets_in_distance_order_and_agrees_with_a_full_sort() -> None:
    """``closest`` reads only the buckets it needs (XOR geometry); its answer is exactly a full
    sort's: responsive contacts by distance, failed ones after, exclusions left out."""
    import random as _random

    from volunteer.dht.routing import Contact, RoutingTable
    from volunteer.dht.config import DHTConfig
    from volunteer.net.identity import KeyPair

    rng = _random.Random(3)
    peers = [KeyPair.generate().peer_id for _ in range(150)]
    for k in (2, 20):
        table = RoutingTable(peers[0], DHTConfig(k=k))
        for p in peers[1:]:
            table.update(Contact(p, (b"/x",)), 1.0)
        for entry in list(table.entries()):
            if rng.random() < 0.3:
                entry.failures = 1
        for _ in range(40):
            target = rng.getrandbits(256) if rng.random() < 0.6 else table.local_id ^ rng.getrandbits(rng.randrange(1, 256))
            count = rng.choice([1, 5, 20, 30, 500])
            exclude = set(rng.sample(peers, 10))
            responsive_only = rng.random() < 0.5
            entries = [e for e in table.entries() if e.contact.peer not in exclude and not (responsive_only and e.failures)]
            want = [e.contact for e in sorted(entries, key=lambda e: (e.failures > 0, e.contact.id ^ target))][:count]
            assert table.closest(target, count, 2.0, exclude=exclude, responsive_only=responsive_only) == want


def test_a_trainers_buckets_hold_many_more_than_k_and_a_servers_hold_k() -> None:
    from volunteer.dht.config import TRAINER_BUCKET_SIZE

    server = RoutingTable(fake_peer(), DHTConfig())
    trainer = RoutingTable(fake_peer(), DHTConfig.for_trainer("default"))
    assert trainer.config.bucket_capacity == TRAINER_BUCKET_SIZE > server.config.bucket_capacity == 20
    for table in (server, trainer):
        for i, peer in enumerate(peers_in_bucket(table, 255, 100)):  # the far half of the key space
            table.update(Contact(peer, (b"/addr",)), float(i))
    assert len(server) == 20 and len(trainer) == 100  # a lookup's first round can reach the holders


def test_a_trainers_swarm_asks_for_wide_buckets() -> None:
    from volunteer.swarm import Swarm
    from volunteer.swarmfile import SwarmSpec

    spec = SwarmSpec("t", "t")
    assert Swarm(spec).dht_config.bucket_capacity > DHTConfig().k


def test_replies_give_contacts_that_never_answered_us_a_bounded_share() -> None:
    """A peer that only sent us a request (a trainer that looked something up and crashed) is
    handed to others in at most ``unproven_reply_contacts`` places while contacts that answered
    one of ours are at hand; our own lookups still see it, and so do replies once proven peers
    run short."""
    rng = random.Random(7)
    # Seeded peers: 30 random ones put more than k=20 in one bucket about one run in fifty, and a
    # peer left in the replacement cache would be missing from every answer below.
    me = fake_peer(rng)
    config = DHTConfig(k=20, unproven_reply_contacts=3)
    table = RoutingTable(me, config)
    proven = [fake_peer(rng) for _ in range(15)]
    callers = [fake_peer(rng) for _ in range(15)]
    for peer in proven:
        table.update(Contact(peer, (b"/x",)), 1.0, answered=True)
    for peer in callers:
        table.update(Contact(peer, (b"/x",)), 1.0)  # it asked us something
    assert len(table) == 30
    target = rng.getrandbits(256)
    reply = table.closest(target, 10, 2.0, responsive_only=True)
    assert len(reply) == 10 and sum(c.peer in set(callers) for c in reply) <= 3
    assert {c.peer for c in reply} >= {c.peer for c in sorted((Contact(p) for p in proven), key=lambda c: c.id ^ target)[:7]}
    ours = table.closest(target, 30, 2.0)
    assert {c.peer for c in ours} == set(proven) | set(callers)  # our own lookups see everyone
    wide = table.closest(target, 25, 2.0, responsive_only=True)
    assert len(wide) == 25  # 15 proven, and the callers fill what is left
    table.record_success(callers[0], 3.0)  # it answered a request of ours since: proven
    assert table.get(callers[0]) is not None and table.get(callers[0]).answered


def test_join_targets_fall_in_the_farthest_buckets_one_each() -> None:
    """A joiner looks up random IDs in the farthest buckets after itself (DHTConfig.join_lookups):
    half the key space, a quarter, an eighth, so its table hears peers all over the space."""
    rng = random.Random(3)
    table = RoutingTable(PeerID(b"\x12\x20" + rng.randbytes(32)))
    targets = table.join_targets(3, random.Random(4))
    assert [table.bucket_index(t) for t in targets] == [255, 254, 253]
    assert len(set(targets)) == 3 and table.join_targets(0) == []


def test_a_peer_that_timed_out_is_suspect_until_heard_from_or_forgotten(table: RoutingTable) -> None:
    """``suspect``: our own request to the peer ran past a lookup's slot timeout or failed, and it
    has not spoken since; lookups route around it (query.Lookup). Entries and strangers alike (a
    dead contact from someone's reply is in no table of ours)."""
    member, stranger = fake_peer(), fake_peer()
    table.update(Contact(member), 0.0, answered=True)
    assert not table.suspect(member, 1.0)
    table.mark_silent(member, 1.0)
    table.record_failure(stranger, 1.0)  # not in the table: remembered all the same
    assert table.suspect(member, 2.0) and table.suspect(stranger, 2.0)
    assert member in table.to_check(2.0)  # pinged: an answer redeems it, a failure backs it off
    table.update(Contact(member), 3.0, answered=True)
    assert not table.suspect(member, 3.0)
    memory = table.config.silent_memory
    assert table.suspect(stranger, 1.0 + memory - 0.1) and not table.suspect(stranger, 1.0 + memory)
    table.record_failure(stranger, 4.0)
    table.on_ping_result(stranger, True, 5.0)  # a maintenance ping it answered, table member or not
    assert not table.suspect(stranger, 5.0) and stranger not in table
    table.mark_silent(table.local, 0.0)
    assert not table.suspect(table.local, 0.0)


def test_the_memory_of_silent_peers_is_bounded() -> None:
    table = RoutingTable(fake_peer(), DHTConfig(max_silent_peers=3))
    peers = [fake_peer() for _ in range(5)]
    for i, peer in enumerate(peers):
        table.mark_silent(peer, float(i))
    assert [table.suspect(p, 5.0) for p in peers] == [False, False, True, True, True]


def test_a_contacts_round_trip_is_smoothed_from_timed_requests_only() -> None:
    table = RoutingTable(fake_peer(), DHTConfig())
    contact = Contact(fake_peer())
    assert table.rtt(contact.peer) is None  # not in the table
    table.update(contact, 1.0)
    assert table.rtt(contact.peer) is None  # it spoke to us: nothing timed
    table.update(contact, 2.0, answered=True, rtt=0.3)
    assert table.rtt(contact.peer) == pytest.approx(0.3)  # the first one as it is
    table.update(contact, 3.0, answered=True, rtt=0.06)
    assert table.rtt(contact.peer) == pytest.approx(0.3 + (0.06 - 0.3) * RTT_WEIGHT)
    table.update(contact, 4.0, answered=True)  # an untimed answer (over a fresh dial) moves nothing
    assert table.rtt(contact.peer) == pytest.approx(0.3 + (0.06 - 0.3) * RTT_WEIGHT)


def test_crawl_targets_fall_one_in_each_equal_slice_of_the_key_space() -> None:
    """A trainer's crawl (DHTConfig.crawl_lookups) looks up one random ID in each of ``count``
    equal slices of the key space by distance from it, so together they reach every region."""
    table = RoutingTable(fake_peer(), DHTConfig())
    targets = table.crawl_targets(32, random.Random(5))
    width = (1 << 256) // 32
    assert sorted((t ^ table.local_id) // width for t in targets) == list(range(32))
    assert table.crawl_targets(0) == []
