"""How far one backward may move an expert: a bound on the parameter gradient's norm, learned from
the gradients the expert has taken (pure bookkeeping: no torch, no clock).

Any peer that speaks the protocol is a trainer, and Adam forgives nothing: one finite gradient
×10⁶ fills the second-moment estimate for thousands of steps (the expert answers but stops
learning), and a steady stream of them turns it. So every backward's gradient norm is compared,
before the optimizer sees it, with what this expert's honest gradients have been:

- the bound is ``factor`` times the median of the last ``window`` norms it **accepted** (a clipped
  or refused norm never teaches it, so an attacker cannot raise it by pushing);
- a norm past the bound is clipped to it (``CLIPPED``): the moments see at most ``factor`` times an
  ordinary gradient;
- a norm past ``gross`` times the bound is no gradient an honest trainer sends (``GROSS``): the
  backward is refused whole and its trainer refused for a while (``trainers.TrainerBook``);
- an expert whose optimizer has a history (a checkpoint, a replica's state) starts from the norm
  its second moments remember (``seed``); a fresh one's first ``warmup`` norms have no bound to
  meet yet: they are taken as they come, the state before them is kept, and from the third on
  a warm-up norm past ``gross`` times the bound the others teach is found out after the fact
  (``late_outliers``): its trainer is refused and the expert goes back to that state.

The same rule in one picture: a learned clip like ``clip_grad_norm_``, with the threshold taken
from the expert's own history the way the replica guard learns its drift bound.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass
from typing import Hashable


class Verdict(enum.Enum):
    """What a gradient norm may do: be taken, be clipped to the bound, or be refused."""

    TAKEN = "taken"
    CLIPPED = "clipped"
    GROSS = "gross"


@dataclass(frozen=True)
class Check:
    """One norm's verdict: ``scale`` multiplies the gradient (1.0 unless clipped); ``bound`` is
    the bound applied (``math.inf`` while warming up)."""

    verdict: Verdict
    norm: float
    bound: float
    scale: float = 1.0


class NormBound:
    """The learned gradient-norm bound of one expert (see the module docstring)."""

    def __init__(self, *, factor: float = 10.0, gross: float = 100.0, window: int = 64, warmup: int = 8) -> None:
        if factor <= 1 or gross <= 1 or window < 1 or warmup < 1:
            raise ValueError("NormBound needs factor > 1, gross > 1, window >= 1, warmup >= 1")
        self.factor = factor
        self.gross = gross
        self.warmup = warmup
        self._accepted: deque[float] = deque(maxlen=window)
        self._early: list[tuple[float, Hashable]] = []  # warm-up norms and who sent them

    @property
    def warming_up(self) -> bool:
        """Whether fewer than ``warmup`` norms were accepted (no bound yet)."""
        return len(self._accepted) < self.warmup

    @property
    def bound(self) -> float:
        """The norm past which a gradient is clipped (``math.inf`` while warming up)."""
        if self.warming_up:
            return math.inf
        ordered = sorted(self._accepted)
        return self.factor * ordered[(len(ordered) - 1) // 2]

    def check(self, norm: float) -> Check:
        """The verdict for a gradient of ``norm`` (nothing is learned: see ``taken``)."""
        bound = self.bound
        if not math.isfinite(norm):
            return Check(Verdict.GROSS, norm, bound, 0.0)
        if norm <= bound:
            return Check(Verdict.TAKEN, norm, bound)
        if norm > self.gross * bound:
            return Check(Verdict.GROSS, norm, bound, 0.0)
        return Check(Verdict.CLIPPED, norm, bound, bound / norm)

    def taken(self, check: Check, sender: Hashable = None) -> None:
        """Learn from a gradient the optimizer took unclipped (clipped and refused ones teach
        nothing). ``sender``: who sent it, named by ``late_outliers`` if it proves an outlier."""
        if check.verdict is not Verdict.TAKEN or check.norm <= 0:
            return
        if self.warming_up:
            self._early.append((check.norm, sender))
        self._accepted.append(check.norm)

    def seed(self, reference: float | None) -> None:
        """While warming up, take ``reference`` (the gradient norm the optimizer's history
        remembers) as the whole warm-up: an expert loaded with a history needs none."""
        if self._accepted or self._early:
            return  # only before the first gradient: later, the history holds what this process took
        if reference is not None and math.isfinite(reference) and reference > 0:
            self._accepted.extend([reference] * (self.warmup - len(self._accepted)))

    def late_outliers(self) -> list[Hashable]:
        """The senders of warm-up norms past ``gross`` times the bound the others teach, found
        as soon as three warm-up norms exist (a median needs no more to outvote one outlier),
        each once; the outliers are forgotten, so the bound never learns from them."""
        if len(self._early) < 3:
            return []
        norms = sorted(norm for norm, _ in self._early)
        limit = self.gross * self.factor * norms[(len(norms) - 1) // 2]
        outliers = [sender for norm, sender in self._early if norm > limit]
        if outliers:
            self._early = [(norm, sender) for norm, sender in self._early if norm <= limit]
            kept = [n for n in self._accepted if n <= limit]
            self._accepted.clear()
            self._accepted.extend(kept)
        if not self.warming_up:
            self._early.clear()  # the bound judges from here on
        return list(dict.fromkeys(outliers))


__all__ = ["Check", "NormBound", "Verdict"]
