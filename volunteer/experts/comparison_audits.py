"""Comparison audits, for hosts whose replies carry no receipt (hivemind's): some of a trainer's
calls go to a second replica too, and the answers are compared. The half of ``audit.Auditor``
that compares (this mixin); exact audits, for receipted replies, are in ``audit.py``. Also the
vocabulary both share: an audited call (``Case``) and a host's answer (``Opinion``).

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
from .comparison import AuditConfig, Gap, Outcome, aligned, compare, judge, loose_tolerance, lossier, tolerance
from .guard import GRADIENTS, OUTPUTS
from .receipts import Receipt
from .trust import TrustLedger

log = logging.getLogger("volunteer.experts.audit")  # one logger for both halves of an audit


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


class ComparisonAudits:
    """The comparison half of ``audit.Auditor`` (its mixin): what it reads of the auditor is
    declared here, and set by ``Auditor.__init__``."""

    ledger: TrustLedger
    replicas: Replicas
    make_call: Callable[[str, Any, bool], ExpertCall]
    stats: MutableMapping[str, int]
    config: AuditConfig
    compression: str
    backward_wait: float
    rng: random.Random

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



__all__ = ["Case", "ComparisonAudits", "Declared", "ExpertCall", "Opinion", "Replicas"]
