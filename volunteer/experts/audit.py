"""Audits: a trainer recomputes some replies exactly, or (for hosts without receipts) sends some
of its calls to a second replica too and compares the answers.

**Exact audits** (every reply of our own swarm kind carries a signed receipt, ``receipts.py``):
an audited reply's host is asked for the snapshot of the state its receipt names
(``snapshots.py``), and the trainer recomputes the call from it (``recompute.py``): its forward
outputs, and once the trainer's backward returned, the input gradients of that backward (from the
state the backward's own receipt names). A reply the recompute contradicts is a proof: its host is
excluded at once, whatever any other replica answered; a false receipt (not the host's signature,
a served state that is not the one it names, other inputs than ours) excludes it as well. A
snapshot the host does not serve (gone, refused, timed out) fails that audit: the pair is suspect,
and ``missing_to_exclude`` of them since the peer last passed one exclude it. Nothing here counts
votes: one honest replica, or none, suffices. Which replies: at the ledger's adaptive rates
(below), and every reply the guard rejected as implausible (the guard alone never excludes a
receipted host: recompute settles it). The host sees a snapshot fetch only after its signed
reply is gone, so knowing which replies are audited does not let it answer those honestly.
A contradicted reply is also handed to ``on_proof`` (the swarm publishes it as a shared verdict,
``verdicts.py``) with its evidence: the receipt, the host's signed binding of the state's id to
its digest (checked against the state we recomputed from, on a thread, only once a proof is
found), our inputs and the reply as it travelled, which any peer checks by its own recompute (or,
served another state under that id, by the two signed digests) before it acts on it.

The comparison audit, for hosts whose replies carry no receipt (hivemind's), is the other half
of ``Auditor``: ``comparison_audits.py``.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any, Callable, MutableMapping

import torch
import trio

from ..errors import ExpertError, ExpertReplyRejected, describe
from .comparison import DEFAULT_AUDITS, AuditConfig
from .comparison_audits import Case, ComparisonAudits, ExpertCall, Opinion, Replicas
from .guard import GRADIENTS, OUTPUTS
from .receipts import Receipt, StateBinding, binds
from .recompute import Finding, Recomputer, Verdict
from .snapshots import state_digest
from .trust import TrustLedger
from .verdicts import Evidence, evidence_of, served_parts

log = logging.getLogger(__name__)


@dataclass
class AuditBudget:
    """What exact audits at the trusted floor may cost the trainer (``AuditConfig.cost_share``):
    a bucket that fills at ``share`` seconds per second of the trainer's wall time up to
    ``burst``, and that every exact audit empties by what it took (its snapshot's fetch and its
    recompute; into debt no deeper than ``burst``). A floor audit starts only while the bucket
    is not in debt. On loopback a 2 % floor costs about 1 % and never waits; over a 10 Mbit/s
    uplink a 32 MB snapshot takes 26 s, and the floor thins to what 5 % of the time pays for.
    Pure: the caller passes the time."""

    share: float
    burst: float
    balance: float = 0.0
    last: float | None = None

    def __post_init__(self) -> None:
        self.balance = self.burst

    def _fill(self, now: float) -> None:
        if self.last is not None and now > self.last:
            self.balance = min(self.burst, self.balance + (now - self.last) * self.share)
        self.last = now if self.last is None else max(self.last, now)

    def allows(self, now: float) -> bool:
        """Whether a floor audit may start now."""
        self._fill(now)
        return self.balance >= 0

    def spend(self, seconds: float, now: float) -> None:
        """An exact audit took ``seconds`` (whatever the host's standing)."""
        self._fill(now)
        self.balance = max(-self.burst, self.balance - max(0.0, seconds))


SNAPSHOTS_CACHED = 4  # fetched snapshots an auditor keeps (a forward and its backward often share one)

# fetches the snapshot a receipt names from its host: (peer, uid, state id) -> (names, tensors), or
# (names, tensors, the host's signed binding of that id to their digest: what a published proof carries)
FetchSnapshot = Callable[[Any, str, bytes], Any]


@dataclass(frozen=True)
class ProofFound:
    """What an exact audit proved, for the swarm to publish (``verdicts.VerdictWatch.publish``):
    the accused, the expert, why, and the evidence a third party checks (None: it does not fit a
    record, or the reply's encoding does not give back the bytes its receipt names)."""

    peer: str
    uid: str
    reason: str
    evidence: Evidence | None


class Auditor(ComparisonAudits):
    """A mixture's audits: started from its calls, run as background tasks on its event loop.

    ``replicas(uid)``: the (declaration, sync age) of every host of ``uid`` the mixture may call
    now; ``make_call(uid, declaration, backward_follows)``: a ``client._Call`` to it (guarded,
    so an auditor's own reply is checked too); ``stats``: the mixture's counters."""

    def __init__(
        self,
        ledger: TrustLedger,
        replicas: Replicas,
        make_call: Callable[[str, Any, bool], ExpertCall],
        stats: MutableMapping[str, int],
        *,
        config: AuditConfig = DEFAULT_AUDITS,
        compression: str = "none",
        backward_wait: float = 60.0,
        rng: random.Random | None = None,
        fetch_snapshot: FetchSnapshot | None = None,
        recomputer: Recomputer | None = None,
        missing_to_exclude: int = 3,
        on_proof: Callable[[ProofFound], None] | None = None,
    ) -> None:
        self.ledger, self.replicas, self.make_call, self.stats = ledger, replicas, make_call, stats
        self.config, self.compression, self.backward_wait = config, compression, backward_wait
        self.rng = rng or random.Random()
        self.enabled = True
        self.pending = 0
        self._rejected: dict[str, tuple[torch.Tensor, Opinion]] = {}  # this forward's rejected replies, by uid
        self.fetch_snapshot = fetch_snapshot
        self.recomputer = recomputer or Recomputer()
        self.missing_to_exclude = missing_to_exclude
        self.on_proof = on_proof  # the swarm publishes what we prove (a shared verdict)
        self._missing: dict[str, int] = {}  # peer -> snapshots it did not serve since it last passed
        self._snapshots: dict[bytes, tuple] = {}  # a few fetched snapshots by digest (most recent last)
        self.proofs: list[dict] = []  # the last proofs found (receipt, binding, inputs, recomputed), newest last
        self.budget = AuditBudget(config.cost_share, config.cost_burst)
        for key in ("audits", "disagreements", "outvoted", "exclusions", "stale", "unauditable", "audits_skipped",
                    "exact_audits", "proofs", "snapshots_missing", "false_receipts", "audits_deferred"):
            stats.setdefault(key, 0)

    # --- called by the mixture, on the event loop ------------------------------------------------
    def begin_forward(self) -> None:
        """A new forward: rejected replies of the last one can no longer meet their fail-over."""
        self._rejected.clear()

    def rejected(self, call, inputs: torch.Tensor, error: ExpertReplyRejected, receipt: Receipt | None = None) -> None:
        """The guard rejected ``call``'s finite reply: recompute it if it has a receipt, else keep
        it for the fail-over's answer."""
        if error.excluded:
            self.stats["exclusions"] += 1
        if error.outputs is None or error.excluded or not self.enabled:
            return
        first = Opinion(call.peer, self._age(call.uid, call.peer), error.outputs)
        if receipt is not None and self.fetch_snapshot is not None:
            self._start(self._exact, Case(call.uid, inputs, first, False, receipt))
            return
        self._rejected[call.uid] = (inputs, first)

    def answered(self, call, inputs: torch.Tensor, outputs: list[torch.Tensor], compression: str | None = None,
                 receipt: Receipt | None = None) -> Case | None:
        """``call`` answered ``outputs`` (past the guard; ``compression``: the encoding they
        travelled in; ``receipt``: the reply's): audit it exactly by chance if it has a receipt;
        else compare it with a reply the guard rejected for the same inputs, or audit it by
        chance. Returns the case, if any, for ``backward_sent``."""
        if not self.enabled:
            return None
        first = Opinion(call.peer, self._age(call.uid, call.peer), outputs, compression=compression)
        if receipt is not None and self.fetch_snapshot is not None:
            self._rejected.pop(call.uid, None)  # a receipted fail-over: its rejected twin is recomputed already
            if self.rng.random() >= self.ledger.audit_probability(call.uid, str(call.peer)):
                return None
            if self.ledger.at_floor(call.uid, str(call.peer)) and not self.budget.allows(trio.current_time()):
                self.stats["audits_deferred"] += 1  # the floor's audits have had their share of the time
                return None
            case = Case(call.uid, inputs, first, call.backward_follows, receipt)
            return case if self._start(self._exact, case) else None
        earlier = self._rejected.pop(call.uid, None)
        if earlier is not None and earlier[0].shape == inputs.shape and torch.equal(earlier[0], inputs):
            case = Case(call.uid, inputs, earlier[1], backward_follows=False)
            self._start(self._compare_with_fail_over, case, first)
            return None
        if self.rng.random() >= self.ledger.audit_probability(call.uid, str(call.peer)):
            return None
        case = Case(call.uid, inputs, first, call.backward_follows)
        return case if self._start(self._audit, case) else None

    def backward_sent(self, case: Case | None, grad_outputs: torch.Tensor | None, grad_inputs: torch.Tensor | None,
                      compression: str | None = None, receipt: Receipt | None = None) -> None:
        """The trainer's backward of an audited call went out (``grad_outputs`` None: it had
        none); ``grad_inputs``: what the audited host answered (None if it failed), in
        ``compression``, with ``receipt``."""
        if case is None:
            return
        case.grad_outputs = grad_outputs
        case.grad_receipt = receipt
        if grad_inputs is not None:
            case.first.grads = [grad_inputs]
            case.first.travelled(compression)
        case.backward_done.set()

    # --- background tasks ---------------------------------------------------------------------
    def _start(self, fn, *args) -> bool:
        if self.pending >= self.config.max_pending:
            self.stats["audits_skipped"] += 1
            return False
        self.pending += 1
        trio.lowlevel.spawn_system_task(self._run, fn, args)
        return True

    async def _run(self, fn, args) -> None:
        try:
            await fn(*args)
        except Exception:  # a bug in an audit must not reach the event loop, nor pass unseen
            log.exception("an audit of %s failed", args[0].uid)
        finally:
            self.pending -= 1

    async def _exact(self, case: Case) -> None:
        """Recompute an audited reply from the state its receipt names; then, once the trainer's
        backward of it returned, that backward's input gradients (see the module docstring)."""
        assert case.receipt is not None
        first = case.first
        verdict = await self._recompute(case.uid, first.peer, case.receipt, [case.inputs], first.outputs, OUTPUTS)
        if verdict is not Verdict.PASSED or not case.backward_follows:
            return
        with trio.move_on_after(self.backward_wait):
            await case.backward_done.wait()
        if case.grad_outputs is None or case.grad_receipt is None or first.grads is None:
            return  # no backward ran, or it failed: nothing to check
        await self._recompute(case.uid, first.peer, case.grad_receipt, [case.inputs], first.grads, GRADIENTS,
                              grad_outputs=[case.grad_outputs], input_compression=case.receipt.compression)

    async def _recompute(self, uid: str, peer, receipt: Receipt, inputs, replied, kind: str, *,
                         grad_outputs=None, input_compression: str | None = None) -> Verdict | None:
        """One exact audit: fetch the snapshot, recompute, act on the finding. None: the snapshot
        did not come (counted against the host)."""
        assert self.fetch_snapshot is not None
        name = str(peer)
        if self.ledger.excluded(name):
            return None
        self.stats["audits"] += 1
        self.stats["exact_audits"] += 1
        began = trio.current_time()
        snapshot = self._snapshots.get(receipt.state)
        if snapshot is None:
            try:
                snapshot = await self.fetch_snapshot(peer, uid, receipt.state)
            except ExpertError as exc:
                self.budget.spend(trio.current_time() - began, trio.current_time())
                self._snapshot_missing(uid, peer, receipt, describe(exc))
                return None
            self._snapshots[receipt.state] = snapshot
            while len(self._snapshots) > SNAPSHOTS_CACHED:
                del self._snapshots[next(iter(self._snapshots))]
        names, tensors, binding = served_parts(snapshot)
        finding: Finding = await trio.to_thread.run_sync(
            self.recomputer.check, receipt, peer, names, tensors, inputs, replied, grad_outputs, input_compression)
        self.budget.spend(trio.current_time() - began, trio.current_time())
        if finding.verdict is Verdict.PASSED:
            self._missing.pop(name, None)
            self.ledger.passed(uid, name, exact=True)
            return finding.verdict
        if finding.verdict is Verdict.CONTRADICTED and binding is not None and not await self._signed(
                receipt, binding, names, tensors):
            finding = Finding(Verdict.FALSE_RECEIPT, finding.error, "the state it served is not the one it signed for "
                                                                    "that id", finding.recomputed)
        if finding.verdict is Verdict.FALSE_RECEIPT:
            self.stats["false_receipts"] += 1
            reason = f"its {kind} of expert {uid} came with a false receipt: {finding.detail}"
        else:
            reason = f"its {kind} of expert {uid} were contradicted by recompute: {finding.detail}"
        self._snapshots.pop(receipt.state, None)
        self._prove(uid, peer, receipt, reason, finding, inputs, grad_outputs, binding)
        if finding.verdict is Verdict.CONTRADICTED and self.on_proof is not None:
            # a false receipt convinces only us (it may name other inputs than ours); a contradicted
            # reply convinces anyone who recomputes it while the host keeps the state it signed, and
            # its binding, whose digest we checked, shows anyone served another state for that id
            # that the host signed two
            evidence = evidence_of(receipt, inputs, replied, grad_outputs, input_compression, binding=binding)
            self.on_proof(ProofFound(str(peer), uid, reason, evidence))
        return finding.verdict

    @staticmethod
    async def _signed(receipt: Receipt, binding: StateBinding, names, tensors) -> bool:
        """Whether the state we recomputed from is the one the host signed for the receipt's id:
        hashed (on a thread) only once it contradicted a reply, so audits that pass stay cheap."""
        if not binds(binding, receipt):
            return False
        return await trio.to_thread.run_sync(state_digest, list(zip(names, tensors))) == binding.digest

    def _snapshot_missing(self, uid: str, peer, receipt: Receipt, why: str) -> None:
        """The host did not serve the state a receipt of its named: a failed audit for that reply;
        ``missing_to_exclude`` since it last passed one exclude it."""
        name = str(peer)
        self.stats["snapshots_missing"] += 1
        self.ledger.disagreed(uid, name)
        count = self._missing[name] = self._missing.get(name, 0) + 1
        while len(self._missing) > 4096:
            del self._missing[next(iter(self._missing))]
        log.info("audit of %s: %s did not serve the state its receipt names (version %d): %s (%d in a row)",
                 uid, peer, receipt.version, why, count)
        if count >= self.missing_to_exclude and self.ledger.exclude(
                name, f"it did not serve the states {count} of its receipts for expert {uid} named (last: {why})"):
            self.stats["exclusions"] += 1
            log.warning("excluding volunteer %s: it did not serve the states %d of its receipts named", peer, count)

    def _prove(self, uid: str, peer, receipt: Receipt, reason: str, finding: Finding, inputs, grad_outputs,
               binding: StateBinding | None = None) -> None:
        """A proof against ``peer``: excluded on it, whoever else agreed with its reply."""
        self.stats["proofs"] += 1
        self.proofs.append({"peer": str(peer), "uid": uid, "reason": reason, "receipt": receipt.encode(),
                            "binding": binding,
                            "inputs": [t.detach().clone() for t in inputs],
                            "grad_outputs": [t.detach().clone() for t in grad_outputs] if grad_outputs else None,
                            "recomputed": list(finding.recomputed)})
        del self.proofs[:-16]
        if self.ledger.exclude(str(peer), reason, proof=True):
            self.stats["exclusions"] += 1
            log.warning("excluding volunteer %s: %s", peer, reason)

__all__ = ["Auditor", "Case", "Opinion", "ProofFound"]
