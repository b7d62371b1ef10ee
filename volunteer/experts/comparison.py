"""How a trainer's audits compare two replicas' replies to the same call, and what a third
opinion decides: pure (tensors in, numbers and verdicts out; no trio, no clock). ``audit.py``
runs the audits.

``compare`` splits the difference of two replies the way honest drift and lies differ. Replicas that trained apart since their last sync point their replies in somewhat
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
(``judge``; ``audit.py`` acts on its verdict). A lie smaller than replicas' honest drift
(outputs +3 %, or x1.5) cannot be told from it by comparison; see docs/ARCHITECTURE.md for what
exact audits would take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import Enum
from typing import Sequence

import torch

from ..errors import ExpertConfigError
from .distance import same_shapes
from .tensors import BLOCKWISE8_64, BLOCKWISE8_256, FLOAT16, NONE

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
    # what exact audits at the trusted floor may cost: this share of the trainer's wall time
    # (snapshot fetch + recompute, as measured), with up to ``cost_burst`` seconds saved while
    # they cost less; over a slow uplink one snapshot outweighs the calls it checks
    cost_share: float = 0.05
    cost_burst: float = 10.0

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


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().float().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


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
    if not same_shapes(first, second):
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


def lossier(first: str | None, second: str | None) -> str | None:
    """The encoding of the two that may add the larger error (None: unknown)."""
    if first is None or second is None:
        return second if first is None else first
    return max(first, second, key=lambda c: COMPRESSION_ERROR.get(c, max(COMPRESSION_ERROR.values())))


__all__ = [
    "COMPRESSION_ERROR", "DEFAULT_AUDITS", "AuditConfig", "Difference", "Gap", "Outcome", "Tolerance", "aligned",
    "compare", "judge", "loose_tolerance", "lossier", "tolerance",
]
