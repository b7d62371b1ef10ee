"""A proof carries the state binding its auditor was served (the host's signed word: this id is
that digest), so a host cannot equivocate: serve its auditor the state it computed from, then
every checker of the published proof another state under the same id, made to reproduce the lie.
Two digests signed for one id prove it lied by signatures alone; a binding that is not the
accused's, or names another state, makes an accusation change nothing; evidence from before
bindings were carried is still checked by recompute."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import torch
import trio

from volunteer.dht.verdicts import Accusation
from volunteer.experts.receipts import StateBinding
from volunteer.experts.recompute import Recomputer, Verdict
from volunteer.experts.snapshots import state_digest
from volunteer.experts.verdicts import Evidence, check_accusation, evidence_of
from volunteer.net.identity import KeyPair

from .test_verdicts import HIDDEN, SWARM, Liar, _Always, _Call

UID = "ffn.0.0"


class BindingLiar(Liar):
    """A ``Liar`` whose snapshots come with its signed binding, as a real host's do; with
    ``equivocate``, every fetch after the first serves, under the same id, the state with its
    output norm's affine scaled by the lie's factor (which reproduces every scaled reply) and a
    binding signed for that state."""

    def __init__(self, scale: float = 1.02, *, equivocate: bool = False) -> None:
        super().__init__(scale)
        self.equivocate = equivocate
        self.fetches = 0

    def binding(self, state: bytes, names, tensors, version: int | None = None) -> StateBinding:
        snapshot = self.store.get(state)
        assert snapshot is not None
        return StateBinding(self.keys.peer_id.to_bytes(), snapshot.uid, state,
                            snapshot.version if version is None else version,
                            state_digest(list(zip(names, tensors)))).sign(self.keys)

    def made_up(self, state: bytes) -> list[torch.Tensor]:
        """The state that reproduces the lie: the kept one with the output norm's affine scaled."""
        snapshot = self.store.get(state)
        assert snapshot is not None
        return [t * self.scale if name.startswith("norm.") else t.clone()
                for name, t in zip(snapshot.names, snapshot.tensors)]

    async def fetch(self, peer, uid, state):
        names, tensors = await super().fetch(peer, uid, state)
        self.fetches += 1
        if self.equivocate and self.fetches > 1:
            tensors = self.made_up(state)
        return names, tensors, self.binding(state, names, tensors)


def accuse(accuser: KeyPair, host: Liar, evidence: Evidence) -> Accusation:
    return Accusation(SWARM, accuser.peer_id.to_bytes(), host.keys.peer_id.to_bytes(), UID, 1.0,
                      evidence.encode()).sign(accuser)


def check(accusation: Accusation, host: Liar):
    return trio.run(check_accusation, accusation, host.fetch, Recomputer())


async def audit(host: BindingLiar, x: torch.Tensor) -> tuple[list, dict, list]:
    """One exact audit of ``host``'s forward of ``x``: the proofs handed on, the stats, and the
    auditor's own proofs."""
    from volunteer.experts.audit import Auditor
    from volunteer.experts.trust import TrustLedger

    found: list = []
    stats: dict = {}
    auditor = Auditor(TrustLedger(), lambda uid: [], lambda *a: None, stats, rng=_Always(), fetch_snapshot=host.fetch,
                      on_proof=found.append)
    told, receipt = host.forward(x)
    auditor.answered(_Call(UID, host.keys.peer_id), x, told, receipt=receipt)
    with trio.fail_after(30):
        while auditor.pending:
            await trio.sleep(0.01)
    return found, stats, auditor.proofs


def test_a_host_that_serves_checkers_another_state_under_the_audited_id_is_proven_by_its_two_signatures():
    liar, trainer = BindingLiar(1.02, equivocate=True), KeyPair.generate()
    x = torch.randn(4, HIDDEN)
    (proof,), _, (kept,) = trio.run(audit, liar, x)  # the auditor's fetch: the state the liar computed from
    evidence = proof.evidence
    assert evidence is not None and evidence.binding is not None and kept["binding"] == evidence.binding
    accusation = Accusation.decode(accuse(trainer, liar, evidence).encode())
    assert Evidence.decode(accusation.evidence).binding == evidence.binding  # travels with the proof

    # the attack: the state a checker is now served reproduces the lie
    names, tensors, binding = trio.run(liar.fetch, liar.keys.peer_id, UID, evidence.receipt.state)
    assert binding.verify(liar.keys.peer_id) and binding.digest != evidence.binding.digest
    finding = Recomputer().check(evidence.receipt, liar.keys.peer_id, names, tensors, evidence.inputs,
                                 evidence.replied())
    assert finding.verdict is Verdict.PASSED, finding

    checked = check(accusation, liar)
    assert checked.proven and checked.final, checked
    assert "signed two states for one id" in checked.detail, checked


def test_an_auditor_served_a_state_that_is_not_the_one_signed_publishes_nothing_and_excludes_the_host():
    liar = BindingLiar(1.02)
    signed = liar.fetch

    async def mismatched(peer, uid, state):  # tensors that are not those its binding names
        names, tensors, binding = await signed(peer, uid, state)
        return names, [t + 0.5 for t in tensors], binding

    liar.fetch = mismatched  # type: ignore[method-assign]
    found, stats, (kept,) = trio.run(audit, liar, torch.randn(4, HIDDEN))
    assert found == [] and stats["false_receipts"] == 1, stats
    assert "not the one it signed" in kept["reason"], kept


def test_an_honest_host_accused_with_a_forged_binding_or_one_for_another_state_is_not_proven():
    honest, trainer = BindingLiar(1.0), KeyPair.generate()
    x = torch.randn(4, HIDDEN)
    told, receipt = honest.forward(x)
    kept = honest.store.get(receipt.state)
    assert kept is not None
    fake = [t + 1.0 for t in kept.tensors]
    forged = [
        # a digest of another state, signed by the accuser in the host's name
        replace(StateBinding(honest.keys.peer_id.to_bytes(), UID, receipt.state, receipt.version,
                             state_digest(list(zip(kept.names, fake)))).sign(trainer),
                peer=honest.keys.peer_id.to_bytes()),
        # the accuser's own binding
        StateBinding(trainer.peer_id.to_bytes(), UID, receipt.state, receipt.version,
                     state_digest(list(zip(kept.names, fake)))).sign(trainer),
        # the host's genuine signature, for another version of that id
        honest.binding(receipt.state, kept.names, fake, version=receipt.version + 1),
    ]
    for binding in forged:
        evidence = evidence_of(receipt, [x], told, binding=binding)
        assert evidence is not None
        checked = check(accuse(trainer, honest, evidence), honest)
        assert not checked.proven and "binding is not one the accused signed" in checked.detail, checked

    # the host's genuine binding of another of its states (a later version), under this receipt's id
    honest.backend.module.norm.weight.data.mul_(1.5)
    honest.backend.updates += 1
    later_told, later = honest.forward(x)
    assert later.state != receipt.state
    snapshot = honest.store.get(later.state)
    assert snapshot is not None
    other = honest.binding(later.state, snapshot.names, snapshot.tensors)
    checked = check(accuse(trainer, honest, evidence_of(receipt, [x], told, binding=other)), honest)
    assert not checked.proven and "binding is not one the accused signed" in checked.detail, checked

    # and its true binding: a recompute reproduces the reply
    genuine = honest.binding(receipt.state, kept.names, kept.tensors)
    checked = check(accuse(trainer, honest, evidence_of(receipt, [x], told, binding=genuine)), honest)
    assert not checked.proven and "reproduces" in checked.detail, checked


def test_evidence_from_before_bindings_is_still_checked_by_recompute():
    liar, trainer = BindingLiar(1.02), KeyPair.generate()
    x = torch.randn(4, HIDDEN)
    told, receipt = liar.forward(x)
    evidence = evidence_of(receipt, [x], told)
    assert evidence is not None and evidence.binding is None
    fields = msgpack.unpackb(evidence.encode(), raw=False)
    assert len(fields) == 6  # the old encoding, read as before
    assert Evidence.decode(evidence.encode()).binding is None
    checked = check(accuse(trainer, liar, evidence), liar)  # the host serves its binding: not needed to recompute
    assert checked.proven and "differ from a recompute" in checked.detail, checked
    # a recompute alone is all such evidence gives: a state made up to reproduce the lie passes it
    liar.equivocate = True
    checked = check(accuse(trainer, liar, evidence), liar)
    assert not checked.proven and "reproduces" in checked.detail, checked


def test_a_checker_served_under_the_signed_binding_a_state_it_does_not_name_cannot_check_it_yet():
    liar, trainer = BindingLiar(1.02), KeyPair.generate()
    x = torch.randn(4, HIDDEN)
    told, receipt = liar.forward(x)
    kept = liar.store.get(receipt.state)
    assert kept is not None
    binding = liar.binding(receipt.state, kept.names, kept.tensors)
    evidence = evidence_of(receipt, [x], told, binding=binding)
    assert evidence is not None

    async def made_up_under_the_true_binding(peer, uid, state):
        return kept.names, liar.made_up(state), binding

    checked = trio.run(check_accusation, accuse(trainer, liar, evidence), made_up_under_the_true_binding, Recomputer())
    assert not checked.proven and not checked.final and "not the one it signed" in checked.detail, checked
