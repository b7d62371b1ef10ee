"""Receipts, snapshots and exact recompute, pure: a receipt signed by its host and nobody else,
a reply's digest the same on both ends in every encoding, a snapshot taken once per state version
and kept within its bounds, and a recompute that passes honest replies computed in other batches
and thread counts and contradicts lies far inside replicas' honest drift."""

from __future__ import annotations

import math
from dataclasses import replace

import msgpack
import pytest
import torch
from hypothesis import given, settings, strategies as st

from volunteer.errors import ExpertProtocolError
from volunteer.experts.backend import make_backend
from volunteer.experts.receipts import (
    BACKWARD, FORWARD, PayloadDigest, Receipt, check_reply, payload_digest, tensor_digest,
)
from volunteer.experts.recompute import Recomputer, Verdict, as_received
from volunteer.experts.receipts import StateBinding
from volunteer.experts.snapshots import SnapshotPolicy, SnapshotStore, state_digest
from volunteer.experts.tensors import COMPRESSIONS, serialize
from volunteer.net.identity import KeyPair

HIDDEN = 32


def backend(seed: int = 0):
    torch.manual_seed(seed)
    return make_backend("ffn.0", "ffn", HIDDEN)


def receipt_for(keys: KeyPair, store: SnapshotStore, b, inputs, replied, op=FORWARD, grads=(), compression="none",
                stamp=None):
    stamp = stamp or store.note(b)
    header, chunks = serialize(replied, compression)
    sent = [*as_received(inputs, compression), *as_received(list(grads), compression)] if grads else as_received(inputs, compression)
    return Receipt(keys.peer_id.to_bytes(), b.uid, op, stamp.expert_class, stamp.hidden_dim, stamp.version, stamp.state,
                   tensor_digest(sent), payload_digest(header, list(chunks)), inputs[0].shape[0], "torch.float32",
                   stamp.device, stamp.threads, compression).sign(keys)


def test_a_receipt_verifies_for_its_signer_only_and_any_change_breaks_it():
    keys, other = KeyPair.generate(), KeyPair.generate()
    store, b = SnapshotStore(), backend()
    x = torch.randn(4, HIDDEN)
    receipt = receipt_for(keys, store, b, [x], b.forward([x]))
    wire = Receipt.decode(receipt.encode())
    assert wire == receipt and wire.verify(keys.peer_id) and wire.verify()
    assert not wire.verify(other.peer_id)
    assert not replace(wire, version=wire.version + 1).verify()
    assert not replace(wire, outputs=bytes(32)).verify()
    forged = replace(wire, peer=other.peer_id.to_bytes())  # claimed by another key
    assert not forged.verify()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_parse_as_a_receipt_by_accident(data):
    try:
        Receipt.decode(data)
    except ExpertProtocolError:
        pass


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_a_replys_digest_is_the_same_on_both_ends_in_every_encoding(compression):
    outputs = [torch.randn(16, HIDDEN)]
    header, chunks = serialize(outputs, compression)
    chunks = [bytes(c) for c in chunks]
    sent = payload_digest(header, chunks)
    # the trainer reads the header back from msgpack and the payload in other chunks
    read = msgpack.unpackb(msgpack.packb(header, use_bin_type=True), raw=False)
    digest = PayloadDigest(read)
    payload = b"".join(chunks)
    for start in range(0, len(payload), 333):
        digest.update(payload[start:start + 333])
    assert digest.digest() == sent


def test_a_reply_without_a_matching_receipt_fails_its_call():
    keys = KeyPair.generate()
    store, b = SnapshotStore(), backend()
    x = torch.randn(4, HIDDEN)
    receipt = receipt_for(keys, store, b, [x], b.forward([x]))
    check_reply(receipt, uid="ffn.0", op="forward", outputs=receipt.outputs, peer=keys.peer_id)
    with pytest.raises(ExpertProtocolError, match="without a receipt"):
        check_reply(None, uid="ffn.0", op="forward", outputs=receipt.outputs, peer=keys.peer_id)
    with pytest.raises(ExpertProtocolError, match="does not match"):
        check_reply(receipt, uid="ffn.0", op="forward", outputs=bytes(32), peer=keys.peer_id)
    with pytest.raises(ExpertProtocolError, match="not this call"):
        check_reply(receipt, uid="ffn.0", op="backward", outputs=receipt.outputs, peer=keys.peer_id)
    with pytest.raises(ExpertProtocolError, match="another host"):
        check_reply(receipt, uid="ffn.0", op="forward", outputs=receipt.outputs, peer=KeyPair.generate().peer_id)


def test_a_snapshot_is_taken_once_per_state_version_and_digested_only_when_served():
    store, b = SnapshotStore(), backend()
    first = store.note(b)
    before = state_digest(list(b.module.state_dict().items()))
    assert store.note(b) == first and store.taken == 1  # no new version: no copy
    x = torch.randn(4, HIDDEN)
    b.backward([x], [torch.randn(4, HIDDEN)])
    second = store.note(b)
    assert second.version == first.version + 1 and second.state != first.state and store.taken == 2
    assert store.report()["digested"] == 0  # copies only: nothing hashed on the way to a reply
    kept = store.get(first.state)
    # digested after the step changed the module: the copy is the state that computed the reply
    assert kept is not None and kept.digest() == before and kept.version == first.version
    assert kept.digest() == before and store.report()["digested"] == 1  # once
    assert store.get(bytes(32)) is None and store.missed == 1


def test_snapshot_ids_never_repeat_across_stores_or_versions():
    b = backend()
    ids = {SnapshotStore().note(b).state for _ in range(3)}  # a restarted host, the same state and version
    store = SnapshotStore()
    for _ in range(3):
        ids.add(store.note(b).state)
        b.backward([torch.randn(2, HIDDEN)], [torch.randn(2, HIDDEN)])
    assert len(ids) == 6


def test_snapshots_are_kept_within_time_bytes_and_count_and_the_newest_always():
    now = [0.0]
    b = backend()
    size = sum(t.nelement() * t.element_size() for t in b.module.state_dict().values())
    store = SnapshotStore(SnapshotPolicy(keep_s=10.0, max_bytes=3 * size, max_count=100), clock=lambda: now[0])
    digests = []
    for _ in range(5):
        digests.append(store.note(b).state)
        b.backward([torch.randn(2, HIDDEN)], [torch.randn(2, HIDDEN)])
        now[0] += 1.0
    report = store.report()
    assert report["snapshots"] == 3 and report["bytes"] <= 3 * size  # the memory budget
    assert store.get(digests[0]) is None and store.get(digests[-1]) is not None
    now[0] += 60.0  # past keep_s: all but the newest go
    assert store.get(digests[-2]) is None and store.get(digests[-1]) is not None


def bound(keys: KeyPair, snapshot) -> StateBinding:
    """The binding a host signs when it serves ``snapshot``."""
    return StateBinding(keys.peer_id.to_bytes(), snapshot.uid, snapshot.state, snapshot.version,
                        snapshot.digest()).sign(keys)


def test_a_state_binding_verifies_for_its_signer_only_and_survives_the_wire():
    keys, store, b = KeyPair.generate(), SnapshotStore(), backend()
    binding = bound(keys, store.get(store.note(b).state))
    wire = StateBinding.from_wire(msgpack.unpackb(msgpack.packb(binding.to_wire())))
    assert wire == binding and wire.verify(keys.peer_id) and not wire.verify(KeyPair.generate().peer_id)
    assert not replace(wire, digest=bytes(32)).verify() and not replace(wire, state=bytes(32)).verify()
    assert not replace(wire, peer=KeyPair.generate().peer_id.to_bytes()).verify()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), st.integers(), st.text(max_size=5), st.none()), max_size=7))
def test_malformed_bindings_are_refused_not_crashed_on(item):
    try:
        StateBinding.from_wire(item)
    except ExpertProtocolError:
        pass


def _truth(b, x):
    return b.forward([x])


def test_an_honest_reply_passes_a_recompute_in_another_batch_and_thread_count():
    keys, store, b = KeyPair.generate(), SnapshotStore(), backend()
    x = torch.randn(64, HIDDEN)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        batched = b.forward([torch.cat([x, torch.randn(192, HIDDEN)])])[0][:64]  # computed with others' rows
    finally:
        torch.set_num_threads(threads)
    receipt = receipt_for(keys, store, b, [x], [batched])
    snapshot = store.get(receipt.state)
    finding = Recomputer().check(receipt, keys.peer_id, snapshot.names, snapshot.tensors, [x], [batched])
    assert finding.verdict is Verdict.PASSED and finding.error < 1e-5, finding


@pytest.mark.parametrize("lie", ["x1.02", "turned 30", "x10"])
def test_a_lie_far_inside_honest_drift_is_contradicted(lie):
    keys, store, b = KeyPair.generate(), SnapshotStore(), backend()
    x = torch.randn(16, HIDDEN)
    honest = _truth(b, x)[0]
    if lie == "x1.02":
        told = honest * 1.02
    elif lie == "x10":
        told = honest * 10
    else:
        other = torch.randn(honest.shape)
        other -= (other * honest).sum() / (honest * honest).sum() * honest
        told = math.cos(math.radians(30)) * honest + math.sin(math.radians(30)) * honest.norm() / other.norm() * other
    receipt = receipt_for(keys, store, b, [x], [told])
    snapshot = store.get(receipt.state)
    finding = Recomputer().check(receipt, keys.peer_id, snapshot.names, snapshot.tensors, [x], [told])
    assert finding.verdict is Verdict.CONTRADICTED and finding.error > 0.01, finding
    assert len(finding.recomputed) == 1 and torch.allclose(finding.recomputed[0], honest, atol=1e-5)


def test_input_gradients_are_recomputed_from_the_state_before_the_step():
    keys, store, b = KeyPair.generate(), SnapshotStore(), backend()
    x, g = torch.randn(8, HIDDEN), torch.randn(8, HIDDEN)
    stamp_before = store.note(b)
    grads = b.backward([x], [g])  # takes its step: the state that computed it is the one before
    store.note(b)
    honest = receipt_for(keys, store, b, [x], grads, op=BACKWARD, grads=[g], stamp=stamp_before)
    snapshot = store.get(honest.state)
    ok = Recomputer().check(honest, keys.peer_id, snapshot.names, snapshot.tensors, [x], grads, grad_outputs=[g])
    assert ok.verdict is Verdict.PASSED, ok
    lied = [grads[0] * 1.02]
    receipt = receipt_for(keys, store, b, [x], lied, op=BACKWARD, grads=[g], stamp=stamp_before)
    bad = Recomputer().check(receipt, keys.peer_id, snapshot.names, snapshot.tensors, [x], lied, grad_outputs=[g])
    assert bad.verdict is Verdict.CONTRADICTED, bad


def test_a_false_receipt_is_caught_whatever_is_false_in_it():
    keys, store, b = KeyPair.generate(), SnapshotStore(), backend()
    x = torch.randn(4, HIDDEN)
    outputs = b.forward([x])
    receipt = receipt_for(keys, store, b, [x], outputs)
    snapshot = store.get(receipt.state)
    check = Recomputer().check
    binding = bound(keys, snapshot)
    assert check(receipt, keys.peer_id, snapshot.names, snapshot.tensors, [x], outputs, binding=binding).verdict is Verdict.PASSED
    other_state = [t + 0.01 for t in snapshot.tensors]  # another state served for that id
    assert check(receipt, keys.peer_id, snapshot.names, other_state, [x], outputs, binding=binding).verdict is Verdict.FALSE_RECEIPT
    for false in (replace(binding, state=bytes(32)), replace(binding, version=binding.version + 1),
                  bound(KeyPair.generate(), snapshot)):  # another id, another version, another signer
        assert check(receipt, keys.peer_id, snapshot.names, snapshot.tensors, [x], outputs,
                     binding=false.sign(keys) if false.peer == binding.peer else false).verdict is Verdict.FALSE_RECEIPT
    assert check(receipt, keys.peer_id, snapshot.names, snapshot.tensors, [x + 1], outputs).verdict is Verdict.FALSE_RECEIPT
    unsigned = replace(receipt, signature=b"\0" * 64)
    assert check(unsigned, keys.peer_id, snapshot.names, snapshot.tensors, [x], outputs).verdict is Verdict.FALSE_RECEIPT
    assert check(receipt, KeyPair.generate().peer_id, snapshot.names, snapshot.tensors, [x], outputs).verdict is Verdict.FALSE_RECEIPT


@pytest.mark.parametrize("compression", ["float16", "blockwise8_64"])
def test_a_lossy_reply_is_recomputed_in_its_own_encoding(compression):
    keys, store, b = KeyPair.generate(), SnapshotStore(), backend()
    x = torch.randn(16, HIDDEN)
    sent = as_received([x], compression)
    honest = as_received(b.forward(sent), compression)
    receipt = receipt_for(keys, store, b, [x], b.forward(sent), compression=compression)
    snapshot = store.get(receipt.state)
    check = Recomputer().check
    assert check(receipt, keys.peer_id, snapshot.names, snapshot.tensors, [x], honest).verdict is Verdict.PASSED
    lied = as_received([b.forward(sent)[0] * 1.02], compression)
    receipt = receipt_for(keys, store, b, [x], [b.forward(sent)[0] * 1.02], compression=compression)
    assert check(receipt, keys.peer_id, snapshot.names, snapshot.tensors, [x], lied).verdict is Verdict.CONTRADICTED


def test_an_evicted_snapshots_memory_is_reused_only_when_nothing_else_holds_it():
    b = backend()
    size = sum(t.nelement() * t.element_size() for t in b.module.state_dict().values())
    store = SnapshotStore(SnapshotPolicy(max_bytes=2 * size))
    stamps, digests = [], []
    held = None
    for step in range(6):
        stamps.append(store.note(b))
        if step == 1:
            held = store.get(stamps[-1].state)  # being served: its memory is not to be written over
            held_values = [t.clone() for t in held.tensors]
            held_digest = held.digest()
        digests.append(state_digest(list(b.module.state_dict().items())))
        b.backward([torch.randn(2, HIDDEN)], [torch.randn(2, HIDDEN)])
    assert all(torch.equal(a, c) for a, c in zip(held.tensors, held_values)) and held.matches(held_digest)
    for stamp, digest in zip(stamps[-2:], digests[-2:]):  # the kept ones, some written into reused memory
        kept = store.get(stamp.state)
        assert kept is not None and kept.digest() == digest
    assert store.report()["snapshots"] == 2 and store.reused >= 2


def test_a_large_state_digests_the_same_on_two_threads():
    from volunteer.experts.snapshots import PARALLEL_DIGEST, state_digest
    import hashlib

    named = [("a", torch.randn(PARALLEL_DIGEST // 4)), ("b", torch.randn(1000)), ("c", torch.randn(PARALLEL_DIGEST // 4))]
    expected = hashlib.sha256()
    for name, tensor in named:
        expected.update(name.encode() + b"\0")
        expected.update(tensor_digest([tensor]))
    assert state_digest(list(reversed(named))) == expected.digest()


def test_a_lossy_reply_one_rounding_step_off_in_a_value_passes_and_a_lie_does_not():
    from volunteer.experts.recompute import rounding_only

    keys, store, b = KeyPair.generate(), SnapshotStore(), backend()
    x = torch.randn(1, HIDDEN)  # a small reply: one tipped value weighs most
    sent = as_received([x], "blockwise8_64")
    honest = as_received(b.forward(sent), "blockwise8_64")
    tipped = honest[0].clone()
    step = float(tipped.abs().max()) / 127
    tipped[0, 3] += step  # hardware noise tipped one value over a rounding boundary
    receipt = receipt_for(keys, store, b, [x], [tipped], compression="blockwise8_64")
    snapshot = store.get(receipt.state)
    finding = Recomputer().check(receipt, keys.peer_id, snapshot.names, snapshot.tensors, [x], [tipped])
    assert finding.error > 1e-3 and finding.verdict is Verdict.PASSED, finding
    assert not rounding_only(honest, [honest[0] * 1.02])
    spread = honest[0].clone()
    spread[0, :4] += step  # four values a step off in a reply of 32: not noise
    assert not rounding_only(honest, [spread])
    assert not rounding_only(honest, [honest[0] + torch.where(torch.arange(HIDDEN) == 5, 3 * step, 0.0)])


def test_a_receipt_naming_a_state_that_cannot_compute_the_call_is_false():
    keys, store = KeyPair.generate(), SnapshotStore()
    small = make_backend("ffn.0", "ffn", 16)  # the liar signs and serves a state of another width
    x = torch.randn(4, HIDDEN)
    outputs = [torch.randn(4, HIDDEN)]
    stamp = store.note(small)
    header, chunks = serialize(outputs)
    receipt = Receipt(keys.peer_id.to_bytes(), "ffn.0", FORWARD, "ffn", 16, stamp.version, stamp.state,
                      tensor_digest([x]), payload_digest(header, list(chunks)), 4, "torch.float32", "cpu", 1,
                      "none").sign(keys)
    snapshot = store.get(stamp.state)
    finding = Recomputer().check(receipt, keys.peer_id, snapshot.names, snapshot.tensors, [x], outputs)
    assert finding.verdict is Verdict.FALSE_RECEIPT, finding


def test_a_host_named_by_its_multiaddr_is_its_peer_id():
    from volunteer.net.multiaddr import Multiaddr

    keys, store, b = KeyPair.generate(), SnapshotStore(), backend()
    x = torch.randn(2, HIDDEN)
    receipt = receipt_for(keys, store, b, [x], b.forward([x]))
    addr = Multiaddr(f"/ip4/127.0.0.1/tcp/4001/p2p/{keys.peer_id}")
    assert receipt.verify(addr) and receipt.verify(str(keys.peer_id))
    check_reply(receipt, uid="ffn.0", op="forward", outputs=receipt.outputs, peer=addr)


def test_a_background_copy_is_the_state_noted_once_writers_settle_it_first():
    store, b = SnapshotStore(background=True), backend()
    try:
        before = state_digest(list(b.module.state_dict().items()))
        first = store.note(b)  # returns at once; the copy runs on the store's thread
        store.settle_copies(b.uid)  # what a writer does first
        b.backward([torch.randn(4, HIDDEN)], [torch.randn(4, HIDDEN)])
        second = store.note(b)
        kept = store.get(first.state)  # waits for a copy still running
        assert kept is not None and kept.digest() == before and second.state != first.state
        assert store.get(second.state).digest() == state_digest(list(b.module.state_dict().items()))
        assert store.report()["torn"] == 0
    finally:
        store.close()


def test_a_write_racing_a_background_copy_drops_that_snapshot_and_the_next_note_copies_again(monkeypatch):
    import volunteer.experts.snapshots as snapshots

    store, b = SnapshotStore(background=True), backend()
    copy = snapshots._copied

    def raced(state, spare):  # a writer that did not settle the copy first writes mid-copy
        with torch.no_grad():
            next(iter(state.values())).add_(1.0)
        return copy(state, spare)

    try:
        monkeypatch.setattr(snapshots, "_copied", raced)
        torn = store.note(b)
        store.settle_copies()
        assert store.get(torn.state) is None and store.report()["torn"] == 1  # never served
        monkeypatch.setattr(snapshots, "_copied", copy)
        again = store.note(b)  # same fingerprint as before the race, but the stamp it named was dropped
        assert again.state != torn.state and store.get(again.state) is not None
    finally:
        store.close()
