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

What follows is the comparison audit, for hosts whose replies carry no receipt (hivemind's).

Which calls: each answered call of a host is audited with the probability its standing gives
(``trust.TrustLedger.audit_probability``: high for a host not yet trusted, then 1/streak, never
below the policy's ``audit_rate``), and every call the guard rejected as implausible is compared
with the answer its fail-over got from another replica for the same inputs (no extra call).

What a volunteer sees of an audit: an ordinary call from the same trainer, with the same inputs
and shape as work, sent in the same round as the call it checks (no odd timing), saying that a
backward follows exactly when the audited call did, and followed by that backward with the same
output gradients (so no audit is a forward whose backward never comes; the auditor's expert takes
the step a replica would have taken for that work). The protocol carries no audit flag. Only a
third opinion on outputs, asked after a disagreement, is a lone forward, as evaluation calls are.

How answers compare is the pure half, ``comparison.py``: two replies differ by a direction gap
and a scale ratio, each with a tolerance that honest replicas' drift sets; a disagreement makes
both suspect, and a third replica decides (``judge``): the one the two others outvoted is not
called for that expert again, and a peer outvoted on ``outvotes_to_exclude`` (2) different experts
is excluded for this trainer (one outvote is not enough: an honest replica whose syncs fail for a
while drifts off, but on one expert at a time; a liar lies on all it serves). With no third
replica both stay suspect (down-weighted, audited at ``suspect_rate``) until an audit passes.

A sync age is a claim too, and declaring none must not buy a host freedom from audits. A host
that claims no recent sync (none, or older than ``max_sync_age / 2``) is compared *loosely* with
hosts that claim one: at ``max_tolerance`` and ``max_scale``, what honest replicas never reach
within a minute of a sync, which a gross lie (zeros, x10, a made-up reply) exceeds. Such a host cannot be told
from an honest replica whose rounds keep failing, so when two aligned replicas outvote it, it is
not excluded but **stale** for that expert: not called for it until it declares a recent sync
again (and is then audited strictly). Hosts that claim no sync judge nobody: a loose
comparison's second and third opinions claim one, and a host that claims a sync is compared only
strictly. Hosts of which none claims a sync (hivemind's, which never average) are not compared.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any, Callable, MutableMapping, Protocol, Sequence

import torch
import trio

from ..errors import ExpertError, ExpertReplyRejected, describe
from .callstats import CallReport
from .comparison import (
    DEFAULT_AUDITS, AuditConfig, Gap, Outcome, aligned, compare, judge, loose_tolerance, lossier, tolerance,
)
from .guard import GRADIENTS, OUTPUTS
from .receipts import Receipt, StateBinding, binds
from .recompute import Finding, Recomputer, Verdict
from .snapshots import state_digest
from .trust import TrustLedger
from .verdicts import Evidence, evidence_of, served_parts

log = logging.getLogger(__name__)


@dataclass
class Opinion:
    """One host's answer to the audited inputs, with its declared sync age (slack included)."""

    peer: object
    age: float | None
    outputs: list[torch.Tensor]
    grads: list[torch.Tensor] | None = None  # its input gradients, once a backward ran
    # the lossiest encoding its tensors travelled in (None: unknown, the mixture's setting counts)
    compression: str | None = None

    def travelled(self, compression: str | None) -> None:
        """Its answer (or its gradients) crossed the wire in ``compression`` too."""
        self.compression = lossier(self.compression, compression)


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


class Case:
    """One audited call: the inputs, the first answer, and (once the trainer's backward ran) the
    output gradients it sent and the input gradients it got back."""

    def __init__(self, uid: str, inputs: torch.Tensor, first: Opinion, backward_follows: bool,
                 receipt: Receipt | None = None) -> None:
        self.uid, self.inputs, self.first, self.backward_follows = uid, inputs, first, backward_follows
        self.grad_outputs: torch.Tensor | None = None
        self.backward_done = trio.Event()
        self.receipt = receipt  # the forward reply's receipt (an exact audit)
        self.grad_receipt: Receipt | None = None  # the backward reply's


SNAPSHOTS_CACHED = 4  # fetched snapshots an auditor keeps (a forward and its backward often share one)

# fetches the snapshot a receipt names from its host: (peer, uid, state id) -> (names, tensors), or
# (names, tensors, the host's signed binding of that id to their digest: what a published proof carries)
FetchSnapshot = Callable[[Any, str, bytes], Any]


class Declared(Protocol):
    """What an audit reads of a host's declaration."""

    @property
    def peer(self) -> Any: ...


class ExpertCall(Protocol):
    """A call to one host of one expert (``client._Call``)."""

    async def forward(self, inputs: Sequence[torch.Tensor], report: CallReport | None = None) -> list[torch.Tensor]: ...

    async def backward(
        self, inputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], kept: int | None = None,
        report: CallReport | None = None,
    ) -> list[torch.Tensor]: ...


Replicas = Callable[[str], Sequence[tuple[Declared, float | None]]]  # uid -> (declaration, sync age) of usable hosts


@dataclass(frozen=True)
class ProofFound:
    """What an exact audit proved, for the swarm to publish (``verdicts.VerdictWatch.publish``):
    the accused, the expert, why, and the evidence a third party checks (None: it does not fit a
    record, or the reply's encoding does not give back the bytes its receipt names)."""

    peer: str
    uid: str
    reason: str
    evidence: Evidence | None


class Auditor:
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

    async def _audit(self, case: Case) -> None:
        first = case.first
        chosen = self._other(case.uid, {str(first.peer)}, [first])
        if chosen is None:
            self.stats["unauditable"] += 1
            return
        decl, age = chosen
        call = self.make_call(case.uid, decl, case.backward_follows)
        report = CallReport()  # keeps the key of the inputs the auditor's host kept for the backward
        try:
            outputs = await call.forward([case.inputs], report)
        except ExpertError as exc:  # the auditor failed (the guard counted a bad reply): no verdict
            log.debug("audit call to %s for %s failed: %s", decl.peer, case.uid, describe(exc))
            self._count_exclusion(exc)
            return
        second = Opinion(decl.peer, age, outputs, compression=report.compression)
        outcome = await self._settle(case, first, second, OUTPUTS)
        if not case.backward_follows or self.ledger.pick_weight(case.uid, str(second.peer)) <= 0.0:
            return  # excluded, or no longer called for this expert: its training step is not ours to drive
        with trio.move_on_after(self.backward_wait):
            await case.backward_done.wait()
        if case.grad_outputs is None:
            return  # the trainer ran no backward for this call: neither does the auditor
        try:
            back = CallReport()
            second.grads = await call.backward([case.inputs], [case.grad_outputs], report.kept, back)
            second.travelled(back.compression)
        except ExpertError as exc:
            log.debug("audit backward to %s for %s failed: %s", decl.peer, case.uid, describe(exc))
            self._count_exclusion(exc)
            return
        if outcome is Outcome.AGREE and first.grads is not None and not self.ledger.excluded(str(first.peer)):
            await self._settle(case, first, second, GRADIENTS)

    async def _compare_with_fail_over(self, case: Case, second: Opinion) -> None:
        await self._settle(case, case.first, second, OUTPUTS)

    async def _settle(self, case: Case, first: Opinion, second: Opinion, kind: str) -> Outcome | None:
        """Compare two answers (outputs or input gradients); on a disagreement ask a third
        replica and act on the verdict. None when the two cannot be compared."""
        gap = self._gap(first, second, kind)
        if gap is None:
            self.stats["unauditable"] += 1
            return None
        self.stats["audits"] += 1
        if gap.loose:
            return await self._settle_loosely(case, first, second, kind, gap)
        uid, ledger = case.uid, self.ledger
        if gap.agree:
            ledger.passed(uid, str(first.peer))
            ledger.passed(uid, str(second.peer))
            return Outcome.AGREE
        self.stats["disagreements"] += 1
        ledger.disagreed(uid, str(first.peer))
        ledger.disagreed(uid, str(second.peer))
        log.info("audit of %s: %s of %s and %s differ: %s: asking a third replica", uid, kind, first.peer, second.peer, gap)
        third = await self._third_opinion(case, first, second, kind)
        if third is None:
            log.info("audit of %s: no third replica to decide between %s and %s: both stay suspect",
                     uid, first.peer, second.peer)
            return Outcome.UNDECIDED
        first_third, second_third = self._gap(first, third, kind), self._gap(second, third, kind)
        outcome = judge(gap, first_third, second_third)
        if outcome in (Outcome.FIRST_WRONG, Outcome.SECOND_WRONG):
            wrong, right = (first, second) if outcome is Outcome.FIRST_WRONG else (second, first)
            off = first_third if outcome is Outcome.FIRST_WRONG else second_third
            assert off is not None
            self._outvoted(uid, wrong.peer, f"its {kind} of expert {uid} differed from those of {right.peer} and "
                                            f"{third.peer} ({gap.difference} and {off.difference}; at most {gap.allowed}), "
                                            "which agreed")
            ledger.passed(uid, str(right.peer))
            ledger.passed(uid, str(third.peer))
        else:
            log.info("audit of %s: the third replica %s did not settle it: %s and %s stay suspect",
                     uid, third.peer, first.peer, second.peer)
        return outcome

    async def _settle_loosely(self, case: Case, first: Opinion, second: Opinion, kind: str, gap: Gap) -> Outcome:
        """``_settle`` where one side claims no recent sync: an agreement proves nothing (the
        tolerance is the largest honest drift); a disagreement asks a third replica that claims a
        sync, and the side outvoted is stale for this expert if it claims none, else suspect;
        undecided, both are suspect."""
        if gap.agree:
            return Outcome.AGREE
        uid, ledger = case.uid, self.ledger
        self.stats["disagreements"] += 1
        log.info("audit of %s: %s of %s and %s differ: %s, %s claims no recent sync: asking a third replica",
                 uid, kind, first.peer, second.peer, gap,
                 first.peer if not aligned(self.config, first.age) else second.peer)
        third = await self._third_opinion(case, first, second, kind)
        first_third = second_third = None
        if third is not None:
            first_third, second_third = self._gap(first, third, kind), self._gap(second, third, kind)
        outcome = judge(gap, first_third, second_third)
        if outcome not in (Outcome.FIRST_WRONG, Outcome.SECOND_WRONG):
            # undecided: both suspect, as in a strict comparison (the side that claims a sync may
            # be the liar, the other an honest replica whose first round has not merged yet)
            ledger.disagreed(uid, str(first.peer))
            ledger.disagreed(uid, str(second.peer))
            return outcome
        assert third is not None
        wrong, right = (first, second) if outcome is Outcome.FIRST_WRONG else (second, first)
        if aligned(self.config, wrong.age):
            ledger.disagreed(uid, str(wrong.peer))
        elif ledger.stale(uid, str(wrong.peer)):
            self.stats["stale"] += 1
            log.warning("not calling %s for expert %s: it claims no recent sync and its %s differ from those of "
                        "%s and %s by more than replicas drift apart (%s)",
                        wrong.peer, uid, kind, right.peer, third.peer, gap)
        return outcome

    async def _third_opinion(self, case: Case, first: Opinion, second: Opinion, kind: str) -> Opinion | None:
        """The same inputs (and, for gradients, the same output gradients) to a third replica."""
        chosen = self._other(case.uid, {str(first.peer), str(second.peer)}, [first, second])
        if chosen is None:
            return None
        decl, age = chosen
        grad_outputs = case.grad_outputs if kind == GRADIENTS else None
        call = self.make_call(case.uid, decl, grad_outputs is not None)
        report = CallReport()
        try:
            outputs = await call.forward([case.inputs], report)
            third = Opinion(decl.peer, age, outputs, compression=report.compression)
            if grad_outputs is not None:
                back = CallReport()
                third.grads = await call.backward([case.inputs], [grad_outputs], report.kept, back)
                third.travelled(back.compression)
        except ExpertError as exc:
            log.info("third opinion on %s from %s failed: %s", case.uid, decl.peer, describe(exc))
            self._count_exclusion(exc)
            return None
        return third

    # --- helpers --------------------------------------------------------------------------------------
    def _age(self, uid: str, peer) -> float | None:
        for decl, age in self.replicas(uid):
            if decl.peer == peer:
                return age
        return None

    def _other(self, uid: str, skip: set[str], comparable_with: list[Opinion]) -> tuple[Declared, float | None] | None:
        """A host of ``uid`` other than ``skip``, comparable with each opinion, drawn with the
        ledger's pick weights (proven hosts first); strictly comparable hosts before those only
        loosely comparable (a loose comparison proves nothing when it agrees)."""
        strict: list[tuple[tuple[Declared, float | None], float]] = []
        loose: list[tuple[tuple[Declared, float | None], float]] = []
        for decl, age in self.replicas(uid):
            peer = str(decl.peer)
            weight = self.ledger.pick_weight(uid, peer)
            if peer in skip or weight <= 0.0:  # excluded, or stale for this expert
                continue
            if all(tolerance(self.config, o.age, age) is not None for o in comparable_with):
                strict.append(((decl, age), weight))
            elif aligned(self.config, age) and all(self._comparable(o.age, age) for o in comparable_with):
                # a loose judge claims a recent sync itself: only a host that claims none is
                # ever judged loosely, never one that does by hosts that do not
                loose.append(((decl, age), weight))
        found = strict or loose
        if not found:
            return None
        return self.rng.choices([host for host, _ in found], [weight for _, weight in found])[0]

    def _comparable(self, first_age: float | None, second_age: float | None) -> bool:
        return (tolerance(self.config, first_age, second_age) is not None
                or loose_tolerance(self.config, first_age, second_age) is not None)

    def _gap(self, first: Opinion, second: Opinion, kind: str) -> Gap | None:
        # the encodings the two replies travelled in where both are known (auto picks one per
        # call), else the mixture's setting
        encodings = (first.compression, second.compression)
        used = lossier(*encodings) if None not in encodings else None
        allowed = tolerance(self.config, first.age, second.age, used or self.compression)
        loose = allowed is None
        if loose:
            allowed = loose_tolerance(self.config, first.age, second.age, used or self.compression)
        if allowed is None:
            return None
        mine, theirs = (first.outputs, second.outputs) if kind == OUTPUTS else (first.grads, second.grads)
        if mine is None or theirs is None:
            return None
        return Gap(compare(mine, theirs), allowed, loose)

    def _count_exclusion(self, error: ExpertError) -> None:
        """An audit's own call got its host excluded by the guard (a non-finite reply, or one
        implausible reply too many): the mixture counts it as its calls' exclusions are."""
        if isinstance(error, ExpertReplyRejected) and error.excluded:
            self.stats["exclusions"] += 1

    def _outvoted(self, uid: str, peer, reason: str) -> None:
        """Two replicas outvoted ``peer`` on ``uid`` for ``reason``: not called for ``uid`` any
        more, and excluded once that makes ``outvotes_to_exclude`` experts."""
        ledger = self.ledger
        if ledger.excluded(str(peer)):
            return
        self.stats["outvoted"] += 1
        if not ledger.outvoted(uid, str(peer)):
            log.warning("not calling %s for expert %s: %s", peer, uid, reason)
            return
        earlier = [u for u in ledger.outvoted_on(str(peer)) if u != uid]
        reason += f"; outvoted before on {', '.join(earlier)}" if earlier else ""
        if ledger.exclude(str(peer), reason):
            self.stats["exclusions"] += 1
            log.warning("excluding volunteer %s: %s", peer, reason)


__all__ = ["Auditor", "Case", "Opinion", "ProofFound"]
