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


def test_heap_of_expirations_stays_bounded(alice: KeyPair) -> None:
    store = Storage(CONFIG)
    for i in range(3000):  # one publisher refreshing the same record very often
        store.store(rec(alice, exp=NOW + 100 + i * 0.01), NOW)
    assert len(store) == 1
    assert len(store._expiry) <= 2 * len(store) + 1025
