"""The trainer's guard: every reply a volunteer sends is checked before it reaches autograd.

A reply fails the guard when it holds NaN or infinity (the trainer sent finite tensors, and the
volunteer refuses non-finite ones, so nothing honest returns them), or when its scale is far
outside what this expert has recently returned. The scale of a forward's reply is the log of its
RMS; the scale of a backward's reply (input gradients) is the log of their RMS over the RMS of the
output gradients sent, the expert's gain, which stays put while the loss, and so every gradient,
shrinks by orders of magnitude over training. ``RangeTracker`` learns a plausible range per
(expert, kind) from the accepted replies of every replica of that expert: median ± max(``spread``
scaled MADs, ``min_band``) over the last ``window`` values, enforced once ``warmup`` have been
seen. Robust statistics: a minority of liars among a uid's answers cannot move the median.

``ReplyGuard`` applies it and tells the ``TrustLedger``: a non-finite reply excludes its host at
once; an implausible one counts against the (uid, peer) and fails the call (the mixture then
fails over to another replica and compares the two answers, ``audit.py``); ``guard_strikes``
implausible replies of a peer in a row, of one kind (outputs or input gradients: honest forwards
do not clear a liar in backwards), exclude it, unless its replies carry receipts
(``receipts.py``): the range is learned from replies, a majority of which may be lies, so for a
receipted reply it only fails the call, and the auditor recomputes that reply (``audit.py``).
Cost: one reduction per reply tensor on the trainer's event-loop thread.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, fields
from typing import Sequence

import torch

from ..errors import ExpertConfigError, ImplausibleReplyError, NonFiniteReplyError
from .trust import TrustLedger

log = logging.getLogger(__name__)

OUTPUTS = "outputs"
GRADIENTS = "input gradients"
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation is 1.4826 MADs
TINY = 1e-30  # the RMS an all-zero reply counts as (log(0) would poison the statistics)
ZERO = math.log(TINY)  # log_rms of all zeros


@dataclass(frozen=True)
class GuardConfig:
    """How the plausible range of a reply's scale is learned."""

    warmup: int = 16  # accepted replies of an expert (per kind) before its range is enforced
    window: int = 256  # most recent accepted scales the range is computed from
    spread: float = 8.0  # half-width in scaled MADs of the log scale ...
    min_band: float = math.log(4.0)  # ... but never narrower than a factor of 4 either way
    refresh_every: int = 8  # accepted replies between recomputations of a range
    max_experts: int = 65536  # (uid, kind) ranges kept, least recently used forgotten

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ExpertConfigError(f"GuardConfig.{f.name} must be a positive number, got {value!r}")
        if self.window < self.warmup:
            raise ExpertConfigError("GuardConfig.window must be at least warmup")


DEFAULT_GUARD = GuardConfig()


def log_rms(tensors: Sequence[torch.Tensor]) -> float | None:
    """The log of the RMS of every floating-point value in ``tensors`` (``log(TINY)`` for all
    zeros, ``inf`` for finite values too large to square); None if any value is NaN or infinite;
    ``nan`` if there is no floating-point value to measure."""
    squares, count = 0.0, 0
    for tensor in tensors:
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        # half precision would overflow while squaring honest values: accumulate in float32
        wide = torch.float32 if tensor.element_size() < 4 else None
        norm = float(torch.linalg.vector_norm(tensor, dtype=wide))
        if not math.isfinite(norm):
            return None if not bool(torch.isfinite(tensor).all()) else math.inf
        squares += norm * norm
        count += tensor.numel()
    if count == 0:
        return math.nan
    return 0.5 * math.log(squares / count) if squares > 0.0 else ZERO


class _Range:
    __slots__ = ("values", "since_refresh", "bounds")

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.since_refresh = 0
        self.bounds: tuple[float, float] | None = None


class RangeTracker:
    """The plausible range of a per-call statistic, per key (pure: values in, verdicts out)."""

    def __init__(self, config: GuardConfig = DEFAULT_GUARD) -> None:
        self.config = config
        self._ranges: OrderedDict[object, _Range] = OrderedDict()

    def bounds(self, key: object) -> tuple[float, float] | None:
        """(low, high) for ``key``; None while it is warming up."""
        found = self._ranges.get(key)
        return found.bounds if found is not None else None

    def plausible(self, key: object, value: float) -> bool:
        """Whether ``value`` lies within ``key``'s range (always, during the warm-up)."""
        bounds = self.bounds(key)
        return bounds is None or bounds[0] <= value <= bounds[1]

    def add(self, key: object, value: float) -> None:
        """Learn an accepted value."""
        config = self.config
        found = self._ranges.get(key)
        if found is None:
            found = self._ranges[key] = _Range(config.window)
            while len(self._ranges) > config.max_experts:
                self._ranges.popitem(last=False)
        else:
            self._ranges.move_to_end(key)
        found.values.append(value)
        found.since_refresh += 1
        if len(found.values) >= config.warmup and (found.bounds is None or found.since_refresh >= config.refresh_every):
            found.since_refresh = 0
            middle = _median(sorted(found.values))
            mad = _median(sorted([abs(v - middle) for v in found.values]))  # a list, not a generator: no resume per value
            half = max(config.spread * MAD_TO_SIGMA * mad, config.min_band)
            found.bounds = (middle - half, middle + half)


class ReplyGuard:
    """Checks replies for one trainer and reports what it finds to the trust ledger."""

    def __init__(self, ledger: TrustLedger, config: GuardConfig = DEFAULT_GUARD) -> None:
        self.ledger = ledger
        self.config = config
        self.ranges = RangeTracker(config)

    def check_outputs(self, uid: str, peer: str, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor] = (),
                      *, receipted: bool = False) -> None:
        """Raise ``NonFiniteReplyError`` / ``ImplausibleReplyError`` if a forward's reply fails.
        ``inputs``: what was sent (an all-zero input may honestly give an all-zero output);
        ``receipted``: the reply carries a receipt (implausible replies then never exclude)."""
        self._check(uid, peer, OUTPUTS, log_rms(outputs), outputs, inputs, receipted)

    def check_gradients(
        self, uid: str, peer: str, grad_inputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor],
        *, receipted: bool = False,
    ) -> None:
        """Raise if a backward's reply (``grad_inputs`` for the ``grad_outputs`` we sent) fails."""
        scale = log_rms(grad_inputs)
        sent = log_rms(grad_outputs)
        if scale is not None and sent is not None and math.isfinite(sent):
            scale -= sent  # the expert's gain
        elif scale is not None:
            scale = math.nan  # nothing to relate it to: finiteness is all we can check
        self._check(uid, peer, GRADIENTS, scale, grad_inputs, grad_outputs, receipted)

    def _check(
        self, uid: str, peer: str, kind: str, scale: float | None, tensors: Sequence[torch.Tensor],
        sent: Sequence[torch.Tensor], receipted: bool = False,
    ) -> None:
        ledger = self.ledger
        ledger.replied(peer)
        if scale is None:
            reason = f"returned non-finite {kind} of expert {uid} for finite inputs"
            if ledger.exclude(peer, reason):
                log.warning("excluding volunteer %s: it %s", peer, reason)
            raise NonFiniteReplyError(f"{peer} {reason}", excluded=True)
        if math.isnan(scale):
            ledger.accepted(peer, kind)
            return
        key = (uid, kind)
        if not self.ranges.plausible(key, scale):
            if sent and log_rms(sent) == ZERO:  # all zeros sent: no scale to expect (measured only here: rare)
                ledger.accepted(peer, kind)
                return
            low, high = self.ranges.bounds(key) or (-math.inf, math.inf)
            detail = (f"the RMS of its {kind} of expert {uid} is {_exp(scale):.3g}, outside the plausible "
                      f"{_exp(low):.3g}..{_exp(high):.3g} its replicas set")
            excluded = False
            if ledger.rejected(uid, peer, kind) and not receipted:
                reason = f"{ledger.policy.guard_strikes} replies in a row out of range ({detail})"
                excluded = ledger.exclude(peer, reason)
                if excluded:
                    log.warning("excluding volunteer %s: %s", peer, reason)
            raise ImplausibleReplyError(f"{peer}: {detail}", outputs=list(tensors), excluded=excluded)
        self.ranges.add(key, scale)
        ledger.accepted(peer, kind)


def _median(ordered: list[float]) -> float:
    """``statistics.median`` of an already sorted list, without its checks and copies."""
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _exp(value: float) -> float:
    return math.exp(min(value, 700.0))


__all__ = ["DEFAULT_GUARD", "GRADIENTS", "GuardConfig", "OUTPUTS", "RangeTracker", "ReplyGuard", "log_rms"]
