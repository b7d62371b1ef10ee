"""Shared verdicts, pure and checked: an accusation stored by its author and nobody else, evidence
that a third party checks by recompute, and accusations that change nothing when they do not
check out (an honest reply, a forged receipt, a snapshot gone)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
import trio
from hypothesis import given, settings, strategies as st

from volunteer.dht.verdicts import (
    MAX_ACCUSATION, PROOFS_KEY, Accusation, accusation_items, accusations_of, accused_in_index, proof_key,
)
from volunteer.errors import DHTRecordError, ExpertUnavailableError
from volunteer.experts.backend import make_backend
from volunteer.experts.receipts import BACKWARD, FORWARD, Receipt, payload_digest, tensor_digest
from volunteer.experts.recompute import Recomputer, as_received
from volunteer.experts.snapshots import SnapshotStore
from volunteer.experts.tensors import serialize
from volunteer.experts.verdicts import Checked, Evidence, VerdictBook, check_accusation, evidence_of
from volunteer.net.identity import KeyPair, PeerID

HIDDEN = 16
SWARM = "test"


@dataclass
class FakeRecord:
    value: bytes | None
    expiration: float
    signer: PeerID


def receipt_for(keys: KeyPair, store: SnapshotStore, b, inputs, replied, op=FORWARD, grads=()):
    stamp = store.note(b)
    header, chunks = serialize(replied, "none")
    sent = [*inputs, *grads]
    return Receipt(keys.peer_id.to_bytes(), b.uid, op, stamp.expert_class, stamp.hidden_dim, stamp.version, stamp.state,
                   tensor_digest(as_received(sent, "none")), payload_digest(header, list(chunks)), inputs[0].shape[0],
                   "torch.float32", stamp.device, stamp.threads, "none").sign(keys)


class Liar:
    """A host built from our own modules that signs a reply scaled by ``scale``."""

    def __init__(self, scale: float = 1.02, hidden: int = HIDDEN) -> None:
        torch.manual_seed(0)
        self.keys, self.store, self.scale = KeyPair.generate(), SnapshotStore(), scale
        self.backend = make_backend("ffn.0.0", "ffn", hidden)
        self.served = True

    def forward(self, x):
        told = [t * self.scale for t in self.backend.forward([x])]
        return told, receipt_for(self.keys, self.store, self.backend, [x], told)

    async def fetch(self, peer, uid, digest):
        snapshot = self.store.get(digest) if self.served else None
        if snapshot is None:
            raise ExpertUnavailableError("forgotten")
        return snapshot.names, snapshot.tensors


def accuse(accuser: KeyPair, host: Liar, evidence: Evidence, uid: str = "ffn.0.0") -> Accusation:
    return Accusation(SWARM, accuser.peer_id.to_bytes(), host.keys.peer_id.to_bytes(), uid, 1.0,
                      evidence.encode()).sign(accuser)


def check(accusation: Accusation, host: Liar):
    return trio.run(check_accusation, accusation, host.fetch, Recomputer())


def test_a_lie_proven_by_one_trainer_checks_out_for_anyone_by_recompute():
    liar, trainer = Liar(1.02), KeyPair.generate()
    x = torch.randn(4, HIDDEN)
    told, receipt = liar.forward(x)
    evidence = evidence_of(receipt, [x], told)
    assert evidence is not None
    accusation = Accusation.decode(accuse(trainer, liar, evidence).encode())
    assert accusation.verify() and len(accusation.encode()) <= MAX_ACCUSATION
    checked = check(accusation, liar)
    assert checked.proven, checked
    book = VerdictBook()
    proven = book.record(accusation, checked, now=0.0)
    assert proven is not None and book.excluded(liar.keys.peer_id)
    assert proven.reason.startswith(f"proof published by {trainer.peer_id}")
    assert not book.due(accusation, now=100.0)  # one recompute per distinct proof


def test_a_backward_lie_checks_out_too():
    liar, trainer = Liar(), KeyPair.generate()
    x, g = torch.randn(4, HIDDEN), torch.randn(4, HIDDEN)
    store = liar.store
    before = store.note(liar.backend)
    grads = [t * 1.05 for t in liar.backend.backward([x], [g])]
    header, chunks = serialize(grads, "none")
    receipt = Receipt(liar.keys.peer_id.to_bytes(), "ffn.0.0", BACKWARD, before.expert_class, before.hidden_dim,
                      before.version, before.state, tensor_digest([x, g]), payload_digest(header, list(chunks)), 4,
                      "torch.float32", before.device, before.threads, "none").sign(liar.keys)
    evidence = evidence_of(receipt, [x], grads, grad_outputs=[g])
    assert evidence is not None
    assert check(accuse(trainer, liar, evidence), liar).proven


def test_a_forged_accusation_against_an_honest_host_changes_nothing():
    honest, trainer = Liar(1.0), KeyPair.generate()
    x = torch.randn(4, HIDDEN)
    told, receipt = honest.forward(x)
    evidence = evidence_of(receipt, [x], told)
    assert evidence is not None
    book = VerdictBook()
    # the honest reply itself: a recompute reproduces it
    checked = check(accuse(trainer, honest, evidence), honest)
    assert not checked.proven and "reproduces" in checked.detail
    assert book.record(accuse(trainer, honest, evidence), checked, 0.0) is None
    # a reply the host never sent, under its receipt
    lie = [told[0] * 3]
    header, chunks = serialize(lie, "none")
    forged = replace(evidence, reply_header=header, reply_payload=b"".join(bytes(c) for c in chunks))
    assert not check(accuse(trainer, honest, forged), honest).proven
    # a receipt made up for the lie and signed by the accuser, not the host
    made_up = replace(receipt, outputs=payload_digest(header, [forged.reply_payload])).sign(trainer)
    made_up = replace(made_up, peer=honest.keys.peer_id.to_bytes())
    assert not check(accuse(trainer, honest, replace(forged, receipt=made_up)), honest).proven
    # other inputs than the receipt names
    other_inputs = replace(evidence, inputs=[x + 1])
    assert not check(accuse(trainer, honest, other_inputs), honest).proven
    assert not book.excluded(honest.keys.peer_id) and book.refused["not_proven"] == 1


def test_a_proof_whose_snapshot_is_gone_changes_nothing_and_is_tried_again_a_few_times():
    liar, trainer = Liar(1.02), KeyPair.generate()
    x = torch.randn(4, HIDDEN)
    told, receipt = liar.forward(x)
    accusation = accuse(trainer, liar, evidence_of(receipt, [x], told))
    liar.served = False
    checked = check(accusation, liar)
    assert not checked.proven and not checked.final
    book = VerdictBook()
    assert book.record(accusation, checked, 0.0) is None and not book.excluded(liar.keys.peer_id)
    assert not book.due(accusation, 1.0) and book.due(accusation, 60.0)
    for now in (60.0, 120.0):
        book.record(accusation, checked, now)
    assert not book.due(accusation, 1000.0)
    assert book.refused["snapshot_gone"] == 3


def test_evidence_past_what_a_reader_fetches_stays_the_auditors():
    liar = Liar(1.02, hidden=256)
    x = torch.randn(1024, 256)  # 256 K float32 each way: over MAX_CHUNKED_EVIDENCE (~1 MiB)
    told, receipt = liar.forward(x)
    assert evidence_of(receipt, [x], told) is None


def test_only_accusations_stored_by_their_author_for_this_swarm_and_accused_count():
    liar, trainer, other = Liar(), KeyPair.generate(), KeyPair.generate()
    x = torch.randn(2, HIDDEN)
    told, receipt = liar.forward(x)
    good = accuse(trainer, liar, evidence_of(receipt, [x], told))
    accused = liar.keys.peer_id.to_bytes()
    items = accusation_items(good, 100.0)
    assert items[0][0] == proof_key(accused) and items[1][0] == PROOFS_KEY
    records = {
        b"a": FakeRecord(good.encode(), 100.0, trainer.peer_id),
        b"b": FakeRecord(good.encode(), 100.0, other.peer_id),  # replayed by someone else
        b"c": FakeRecord(replace(good, uid="ffn.1.1").encode(), 100.0, trainer.peer_id),  # signature broken
        b"d": FakeRecord(replace(good, swarm="other").sign(trainer).encode(), 100.0, trainer.peer_id),
        b"e": FakeRecord(b"\x93junk", 100.0, trainer.peer_id),
        b"f": FakeRecord(good.encode(), 5.0, trainer.peer_id),  # expired
    }
    found, refused = accusations_of(accused, records, SWARM, now=10.0)
    assert found == [good] and refused == 4
    index = {items[1][1]: FakeRecord(items[1][2], 100.0, trainer.peer_id),
             accused + b"x": FakeRecord(accused, 100.0, other.peer_id)}  # a pointer not under its own name
    assert accused_in_index(index, now=10.0) == [accused]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_parse_as_an_accusation_or_evidence_by_accident(data):
    try:
        Accusation.decode(data)
    except DHTRecordError:
        pass
    from volunteer.errors import ExpertProtocolError

    try:
        Evidence.decode(data)
    except (ExpertProtocolError, ValueError):
        pass


def test_checked_is_never_proven_for_unparseable_evidence():
    liar, trainer = Liar(), KeyPair.generate()
    bad = Accusation(SWARM, trainer.peer_id.to_bytes(), liar.keys.peer_id.to_bytes(), "ffn.0.0", 1.0, b"\x90").sign(trainer)
    result = check(bad, liar)
    assert isinstance(result, Checked) and not result.proven


@pytest.mark.parametrize("size", [MAX_ACCUSATION + 1])
def test_an_accusation_past_its_bound_is_refused_unread(size):
    with pytest.raises(DHTRecordError):
        Accusation.decode(b"\x00" * size)


_HOST = None  # one liar for every example: building a backend per example is most of the test's time


def _liar() -> Liar:
    global _HOST
    if _HOST is None:
        _HOST = Liar()
    return _HOST


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(["t", "n", "x"]), st.one_of(st.integers(-2**31, 2**40), st.text(max_size=4), st.lists(
    st.dictionaries(st.sampled_from(["d", "s", "c", "n"]), st.one_of(st.integers(-2, 2**40), st.text(max_size=8),
                                                                     st.lists(st.integers(-1, 2**31), max_size=3))),
    max_size=2)), max_size=3), st.binary(max_size=64))
def test_an_accusation_with_any_reply_header_never_crashes_its_reader(header, payload):
    liar, trainer = _liar(), KeyPair.generate()
    x = torch.randn(2, HIDDEN)
    told, receipt = liar.forward(x)
    evidence = replace(evidence_of(receipt, [x], told), reply_header=header, reply_payload=payload)
    result = check(accuse(trainer, liar, evidence), liar)
    assert not result.proven


class _Always(__import__("random").Random):
    def random(self) -> float:  # every reply audited
        return 0.0


@dataclass
class _Call:
    uid: str
    peer: PeerID
    backward_follows: bool = False


async def _audit_once(host: Liar, x: torch.Tensor) -> list:
    from volunteer.experts.audit import Auditor
    from volunteer.experts.trust import TrustLedger

    found: list = []
    auditor = Auditor(TrustLedger(), lambda uid: [], lambda *a: None, {}, rng=_Always(), fetch_snapshot=host.fetch,
                      on_proof=found.append)
    told, receipt = host.forward(x)
    auditor.answered(_Call("ffn.0.0", host.keys.peer_id), x, told, receipt=receipt)
    with trio.fail_after(30):
        while auditor.pending:
            await trio.sleep(0.01)
    return found


def test_an_audit_hands_its_proof_with_checkable_evidence_to_the_swarm_and_an_honest_reply_none():
    liar, trainer = Liar(1.02), KeyPair.generate()
    x = torch.randn(4, HIDDEN)
    (proof,) = trio.run(_audit_once, liar, x)
    assert proof.peer == str(liar.keys.peer_id) and proof.uid == "ffn.0.0" and "contradicted by recompute" in proof.reason
    assert proof.evidence is not None and check(accuse(trainer, liar, proof.evidence), liar).proven
    assert trio.run(_audit_once, Liar(1.0), x) == []
