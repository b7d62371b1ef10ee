"""Audits: a trainer sends some of its calls to a second replica too and compares the answers.

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

How answers compare: ``compare`` splits the difference of two replies the way honest drift and
lies differ. Replicas that trained apart since their last sync point their replies in somewhat
different directions but keep their scale; a scaled or zeroed lie changes the scale, a made-up
reply points elsewhere. So a ``Difference`` is a **direction** gap (``|a/|a| - b/|b||``, 0 for
parallel replies, 1.41 for unrelated ones) and a **scale** ratio (the larger norm over the smaller:
x10 for a x10 lie, infinite for a zero reply). Measured on the digits experts (ffn h64, Adam 1e-3,
syncs every 5 s, ``examples/train_digits.py --liar times10`` with every comparison traced):
direction median 0.15, p95 0.35, largest 0.60 for outputs (a loaded CI machine showed 0.77 for
a replica whose rounds lagged) and 0.49 for input gradients; scale at most x1.02 for outputs (the
expert ends in a LayerNorm) and x1.58 for input gradients. The relative L2 gap the audits
used before mixed the two: honest drift of 0.77 there was within 0.13 of a x10 lie's 0.9.
``tolerance`` lets the direction gap grow from ``drift_floor`` with the declared sync ages of both
(plus ``heartbeat_slack`` for the declaration's own age) up to ``max_tolerance``, and the scale up
to ``max_scale``. Other experts and learning rates drift otherwise: ``AuditConfig`` holds these
numbers. A reply beyond either is a disagreement: both become suspect, and a third replica decides
(``judge``): the one the two others outvoted is not called for that expert again, and a peer
outvoted on ``outvotes_to_exclude`` (2) different experts is excluded for this trainer (one outvote
is not enough: an honest replica whose syncs fail for a while drifts off, but on one expert at a
time; a liar lies on all it serves). With no third replica both stay suspect (down-weighted,
audited at ``suspect_rate``) until an audit passes. A lie smaller than replicas' honest drift
(outputs +3 %, or x1.5) cannot be told from it by comparison; see docs/ARCHITECTURE.md for what
exact audits would take.

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
import math
import random
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, Callable, MutableMapping, Protocol, Sequence

import torch
import trio

from ..errors import ExpertConfigError, ExpertError, ExpertReplyRejected, describe
from .callstats import CallReport
from .guard import GRADIENTS, OUTPUTS
from .tensors import BLOCKWISE8_64, BLOCKWISE8_256, FLOAT16, NONE
from .trust import TrustLedger

log = logging.getLogger(__name__)

# relative L2 error the wire's compression alone may add to a reply (8-bit blockwise: 1/255 of a
# block's absolute maximum per value, a few percent of the RMS at worst)
COMPRESSION_ERROR = {NONE: 0.0, FLOAT16: 0.002, BLOCKWISE8_64: 0.03, BLOCKWISE8_256: 0.04}


@dataclass(frozen=True)
class AuditConfig:
    """How replies are compared, and how many audits may be in flight."""

    hardware_tolerance: float = 0.01  # relative error of identical states on different hardware
    drift_floor: float = 0.2  # tolerated direction gap of replicas right after a sync ...
    drift_per_second: float = 0.1  # ... growing with the sum of their sync ages ...
    max_tolerance: float = 1.0  # ... up to this (unrelated replies are 1.41 apart, opposite ones 2)
    max_scale: float = 2.0  # tolerated ratio of two replies' norms (x3, x10 and zero lies exceed it)
    max_sync_age: float = 60.0  # replicas whose sync ages sum beyond this are not compared
    heartbeat_slack: float = 5.0  # how much older a declared sync age may be when read
    max_pending: int = 32  # audits in flight; more are skipped (and counted)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ExpertConfigError(f"AuditConfig.{f.name} must be a non-negative number, got {value!r}")
        if self.max_pending < 1:
            raise ExpertConfigError("AuditConfig.max_pending must be >= 1")
        if self.max_scale < 1:
            raise ExpertConfigError("AuditConfig.max_scale must be >= 1 (a ratio of the larger norm to the smaller)")


DEFAULT_AUDITS = AuditConfig()


# --- pure: distances, tolerances, verdicts ------------------------------------------------------
def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().float().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def _same_shapes(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> bool:
    return len(first) == len(second) and all(a.shape == b.shape for a, b in zip(first, second))


def distance(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> float:
    """``|a - b| / max(|a|, |b|)`` over all tensors (0 for two all-zero sets, ``inf`` when their
    shapes differ or a value is not finite). Between 0 and 2. Used for parameters (catch-up
    corroboration); replies are compared with ``compare``."""
    if not _same_shapes(first, second):
        return math.inf
    gap = norm_a = norm_b = 0.0
    for a, b in zip(first, second):  # tensor by tensor: a whole state is not copied into one
        a, b = a.detach().float(), b.detach().float()
        gap += float(torch.linalg.vector_norm(a - b)) ** 2
        norm_a += float(torch.linalg.vector_norm(a)) ** 2
        norm_b += float(torch.linalg.vector_norm(b)) ** 2
    if not all(math.isfinite(v) for v in (gap, norm_a, norm_b)):
        return math.inf
    scale = math.sqrt(max(norm_a, norm_b))
    return 0.0 if scale == 0.0 else math.sqrt(gap) / scale


@dataclass(frozen=True)
class Difference:
    """How two replies differ (see the module docstring): ``direction`` is ``|a/|a| - b/|b||``
    (0 to 2; a zero reply counts as the zero vector, so it is 1 from any other), ``scale`` the
    larger norm over the smaller (1 to ``inf``). Both ``inf`` when the shapes differ or a value
    is not finite."""

    direction: float
    scale: float

    def __str__(self) -> str:
        return _two_axes(self.direction, self.scale)


def _two_axes(direction: float, scale: float) -> str:
    return f"direction {direction:.3f}, scale x{scale:.2f}"


INCOMPARABLE = Difference(math.inf, math.inf)


def compare(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> Difference:
    """The ``Difference`` of two replies, all their tensors taken as one vector (replies are a
    call's activations or gradients: copying them is cheap)."""
    if not _same_shapes(first, second):
        return INCOMPARABLE
    a, b = _flat(first), _flat(second)
    norm_a, norm_b = float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b))
    if not (math.isfinite(norm_a) and math.isfinite(norm_b)):
        return INCOMPARABLE
    unit_a = a / norm_a if norm_a > 0 else a
    unit_b = b / norm_b if norm_b > 0 else b
    direction = float(torch.linalg.vector_norm(unit_a - unit_b))
    low, high = sorted((norm_a, norm_b))
    scale = 1.0 if high == 0.0 else (math.inf if low == 0.0 else high / low)
    return Difference(direction, scale)


@dataclass(frozen=True)
class Tolerance:
    """How far two honest replies may differ: a direction gap and a scale ratio."""

    direction: float
    scale: float

    def __str__(self) -> str:
        return _two_axes(self.direction, self.scale)


def tolerance(config: AuditConfig, first_age: float | None, second_age: float | None,
              compression: str = "none") -> Tolerance | None:
    """How far two replicas' honest replies may differ, given their sync ages (seconds since each
    last averaged, as declared, slack included); None when they cannot be compared (one never
    synced, or both too long ago)."""
    if first_age is None or second_age is None:
        return None
    ages = first_age + second_age
    if not math.isfinite(ages) or ages > config.max_sync_age:
        return None
    return _with_wire_error(config, min(config.max_tolerance, config.drift_floor + config.drift_per_second * ages),
                            compression)


def aligned(config: AuditConfig, age: float | None) -> bool:
    """Whether a declared sync age (slack included) claims a recent sync: strictly comparable
    with any other such claim."""
    return age is not None and math.isfinite(age) and age <= config.max_sync_age / 2


def loose_tolerance(config: AuditConfig, first_age: float | None, second_age: float | None,
                    compression: str = "none") -> Tolerance | None:
    """How far a host that claims a recent sync and one that claims none may differ: the largest
    honest drift (see the module docstring); None unless exactly one of them claims one."""
    if aligned(config, first_age) == aligned(config, second_age):
        return None
    return _with_wire_error(config, config.max_tolerance, compression)


def _with_wire_error(config: AuditConfig, drift: float, compression: str) -> Tolerance:
    # the pair's relative error from hardware and the wire: it turns the direction and, at most
    # by as much, the ratio of the norms
    error = config.hardware_tolerance + 2 * COMPRESSION_ERROR.get(compression, max(COMPRESSION_ERROR.values()))
    return Tolerance(drift + error, config.max_scale * (1 + error))


@dataclass(frozen=True)
class Gap:
    """How two replies differ, and how far they may."""

    difference: Difference
    allowed: Tolerance
    loose: bool = False  # one side claims no recent sync (``loose_tolerance``)

    @property
    def agree(self) -> bool:
        return self.difference.direction <= self.allowed.direction and self.difference.scale <= self.allowed.scale

    def __str__(self) -> str:
        return f"{self.difference} (at most {self.allowed})"


class Outcome(Enum):
    """What a comparison (and its third opinion, if one was needed) decided."""

    AGREE = "agree"
    FIRST_WRONG = "first wrong"
    SECOND_WRONG = "second wrong"
    UNDECIDED = "undecided"


def judge(first_second: Gap, first_third: Gap | None = None, second_third: Gap | None = None) -> Outcome:
    """Two replies that agree pass. Otherwise a third reply decides: the one it disagrees with,
    while agreeing with the other, was wrong. No third reply, or one that sides with both or
    neither, decides nothing."""
    if first_second.agree:
        return Outcome.AGREE
    if first_third is None or second_third is None:
        return Outcome.UNDECIDED
    if second_third.agree and not first_third.agree:
        return Outcome.FIRST_WRONG
    if first_third.agree and not second_third.agree:
        return Outcome.SECOND_WRONG
    return Outcome.UNDECIDED


# --- the trio part: running audits ------------------------------------------------------------------
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


def lossier(first: str | None, second: str | None) -> str | None:
    """The encoding of the two that may add the larger error (None: unknown)."""
    if first is None or second is None:
        return second if first is None else first
    return max(first, second, key=lambda c: COMPRESSION_ERROR.get(c, max(COMPRESSION_ERROR.values())))


class Case:
    """One audited call: the inputs, the first answer, and (once the trainer's backward ran) the
    output gradients it sent and the input gradients it got back."""

    def __init__(self, uid: str, inputs: torch.Tensor, first: Opinion, backward_follows: bool) -> None:
        self.uid, self.inputs, self.first, self.backward_follows = uid, inputs, first, backward_follows
        self.grad_outputs: torch.Tensor | None = None
        self.backward_done = trio.Event()


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
    ) -> None:
        self.ledger, self.replicas, self.make_call, self.stats = ledger, replicas, make_call, stats
        self.config, self.compression, self.backward_wait = config, compression, backward_wait
        self.rng = rng or random.Random()
        self.enabled = True
        self.pending = 0
        self._rejected: dict[str, tuple[torch.Tensor, Opinion]] = {}  # this forward's rejected replies, by uid
        for key in ("audits", "disagreements", "outvoted", "exclusions", "stale", "unauditable", "audits_skipped"):
            stats.setdefault(key, 0)

    # --- called by the mixture, on the event loop ------------------------------------------------
    def begin_forward(self) -> None:
        """A new forward: rejected replies of the last one can no longer meet their fail-over."""
        self._rejected.clear()

    def rejected(self, call, inputs: torch.Tensor, error: ExpertReplyRejected) -> None:
        """The guard rejected ``call``'s finite reply: keep it for the fail-over's answer."""
        if error.excluded:
            self.stats["exclusions"] += 1
        if error.outputs is not None and not error.excluded and self.enabled:
            self._rejected[call.uid] = (inputs, Opinion(call.peer, self._age(call.uid, call.peer), error.outputs))

    def answered(self, call, inputs: torch.Tensor, outputs: list[torch.Tensor], compression: str | None = None) -> Case | None:
        """``call`` answered ``outputs`` (past the guard; ``compression``: the encoding they
        travelled in): compare them with a reply the guard rejected for the same inputs, or audit
        them by chance. Returns the case, if any, for ``backward_sent``."""
        if not self.enabled:
            return None
        first = Opinion(call.peer, self._age(call.uid, call.peer), outputs, compression=compression)
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
                      compression: str | None = None) -> None:
        """The trainer's backward of an audited call went out (``grad_outputs`` None: it had
        none); ``grad_inputs``: what the audited host answered (None if it failed), in
        ``compression``."""
        if case is None:
            return
        case.grad_outputs = grad_outputs
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


__all__ = [
    "AuditConfig", "Auditor", "Case", "DEFAULT_AUDITS", "Difference", "Gap", "Opinion", "Outcome", "Tolerance", "aligned",
    "compare", "distance", "judge", "loose_tolerance", "lossier", "tolerance",
]
