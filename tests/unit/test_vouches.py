"""Vouches (``volunteer.dht.vouches``): what a trainer signs for the hosts it called, and
how a reader's ledger merges and ranks them."""

from dataclasses import replace

import pytest

from volunteer.errors import DHTRecordError
from volunteer.dht.vouches import HALF_LIFE, Ledger, Vouch, VouchBook, vouch_item
from volunteer.net.identity import KeyPair, PeerID

SWARM = "test-swarm"
NOW = 1_700_000_000.0


def book(keypair=None):
    return VouchBook(keypair or KeyPair.generate(), SWARM, NOW)


def host_id() -> bytes:
    return KeyPair.generate().peer_id.to_bytes()


def test_a_book_signs_cumulative_vouches_for_the_hosts_that_moved():
    trainer, a, b = book(), host_id(), host_id()
    trainer.accept(a, 4)
    trainer.accept(a, 2)
    trainer.accept(b, 1)
    first = {v.host: v for v in trainer.due(NOW)}
    assert (first[a].calls, first[a].samples, first[b].calls) == (2, 6, 1)
    assert all(v.verify() for v in first.values())
    assert trainer.due(NOW + 1) == []  # nothing moved since
    trainer.accept(a, 1)
    [again] = trainer.due(NOW + 2)
    assert (again.host, again.calls, again.samples) == (a, 3, 7) and again.seq > first[a].seq


def test_a_vouch_round_trips_and_a_malformed_one_is_refused():
    trainer = book()
    trainer.accept(host_id(), 3)
    [vouch] = trainer.due(NOW)
    assert Vouch.decode(vouch.encode()) == vouch
    key, subkey, value, _ = vouch_item(vouch, NOW + 60)
    assert subkey == vouch.trainer + vouch.host and Vouch.decode(value) == vouch
    for bad in (b"", b"\xc1", b"\x93\x01\x02\x03", b"x" * 5000):
        with pytest.raises(DHTRecordError):
            Vouch.decode(bad)


def test_the_ledger_ranks_by_vouched_calls_and_lists_nobody_without_one():
    trainer = book()
    busy, idle = host_id(), host_id()
    for _ in range(5):
        trainer.accept(busy, 2)
    trainer.accept(idle, 0)
    ledger = Ledger(SWARM)
    for vouch in trainer.due(NOW):
        ledger.merge(vouch, NOW)
    rows = ledger.contributors(NOW)
    assert [r["calls"] for r in rows] == [5, 1]
    assert rows[0]["samples"] == 10 and rows[0]["trainers"] == 1
    assert [r["peer"] for r in rows] == [str(PeerID.from_bytes(busy)), str(PeerID.from_bytes(idle))]
    assert ledger.contributors(NOW + 10 * HALF_LIFE)[0]["calls"] == 5  # a departed host keeps its total


def test_a_forged_signature_counts_nothing():
    trainer = book()
    host = host_id()
    trainer.accept(host, 1)
    [vouch] = trainer.due(NOW)
    forged = replace(vouch, calls=10_000)  # the signature covers the old count
    ledger = Ledger(SWARM)
    assert not ledger.merge(forged, NOW)
    assert ledger.contributors(NOW) == [] and ledger.refused == 1
    # signed by another key than the trainer it names
    other = KeyPair.generate()
    assert not ledger.merge(replace(vouch, calls=10_000).sign(other), NOW)
    assert ledger.contributors(NOW) == []


def test_a_vouch_for_yourself_by_your_own_key_counts_nothing():
    keypair = KeyPair.generate()
    me = keypair.peer_id.to_bytes()
    selfish = Vouch(SWARM, me, me, 1, 1, NOW, 1000, 1000).sign(keypair)
    assert selfish.verify()
    ledger = Ledger(SWARM)
    assert not ledger.merge(selfish, NOW)
    assert ledger.contributors(NOW) == []
    trainer = VouchBook(keypair, SWARM, NOW)
    trainer.accept(me, 5)  # nor does a book tally its own replies
    assert trainer.due(NOW) == []


def test_a_replayed_or_older_vouch_adds_nothing_and_a_new_epoch_adds_on():
    keypair = KeyPair.generate()
    trainer, host = VouchBook(keypair, SWARM, NOW), host_id()
    trainer.accept(host, 1)
    [old] = trainer.due(NOW)
    trainer.accept(host, 1)
    [new] = trainer.due(NOW + 10)
    ledger = Ledger(SWARM)
    assert ledger.merge(new, NOW + 10)
    assert not ledger.merge(new, NOW + 11)  # replayed
    assert not ledger.merge(old, NOW + 12)  # older
    assert ledger.contributors(NOW + 12)[0]["calls"] == 2
    restarted = VouchBook(keypair, SWARM, NOW + 100)  # counts begin at 0 again in a new epoch
    restarted.accept(host, 1)
    [after] = restarted.due(NOW + 101)
    assert ledger.merge(after, NOW + 101)
    assert ledger.contributors(NOW + 101)[0]["calls"] == 3


def test_another_swarms_vouch_is_refused():
    trainer = VouchBook(KeyPair.generate(), "elsewhere", NOW)
    trainer.accept(host_id(), 1)
    ledger = Ledger(SWARM)
    assert not any(ledger.merge(v, NOW) for v in trainer.due(NOW))


def test_the_recent_average_halves_every_half_life():
    trainer, host = book(), host_id()
    for _ in range(8):
        trainer.accept(host, 1)
    ledger = Ledger(SWARM)
    for vouch in trainer.due(NOW):
        ledger.merge(vouch, NOW)
    now_rate = ledger.contributors(NOW)[0]["recent_per_day"]
    later = ledger.contributors(NOW + HALF_LIFE)[0]
    assert later["calls"] == 8  # the total never decays
    assert later["recent_per_day"] == pytest.approx(now_rate / 2, rel=0.01)
