"""Shared verdicts on real volunteers (in-process, loopback): a trainer that proved a liar publishes
the proof, and another trainer that never called the liar checks it by recompute and refuses the
liar too, with evidence that fits one record or (wide experts) in pieces, or by the two digests the
liar signed for one id when it serves checkers another state than its auditor; an accusation against an
honest host, stored as the real thing would be, or a liar's true proof whose pieces are missing or
altered, changes nothing for anyone."""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

import pytest
import torch

from volunteer import RemoteMixtureOfExperts, Swarm
from volunteer.dht.verdicts import (
    MAX_EVIDENCE, Accusation, EvidenceRef, accusation_items, chunk_items, proof_key, split_evidence,
)
from volunteer.experts.callstats import CallReport
from volunteer.experts.verdicts import evidence_of
from volunteer.net.identity import PeerID

from .test_exact_audits import World, modules, times
from .test_moe_audits import DHT, HIDDEN, grid

WIDE = 64  # the digits run's width: a call of 32 rows is ~4 K float32 each way, evidence in pieces
WAIT = 60.0  # seconds a second trainer has to read and check a proof (its watcher reads every 10 s)


def wait_for(condition, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_trainer_that_never_called_a_liar_refuses_it_once_another_published_a_proof():
    world = World(1, [modules(times(1.02))])
    second = None
    try:
        liar, honest = world.liars[0].peer, world.honest[0].peer
        world.train_until(lambda: world.moe.trust.excluded(liar), steps=400)
        world.settle()
        assert world.swarm.trust_report()[liar]["excluded_on_proof"]
        wait_for(lambda: world.swarm.verdict_report()["published"] >= 1, "the proof to be published", 20)

        second = Swarm.join(world.honest[0].spec(), dht_config=DHT)
        moe = RemoteMixtureOfExperts(second, in_features=HIDDEN, grid=grid(2), k_best=2)
        # it never calls the liar (its watcher may read and check the proof before this line: no
        # check of the report here races it; ``replies == 0`` below says it never called it)
        wait_for(lambda: second.trust_report().get(liar, {}).get("standing") == "excluded", "the proof to be checked")
        row = second.trust_report()[liar]
        assert row["excluded_on_proof"] and row["replies"] == 0, row
        assert row["excluded_because"].startswith(f"proof published by {world.swarm.host.peer_id}"), row
        assert row["proof"]["by"] == str(world.swarm.host.peer_id) and "recompute" in row["proof"]["reason"]
        assert second.verdict_report()["checks"] >= 1 and liar in second.verdict_report()["excluded"]
        # its mixture never picks the liar now, for any expert
        assert all(moe.trust.pick_weight(uid, liar) == 0.0 for uid in world.moe.live_experts())
        assert second.trust_report().get(honest, {}).get("standing") != "excluded"
    finally:
        if second is not None:
            second.close()
        world.close()


def equivocate(liar, factor: float) -> None:
    """From now on ``liar`` serves, under every kept state's id, that state with its output norm's
    affine scaled by ``factor`` (which reproduces each reply it scaled by ``factor``), and signs
    a binding of the id to that state's digest: two states signed for one id."""
    store = liar.runtime.snapshots
    kept = store.get

    def made_up(state: bytes):
        snapshot = kept(state)
        if snapshot is None:
            return None
        tensors = [t * factor if name.startswith("norm.") else t for name, t in zip(snapshot.names, snapshot.tensors)]
        return replace(snapshot, tensors=tensors, _digest=None, on_digest=None)

    store.get = made_up


@pytest.mark.slow
def test_a_liar_that_serves_checkers_another_state_under_the_audited_id_is_still_refused_by_a_trainer_that_never_called_it():
    world = World(1, [modules(times(1.02))])
    second = None
    try:
        liar = world.liars[0].peer
        world.train_until(lambda: world.moe.trust.excluded(liar), steps=400)
        world.settle()
        wait_for(lambda: world.swarm.verdict_report()["published"] >= 1, "the proof to be published", 20)
        proof = world.moe._auditor.proofs[-1]
        assert proof["peer"] == liar and proof["binding"] is not None and proof["binding"].verify(liar), proof
        equivocate(world.liars[0], 1.02)

        second = Swarm.join(world.honest[0].spec(), dht_config=DHT)
        moe = RemoteMixtureOfExperts(second, in_features=HIDDEN, grid=grid(2), k_best=2)
        # it never calls the liar (its watcher may read and check the proof before this line: no
        # check of the report here races it; ``replies == 0`` below says it never called it)
        wait_for(lambda: second.trust_report().get(liar, {}).get("standing") == "excluded", "the proof to be checked")
        row = second.trust_report()[liar]
        assert row["excluded_on_proof"] and row["replies"] == 0, row
        assert "signed two states for one id" in row["proof"]["reason"], row
        assert "signed two states for one id" in second.verdict_report()["excluded"][liar]["reason"]
        assert all(moe.trust.pick_weight(uid, liar) == 0.0 for uid in world.moe.live_experts())
        assert second.trust_report().get(world.honest[0].peer, {}).get("standing") != "excluded"
    finally:
        if second is not None:
            second.close()
        world.close()


@pytest.mark.slow
def test_a_forged_accusation_against_an_honest_host_excludes_nobody():
    world = World(2, [])
    forger = None
    try:
        honest = world.honest[0].peer
        forger = Swarm.join(world.honest[0].spec(), dht_config=DHT)
        uid = sorted(world.moe.live_experts())[0]
        x = torch.randn(4, HIDDEN)
        report = CallReport()
        outputs = forger.loop.run(partial(forger.directory.call_expert, PeerID.from_string(honest), uid, "forward", [x],
                                          report=report))
        assert report.receipt is not None
        # a genuine receipt and the genuine reply, accused anyway; and the same receipt with a lie
        # put in place of the reply it names
        evidences = [evidence_of(report.receipt, [x], outputs)]
        assert evidences[0] is not None
        lie = evidence_of(report.receipt, [x], [o * 1.5 for o in outputs])
        assert lie is None  # the lie is not what the receipt names: it cannot even be built as evidence
        accusation = Accusation(forger.spec.id, forger.keypair.peer_id.to_bytes(), PeerID.from_string(honest).to_bytes(),
                                uid, time.time(), evidences[0].encode()).sign(forger.keypair)
        forger.loop.run(forger.dht.store_many, accusation_items(accusation, time.time() + 600))

        watch = world.swarm.verdicts
        assert watch is not None
        wait_for(lambda: world.swarm.verdict_report()["checks"] >= 1, "the accusation to be checked")
        assert world.swarm.verdict_report()["refused"].get("not_proven", 0) >= 1, world.swarm.verdict_report()
        assert world.swarm.verdict_report()["excluded"] == {}
        world.train_until(lambda: False, steps=5)
        assert world.swarm.trust_report().get(honest, {}).get("standing") != "excluded"
    finally:
        if forger is not None:
            forger.close()
        world.close()


def stored_accusations(swarm: Swarm, accused: str) -> list[Accusation]:
    records = swarm.loop.run(swarm.dht.get, proof_key(PeerID.from_string(accused).to_bytes()))
    return [Accusation.decode(record.value) for record in records.values() if record.value is not None]


def call_liar(world: World, caller: Swarm, rows: int = 32):
    """A forward of ``rows`` rows by ``caller`` to the liar: the expert, inputs, reply and its
    evidence (a true proof: the liar signed a reply scaled x1.02)."""
    liar = world.liars[0].peer
    uid = sorted(world.moe.live_experts())[0]
    x = torch.randn(rows, WIDE)
    report = CallReport()
    told = caller.loop.run(partial(caller.directory.call_expert, PeerID.from_string(liar), uid, "forward", [x],
                                   report=report))
    assert report.receipt is not None
    evidence = evidence_of(report.receipt, [x], told)
    assert evidence is not None
    return uid, evidence


@pytest.mark.slow
def test_a_wide_experts_proof_is_published_in_pieces_and_a_trainer_that_never_called_the_liar_refuses_it():
    # the proof of a forward of 32 rows at width 64 (the digits run's ffn): ~4 K float32 each way,
    # which no single DHT record holds
    world = World(1, [modules(times(1.02))], hidden=WIDE)
    accuser = None
    try:
        liar = world.liars[0].peer
        accuser = Swarm.join(world.honest[0].spec(), dht_config=DHT)
        uid, evidence = call_liar(world, accuser)
        assert accuser.verdicts is not None
        assert accuser.loop.run(accuser.verdicts.publish, liar, uid, evidence, "contradicted by recompute")
        assert accuser.verdict_report()["published"] == 1 and accuser.verdict_report()["unpublished"] == 0
        (accusation,) = stored_accusations(accuser, liar)
        assert isinstance(accusation.evidence, EvidenceRef) and accusation.evidence.chunks >= 2

        assert liar not in world.swarm.trust_report()  # the trainer never called it
        wait_for(lambda: world.swarm.trust_report().get(liar, {}).get("standing") == "excluded", "the proof to be checked")
        row = world.swarm.trust_report()[liar]
        assert row["excluded_on_proof"] and row["replies"] == 0, row
        assert row["excluded_because"].startswith(f"proof published by {accuser.host.peer_id}"), row
        assert "recompute" in row["proof"]["reason"], row
        assert all(world.moe.trust.pick_weight(uid, liar) == 0.0 for uid in world.moe.live_experts())
        assert world.swarm.trust_report().get(world.honest[0].peer, {}).get("standing") != "excluded"
    finally:
        if accuser is not None:
            accuser.close()
        world.close()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["missing", "altered"])
def test_a_liars_true_proof_whose_pieces_are_missing_or_altered_excludes_nobody(damage):
    world = World(1, [modules(times(1.02))], hidden=WIDE)
    accuser = None
    try:
        liar = world.liars[0].peer
        accuser = Swarm.join(world.honest[0].spec(), dht_config=DHT)
        uid, evidence = call_liar(world, accuser)  # the liar's signed lie: a true proof
        encoded = evidence.encode()
        assert len(encoded) > MAX_EVIDENCE
        ref, pieces = split_evidence(encoded)
        expiration = time.time() + 600
        items = chunk_items(ref, pieces, accuser.keypair.peer_id.to_bytes(), expiration)
        if damage == "missing":
            items = items[1:]
        else:
            key, subkey, piece, _ = items[0]
            items[0] = (key, subkey, bytes([piece[0] ^ 1]) + piece[1:], expiration)
        accusation = Accusation(accuser.spec.id, accuser.keypair.peer_id.to_bytes(), PeerID.from_string(liar).to_bytes(),
                                uid, time.time(), ref).sign(accuser.keypair)
        accuser.loop.run(accuser.dht.store_many, [*items, *accusation_items(accusation, expiration)])

        # the trainer never called the liar; it reads the accusation and cannot assemble its evidence
        wait_for(lambda: world.swarm.verdict_report()["refused"].get("evidence_unread", 0) >= 1,
                 "the accusation to be read")
        report_ = world.swarm.verdict_report()
        assert report_["excluded"] == {} and report_["checks"] >= 1, report_
        assert world.swarm.trust_report().get(liar, {}).get("standing") != "excluded"
    finally:
        if accuser is not None:
            accuser.close()
        world.close()
