"""Signed records and bounded storage (pure, fake ``now``)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from volunteer.dht.config import DHTConfig
from volunteer.dht.records import OK, STALE, Record, Storage, check, owned_subkey, sign
from volunteer.errors import DHTRecordError, LocalProtocolError
from volunteer.net.identity import KeyPair, PeerID

NOW = 1_000_000.0
CONFIG = DHTConfig()


@pytest.fixture(scope="module")
def alice() -> KeyPair:
    return KeyPair.generate()


@pytest.fixture(scope="module")
def mallory() -> KeyPair:
    return KeyPair.generate()


def rec(kp: KeyPair, key=b"k", value=b"v", exp=NOW + 10, suffix=b"") -> Record:
    return sign(kp, key, owned_subkey(kp.peer_id, suffix), value, exp)


def code_of(record: Record, now: float = NOW, config: DHTConfig = CONFIG) -> str:
    with pytest.raises(DHTRecordError) as info:
        check(record, now, config)
    return info.value.code


def test_signed_record_checks(alice: KeyPair) -> None:
    record = rec(alice)
    check(record, NOW, CONFIG)
    assert record.signer == alice.peer_id and not record.is_tombstone
    check(rec(alice, suffix=b"/extra"), NOW, CONFIG)  # owner's sub-key with a suffix


def test_forgeries_refused(alice: KeyPair, mallory: KeyPair) -> None:
    good = rec(alice)
    assert code_of(dataclasses.replace(good, value=b"evil")) == "bad-signature"
    assert code_of(dataclasses.replace(good, expiration=good.expiration + 1)) == "bad-signature"
    assert code_of(dataclasses.replace(good, key=b"other")) == "bad-signature"
    assert code_of(dataclasses.replace(good, signature=b"\x00" * 64)) == "bad-signature"
    # mallory signs a record under alice's sub-key
    payload_record = dataclasses.replace(rec(mallory), subkey=good.subkey)
    assert code_of(payload_record) == "not-owner"
    # ...and claims to be alice while signing with her own key
    assert code_of(dataclasses.replace(rec(mallory, suffix=b""), signer=alice.peer_id)) == "not-owner"
    forged = dataclasses.replace(rec(mallory), signer=alice.peer_id, subkey=good.subkey)
    assert code_of(forged) == "bad-signature"
    with pytest.raises(LocalProtocolError):
        sign(mallory, b"k", good.subkey, b"v", NOW + 10)


def test_signer_without_inline_key_is_unverifiable(alice: KeyPair) -> None:
    hashed = PeerID(b"\x12\x20" + os.urandom(32))
    record = dataclasses.replace(rec(alice), signer=hashed, subkey=hashed.to_bytes())
    assert code_of(record) == "unverifiable"


def test_bounds_and_expiry_window(alice: KeyPair) -> None:
    assert code_of(rec(alice, value=b"x" * (CONFIG.max_value_size + 1))) == "too-large"
    assert code_of(rec(alice, key=b"k" * (CONFIG.max_key_size + 1))) == "too-large"
    assert code_of(rec(alice, key=b"")) == "invalid"
    assert code_of(rec(alice, suffix=b"s" * CONFIG.max_subkey_size)) == "too-large"
    assert code_of(rec(alice, exp=NOW)) == "expired"
    assert code_of(rec(alice, exp=float("inf"))) == "invalid"
    assert code_of(rec(alice, exp=float("nan"))) == "invalid"
    limit = NOW + CONFIG.max_ttl + CONFIG.max_clock_skew
    check(rec(alice, exp=limit), NOW, CONFIG)  # a publisher's clock a little ahead is tolerated
    assert code_of(rec(alice, exp=limit + 1)) == "too-far"


def test_newest_expiration_wins(alice: KeyPair) -> None:
    store = Storage(CONFIG)
    assert store.store(rec(alice, value=b"a", exp=NOW + 10), NOW)
    assert not store.store(rec(alice, value=b"old", exp=NOW + 5), NOW)
    assert not store.store(rec(alice, value=b"same", exp=NOW + 10), NOW)  # tie: keep what we have
    assert store.store(rec(alice, value=b"b", exp=NOW + 20), NOW)
    (held,) = store.get(b"k", NOW).values()
    assert held.value == b"b" and len(store) == 1
    assert store.store_many([rec(alice, value=b"c", exp=NOW + 1)], NOW) == [STALE]


def test_tombstone_deletes_and_itself_expires(alice: KeyPair) -> None:
    store = Storage(CONFIG)
    live = rec(alice, value=b"v", exp=NOW + 15)
    store.store(live, NOW)
    tomb = rec(alice, value=None, exp=NOW + 15)  # same expiration as the record it deletes
    assert tomb.is_tombstone
    assert store.store(tomb, NOW + 1)
    (held,) = store.get(b"k", NOW + 1).values()
    assert held.is_tombstone
    assert not store.store(live, NOW + 2)  # a stale copy cannot revive it
    assert store.get(b"k", NOW + 15) == {}
    assert store.collect(NOW + 15) == 1 and len(store) == 0 and store.bytes_used == 0
    # a later declaration does come back
    assert store.store(rec(alice, value=b"again", exp=NOW + 30), NOW + 16)


def test_expired_records_never_returned_and_collected(alice: KeyPair, mallory: KeyPair) -> None:
    store = Storage(CONFIG)
    store.store(rec(alice, key=b"a", exp=NOW + 5), NOW)
    store.store(rec(mallory, key=b"a", exp=NOW + 50), NOW)
    store.store(rec(alice, key=b"b", exp=NOW + 5), NOW)
    assert len(store.get(b"a", NOW + 4)) == 2
    assert len(store.get(b"a", NOW + 5)) == 1 and store.get(b"b", NOW + 5) == {}
    assert len(list(store.records(NOW + 5))) == 1
    assert store.collect(NOW + 5) == 2
    assert len(store) == 1 and store.records_of(alice.peer_id) == 0
    # an expired record is replaced even by an "older" one: it no longer counts
    store.store(rec(alice, key=b"c", exp=NOW + 5), NOW)
    assert store.store(rec(alice, key=b"c", exp=NOW + 7), NOW + 6)


def test_expired_refused_on_store(alice: KeyPair) -> None:
    store = Storage(CONFIG)
    assert store.store_many([rec(alice, exp=NOW - 1), rec(alice, exp=NOW + 1)], NOW) == ["expired", OK]


def test_cap_subkeys_per_key(alice: KeyPair) -> None:
    config = DHTConfig(max_subkeys_per_key=3)
    store = Storage(config)
    for i in range(3):
        assert store.store(rec(alice, suffix=bytes([i]), exp=NOW + 10 + i), NOW)
    # a newcomer that outlives the soonest-expiring entry takes its place
    assert store.store(rec(alice, suffix=b"\x09", exp=NOW + 20), NOW)
    subs = store.get(b"k", NOW)
    assert len(subs) == 3 and owned_subkey(alice.peer_id, b"\x00") not in subs
    # one that would expire first is refused
    with pytest.raises(DHTRecordError) as info:
        store.store(rec(alice, suffix=b"\x0a", exp=NOW + 5), NOW)
    assert info.value.code == "key-full"


def test_cap_records_per_signer(alice: KeyPair, mallory: KeyPair) -> None:
    config = DHTConfig(max_records_per_signer=2)
    store = Storage(config)
    assert store.store_many([rec(mallory, key=bytes([i])) for i in range(4)], NOW) == [
        OK,
        OK,
        "signer-quota",
        "signer-quota",
    ]
    assert store.store(rec(mallory, key=b"\x00", exp=NOW + 99), NOW)  # refreshing its own is fine
    assert store.store(rec(alice, key=b"\x05"), NOW)  # others are unaffected
    store.collect(NOW + 10)
    assert store.store(rec(mallory, key=b"\x07", exp=NOW + 200), NOW + 10)  # quota freed by expiry


def test_cap_total_records_and_bytes(alice: KeyPair, mallory: KeyPair) -> None:
    store = Storage(DHTConfig(max_total_records=3))
    for i in range(3):
        store.store(rec(alice, key=bytes([i]), exp=NOW + 1 + i), NOW)
    with pytest.raises(DHTRecordError) as info:
        store.store(rec(mallory, key=b"x", exp=NOW + 100), NOW)
    assert info.value.code == "storage-full"
    assert store.store(rec(mallory, key=b"x", exp=NOW + 100), NOW + 1)  # expired ones collected first
    assert len(store) == 3

    size = rec(alice, value=b"v" * 100).size
    store = Storage(DHTConfig(max_total_bytes=2 * size + 10))
    store.store(rec(alice, key=b"a", value=b"v" * 100), NOW)
    store.store(rec(alice, key=b"b", value=b"v" * 100), NOW)
    assert store.store_many([rec(mallory, key=b"c", value=b"v" * 100)], NOW) == ["storage-full"]
    # growing a held record past the byte budget is refused as well
    assert store.store_many([rec(alice, key=b"a", value=b"v" * 120, exp=NOW + 20)], NOW) == ["storage-full"]
    assert store.bytes_used == 2 * size


@pytest.mark.slow
def test_heap_of_expirations_stays_bounded(alice: KeyPair) -> None:
    store = Storage(CONFIG)
    for i in range(3000):  # one publisher refreshing the same record very often
        store.store(rec(alice, exp=NOW + 100 + i * 0.01), NOW)
    assert len(store) == 1
    assert len(store._expiry) <= 2 * len(store) + 1025


# --- fairness: a signer's share of a key, largest holder loses first ---------------------
ATTACKER = ("ip4", "127.0.0.2")
HONEST = ("ip4", "127.0.0.3")


@pytest.fixture(scope="module")
def honest_hosts() -> list[KeyPair]:
    return [KeyPair.generate() for _ in range(16)]


def heartbeat(kp: KeyPair, now: float) -> Record:
    # what ExpertDeclarer stores under a grid prefix: bare PeerID sub-key, 15 s expiration
    return sign(kp, b"ffn.", owned_subkey(kp.peer_id), b"decl", now + 15)


@pytest.mark.slow
def test_one_signer_holds_at_most_its_share_of_a_key(alice: KeyPair, mallory: KeyPair) -> None:
    store = Storage(CONFIG)
    squat = [rec(mallory, key=b"ffn.", suffix=i.to_bytes(2, "big"), exp=NOW + 3600) for i in range(1024)]
    codes = store.store_many(squat, NOW, source=ATTACKER)
    share = CONFIG.max_subkeys_per_signer_per_key
    assert codes[:share] == [OK] * share and set(codes[share:]) == {"signer-share"}
    assert store.holders(b"ffn.")[0][mallory.peer_id] == share
    # refreshing a held sub-key is not a new share; other signers are unaffected
    assert store.store(rec(mallory, key=b"ffn.", suffix=b"\x00\x00", exp=NOW + 3601), NOW, source=ATTACKER)
    assert store.store(rec(alice, key=b"ffn."), NOW, source=HONEST)


@pytest.mark.slow
def test_squatter_with_far_future_subkeys_cannot_evict_heartbeats(mallory: KeyPair, honest_hosts) -> None:
    store = Storage(CONFIG)
    now = NOW
    for round_ in range(8):  # two minutes of heartbeats, the squatter re-flooding before each
        squat = [rec(mallory, key=b"ffn.", suffix=i.to_bytes(2, "big"), exp=now + 3600) for i in range(1024)]
        store.store_many(squat, now, source=ATTACKER)
        assert store.store_many([heartbeat(kp, now) for kp in honest_hosts], now, source=HONEST) == [OK] * 16
        live = store.get(b"ffn.", now)
        assert all(owned_subkey(kp.peer_id) in live for kp in honest_hosts)
        assert len(live) <= CONFIG.max_subkeys_per_key
        now += 15


def test_many_identities_from_one_address_cannot_fill_a_key(honest_hosts) -> None:
    config = DHTConfig(max_subkeys_per_key=64)
    store = Storage(config)
    sybils = [KeyPair.generate() for _ in range(96)]
    flood = [rec(kp, key=b"ffn.", exp=NOW + 3600) for kp in sybils]
    assert store.store_many(flood[:64], NOW, source=ATTACKER) == [OK] * 64  # the key is full
    now = NOW
    for _ in range(4):
        assert store.store_many([heartbeat(kp, now) for kp in honest_hosts], now, source=HONEST) == [OK] * 16
        # the flood goes on: it only pushes out its own (largest source), never a heartbeat
        store.store_many(flood, now, source=ATTACKER)
        live = store.get(b"ffn.", now)
        assert all(owned_subkey(kp.peer_id) in live for kp in honest_hosts)
        assert len(live) == 64 and store.holders(b"ffn.")[1][HONEST] == 16
        now += 15
    assert store.evicted >= 16


def test_largest_holder_loses_first_never_a_smaller_one(alice: KeyPair, mallory: KeyPair) -> None:
    config = DHTConfig(max_subkeys_per_key=4, max_subkeys_per_signer_per_key=3)
    store = Storage(config)
    for i in range(3):
        store.store(rec(mallory, suffix=bytes([i]), exp=NOW + 100 + i), NOW, source=ATTACKER)
    store.store(rec(alice, suffix=b"\x00", exp=NOW + 5), NOW, source=HONEST)  # expires first of all
    # a newcomer from a third address: the attacker (3) is the largest holder, not alice (1)
    bob = KeyPair.generate()
    assert store.store(rec(bob, exp=NOW + 10), NOW, source=("ip4", "10.0.0.9"))
    held = store.get(b"k", NOW)
    assert owned_subkey(alice.peer_id, b"\x00") in held and owned_subkey(mallory.peer_id, b"\x00") not in held
    # a newcomer from the largest source itself gives way to nobody smaller: its own group loses;
    # here its signer (mallory, 2 + 1) is that group's largest, and the newcomer expires first
    with pytest.raises(DHTRecordError) as info:
        store.store(rec(mallory, suffix=b"\x09", exp=NOW + 50), NOW, source=ATTACKER)
    assert info.value.code == "key-full"
    assert store.store(rec(mallory, suffix=b"\x09", exp=NOW + 500), NOW, source=ATTACKER)  # replaces its own
    assert owned_subkey(alice.peer_id, b"\x00") in store.get(b"k", NOW)


def test_full_storage_evicts_the_largest_other_source(alice: KeyPair, mallory: KeyPair) -> None:
    store = Storage(DHTConfig(max_total_records=10))
    for i in range(9):
        store.store(rec(mallory, key=bytes([i]), exp=NOW + 3600), NOW, source=ATTACKER)
    store.store(rec(alice, key=b"a"), NOW, source=HONEST)
    assert len(store) == 10
    assert store.store(rec(alice, key=b"b"), NOW, source=HONEST)  # the attacker's oldest goes
    assert len(store) == 10 and store.records_from(ATTACKER) == 8 and store.records_from(HONEST) == 2
    assert store.get(b"\x00", NOW) == {}
    # the attacker's own newcomer finds no larger source to push out
    assert store.store_many([rec(mallory, key=b"z", exp=NOW + 3600)], NOW, source=ATTACKER) == ["storage-full"]


def test_replacement_from_a_new_address_moves_its_count(alice: KeyPair) -> None:
    store = Storage(CONFIG)
    store.store(rec(alice, exp=NOW + 10), NOW, source=HONEST)
    store.store(rec(alice, exp=NOW + 20), NOW, source=ATTACKER)
    assert store.holders(b"k")[1] == {ATTACKER: 1}
    assert store.records_from(HONEST) == 0 and store.records_from(ATTACKER) == 1
    store.collect(NOW + 30)
    assert len(store) == 0 and store.records_from(ATTACKER) == 0 and store.holders(b"k") == ({}, {})
