"""Chunked evidence: a proof too large for one DHT record is published in content-addressed
pieces that its signed accusation names by digest; a reader assembles them, checks the digest and
then checks the proof by recompute. Missing or altered pieces, or a reference past the bound a
reader fetches, change nothing."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
import trio

from volunteer.dht.verdicts import (
    CHUNK_SIZE, MAX_CHUNKED_EVIDENCE, MAX_CHUNKS, MAX_EVIDENCE, Accusation, EvidenceRef, assemble, chunk_items, chunk_key,
    proof_key, split_evidence,
)
from volunteer.errors import DHTRecordError
from volunteer.experts.recompute import Recomputer
from volunteer.experts.verdicts import VerdictBook, VerdictWatch, check_accusation, evidence_of
from volunteer.net.identity import KeyPair, PeerID

from .test_verdicts import HIDDEN, SWARM, FakeRecord, Liar

ROWS = 128  # 2,048 float32 each way at width 16: ~16 KiB of evidence, three pieces


def large_proof(liar: Liar, rows: int = ROWS):
    x = torch.randn(rows, HIDDEN)
    told, receipt = liar.forward(x)
    evidence = evidence_of(receipt, [x], told)
    assert evidence is not None
    return evidence


def records_of(items, signer: PeerID, expiration: float = 100.0) -> dict:
    found: dict = {}
    for key, subkey, value, _ in items:
        found.setdefault(key, {})[subkey] = FakeRecord(value, expiration, signer)
    return found


def test_evidence_splits_into_pieces_that_assemble_only_when_whole_and_unaltered():
    trainer, other = KeyPair.generate(), KeyPair.generate()
    evidence = large_proof(Liar()).encode()
    assert len(evidence) > MAX_EVIDENCE  # it would not fit one record
    ref, pieces = split_evidence(evidence)
    assert ref.chunks == len(pieces) >= 2 and all(len(p) <= CHUNK_SIZE for p in pieces)
    me = trainer.peer_id.to_bytes()
    items = chunk_items(ref, pieces, me, 100.0)
    assert len({key for key, *_ in items}) == ref.chunks  # one key per piece: no signer's share binds
    found = records_of(items, trainer.peer_id)
    assert assemble(ref, me, found, now=10.0) == evidence
    # a piece missing, expired, altered, or only under another signer's sub-key: nothing is believed
    missing = {k: v for k, v in found.items() if k != chunk_key(ref.digest, 1)}
    assert assemble(ref, me, missing, now=10.0) is None
    assert assemble(ref, me, found, now=200.0) is None
    altered = dict(found)
    piece = found[chunk_key(ref.digest, 0)][me].value
    altered[chunk_key(ref.digest, 0)] = {me: FakeRecord(bytes([piece[0] ^ 1]) + piece[1:], 100.0, trainer.peer_id)}
    assert assemble(ref, me, altered, now=10.0) is None
    theirs = {key: {other.peer_id.to_bytes(): rec for rec in subs.values()} for key, subs in found.items()}
    assert assemble(ref, me, theirs, now=10.0) is None
    with pytest.raises(ValueError):
        split_evidence(evidence[:MAX_EVIDENCE])  # fits a record: carried inline


def test_a_chunked_accusation_signs_its_reference_and_refuses_one_past_the_bound():
    liar, trainer = Liar(), KeyPair.generate()
    ref, _ = split_evidence(large_proof(liar).encode())
    accusation = Accusation(SWARM, trainer.peer_id.to_bytes(), liar.keys.peer_id.to_bytes(), "ffn.0.0", 1.0,
                            ref).sign(trainer)
    decoded = Accusation.decode(accusation.encode())
    assert decoded == accusation and decoded.verify() and decoded.digest == ref.digest
    assert not replace(decoded, evidence=replace(ref, digest=bytes(32))).verify()  # the digest is signed
    too_many = EvidenceRef(ref.digest, MAX_CHUNKED_EVIDENCE + 1, MAX_CHUNKS + 1)
    wrong_count = replace(ref, chunks=ref.chunks + 1)
    for bad in (too_many, wrong_count, replace(ref, digest=b"short")):
        with pytest.raises(DHTRecordError):
            Accusation.decode(replace(accusation, evidence=bad).sign(trainer).encode())


def test_a_chunked_proof_checks_out_by_recompute_once_assembled_and_changes_nothing_unread():
    liar, trainer = Liar(1.02), KeyPair.generate()
    encoded = large_proof(liar).encode()
    ref, _ = split_evidence(encoded)
    accusation = Accusation(SWARM, trainer.peer_id.to_bytes(), liar.keys.peer_id.to_bytes(), "ffn.0.0", 1.0,
                            ref).sign(trainer)
    checked = trio.run(lambda: check_accusation(accusation, liar.fetch, Recomputer(), evidence_bytes=encoded))
    assert checked.proven, checked
    book = VerdictBook()
    unread = trio.run(check_accusation, accusation, liar.fetch, Recomputer())
    assert not unread.final and book.record(accusation, unread, 0.0) is None
    assert book.refused["evidence_unread"] == 1 and not book.excluded(liar.keys.peer_id)
    assert book.due(accusation, 60.0)  # pieces still on their way are read again later


class SharedDHT:
    """The DHT as one dict, seen by several peers: what ``VerdictWatch`` stores and reads."""

    def __init__(self) -> None:
        self.data: dict[bytes, dict[bytes, FakeRecord]] = {}
        self.now = 10.0

    def view(self, keys: KeyPair) -> "View":
        return View(self, keys)


@dataclass
class View:
    shared: SharedDHT
    keys: KeyPair

    def clock(self) -> float:
        return self.shared.now

    async def store_many(self, items) -> list[int]:
        for key, subkey, value, expiration in items:
            assert subkey.startswith(self.keys.peer_id.to_bytes()) and len(value) <= 8 * 1024
            self.shared.data.setdefault(key, {})[subkey] = FakeRecord(value, expiration, self.keys.peer_id)
        return [1] * len(items)

    async def get(self, key: bytes) -> dict:
        return dict(self.shared.data.get(key, {}))

    async def get_many(self, keys) -> dict:
        keys = list(keys)
        assert len(keys) <= 64  # the DHT's bound on keys per request
        return {key: dict(self.shared.data[key]) for key in keys if key in self.shared.data}


def watches(liar: Liar):
    dht = SharedDHT()
    auditor, reader = KeyPair.generate(), KeyPair.generate()
    proven: list[str] = []
    publisher = VerdictWatch(dht.view(auditor), auditor, SWARM, liar.fetch)  # type: ignore[arg-type]
    watcher = VerdictWatch(dht.view(reader), reader, SWARM, liar.fetch,  # type: ignore[arg-type]
                           on_proven=lambda peer, p: proven.append(peer))
    return dht, publisher, watcher, proven


def chunk_keys(dht: SharedDHT) -> list[bytes]:
    return [key for key in dht.data if key.startswith(b"volunteer-proof-chunk/")]


def test_a_peer_that_never_called_the_liar_excludes_it_on_a_chunked_proof_another_published():
    liar = Liar(1.02)
    dht, publisher, watcher, proven = watches(liar)
    accused = str(liar.keys.peer_id)
    assert trio.run(publisher.publish, accused, "ffn.0.0", large_proof(liar), "contradicted")
    assert publisher.unpublished == 0 and len(chunk_keys(dht)) >= 2
    assert trio.run(watcher.read) == [accused] and proven == [accused]
    assert watcher.book.excluded(liar.keys.peer_id)


@pytest.mark.parametrize("damage", ["missing", "altered"])
def test_a_chunked_proof_with_a_missing_or_altered_piece_excludes_nobody(damage):
    liar = Liar(1.02)
    dht, publisher, watcher, proven = watches(liar)
    assert trio.run(publisher.publish, str(liar.keys.peer_id), "ffn.0.0", large_proof(liar), "contradicted")
    key = chunk_keys(dht)[0]
    if damage == "missing":
        del dht.data[key]
    else:
        for record in dht.data[key].values():
            record.value = record.value[:-1] + bytes([record.value[-1] ^ 1])
    assert trio.run(watcher.read) == [] and proven == []
    assert not watcher.book.excluded(liar.keys.peer_id)
    assert watcher.book.refused["evidence_unread"] == 1


def test_an_honest_hosts_large_reply_accused_in_pieces_excludes_nobody():
    honest = Liar(1.0)
    dht, publisher, watcher, proven = watches(honest)
    assert trio.run(publisher.publish, str(honest.keys.peer_id), "ffn.0.0", large_proof(honest), "made up")
    assert chunk_keys(dht) and trio.run(watcher.read) == [] and proven == []
    assert watcher.book.refused["not_proven"] == 1


class CountingView(View):
    """A view that remembers the keys each ``get_many`` asked for."""

    def __init__(self, shared: SharedDHT, keys: KeyPair) -> None:
        super().__init__(shared, keys)
        self.asked: list[set[bytes]] = []

    async def get_many(self, keys) -> dict:
        keys = list(keys)
        self.asked.append(set(keys))
        return await super().get_many(keys)


def test_a_watcher_reads_the_index_every_time_and_its_peers_keys_only_every_peers_period():
    liar = Liar(1.02)
    dht = SharedDHT()
    auditor, reader = KeyPair.generate(), KeyPair.generate()
    dealt_with = [str(KeyPair.generate().peer_id) for _ in range(3)]
    view = CountingView(dht, reader)
    watcher = VerdictWatch(view, reader, SWARM, liar.fetch, peers=lambda: dealt_with,  # type: ignore[arg-type]
                           peers_period=60.0)
    theirs = {proof_key(PeerID.from_string(peer).to_bytes()) for peer in dealt_with}

    assert trio.run(watcher.read) == [] and view.asked == [theirs]  # the first read: their keys
    dht.now = 20.0
    assert trio.run(watcher.read) == [] and len(view.asked) == 1  # an empty index: nothing more
    # an accusation the index names is read (and checked) on the next read, within a period
    publisher = VerdictWatch(dht.view(auditor), auditor, SWARM, liar.fetch)  # type: ignore[arg-type]
    assert trio.run(publisher.publish, str(liar.keys.peer_id), "ffn.0.0", large_proof(liar), "contradicted")
    dht.now = 30.0
    assert trio.run(watcher.read) == [str(liar.keys.peer_id)]
    assert view.asked[1] == {proof_key(liar.keys.peer_id.to_bytes())}
    dht.now = 70.0  # a period after the first read: their keys again
    asked = len(view.asked)
    trio.run(watcher.read)
    assert view.asked[asked] == theirs
    dht.now = 75.0
    watcher.read_soon()  # asked to look now: their keys too
    asked = len(view.asked)
    trio.run(watcher.read)
    assert view.asked[asked] == theirs
