"""What the runtime does with the gradient bound's verdicts: strikes, refusals and rollbacks.

The runtime's worker (or the event loop, for an inline job: never both at once) hands each
computed backward batch here under the runtime's lock, with the clock read by the caller.
``gradbound.NormBound`` judged each gradient; ``TrainerJudge`` turns the verdicts into the
trainers' standing (``trainers.TrainerBook``) and the experts' state:

- a clipped gradient is a strike for its trainer (a batch of several trainers that clipped was
  split by the runtime first, so each strike has one author); from a trainer with fewer than
  ``NEWCOMER_BACKWARDS`` backwards applied here it is not even applied (a strike all the same):
  fresh identities cost nothing, and each would bring its own allowance of clipped steps;
- a gross gradient, or ``max_strikes`` strikes within the window, refuses the trainer for cause:
  every expert it struck goes back to its state before the trainer's first clipped gradient
  (``ExpertBackend.roll_back``), and the call that tipped it fails with ``TrainerRefusedError``;
- a warm-up gradient that proves gross after the fact refuses its trainer and rolls the expert
  back to its state before warm-up;
- an expert's kept state is let go once no trainer has an open strike on it.
"""

from __future__ import annotations

import logging
from typing import Hashable, Mapping, Sequence, TypedDict

from ..errors import GradientRefusedError, TrainerRefusedError
from ..net.identity import PeerID
from .backend import ExpertBackend
from .config import DEFAULT_CONFIG, ExpertsConfig
from .gradbound import Verdict
from .requests import Request
from .trainers import TRAINER_CLIPPED, TRAINER_REFUSED, TRAINER_SHARE, TrainerBook, TrainerCounts

log = logging.getLogger(__name__)
NEWCOMER_BACKWARDS = 16  # backwards applied here before a trainer's gradient past the bound is clipped, not refused


def _name(trainer: Hashable) -> str:
    return trainer.short() if isinstance(trainer, PeerID) else str(trainer)



class TrainersStatus(TypedDict):
    """``TrainerJudge.snapshot()``: per-trainer counts and experts rolled back, in all."""

    trainers: dict[str, TrainerCounts]
    rollbacks: int


class TrainerJudge:
    """The trainers' book and the verdicts' consequences (module docstring)."""

    def __init__(self, backends: Mapping[str, ExpertBackend], config: ExpertsConfig = DEFAULT_CONFIG) -> None:
        self.backends = backends
        self.book = TrainerBook(
            max_strikes=config.trainer_max_strikes, strike_window=config.trainer_strike_window,
            refusal_period=config.trainer_refusal, share_window=config.trainer_share_window,
        )
        self.rollbacks = 0  # experts rolled back, in all

    def newcomer(self, trainer: Hashable) -> bool:
        """Whether ``trainer`` has had fewer than ``NEWCOMER_BACKWARDS`` backwards applied here: a
        clip is the benefit of the doubt, for trainers this volunteer knows; a fresh identity's
        gradient past the bound is not applied at all (so rotating identities buys no clipped steps)."""
        return trainer is not None and self.book.applied_count(trainer) < NEWCOMER_BACKWARDS

    def refusal(self, uid: str, trainer: Hashable, now: float) -> TrainerRefusedError | None:
        """Why a backward of ``trainer`` on ``uid`` is refused before it runs (counted), or None."""
        if trainer is None:
            return None
        until = self.book.refused_until(trainer, now)
        if until is not None:
            self.book.refuse(trainer, TRAINER_REFUSED)
            return TrainerRefusedError(
                f"your gradients went past this volunteer's bounds: backwards refused for {until - now:.0f} s more"
            )
        if self.book.share_exceeded(uid, trainer, now):
            self.book.refuse(trainer, TRAINER_SHARE)
            return TrainerRefusedError(
                f"you sent most of expert {uid!r}'s recent backwards while others train it too; try again later"
            )
        return None

    def judge(self, uid: str, requests: Sequence[Request], now: float) -> None:
        """Count and act on the verdicts of a computed backward batch of ``uid``."""
        backend = self.backends.get(uid)
        for request in requests:
            if request.gone or request.trainer is None:
                continue
            if isinstance(request.error, GradientRefusedError):
                if request.error.gross:
                    self._refuse_for_cause(request.trainer, uid, now, f"a gradient {request.error.norm:.3g} past "
                                           f"the bound {request.error.bound:.3g} of {uid}")
                else:  # a newcomer's clipped gradient: not applied, and a strike all the same
                    self.book.refuse(request.trainer, TRAINER_CLIPPED)
                    self._strike(request.trainer, uid, now)
                continue
            if request.error is not None or request.check is None:
                continue
            clipped = request.check.verdict is Verdict.CLIPPED
            self.book.applied(uid, request.trainer, clipped=clipped)
            if clipped and self._strike(request.trainer, uid, now):
                request.result, request.error = None, TrainerRefusedError(
                    "your gradients kept going past this expert's bound: refused for a while, and undone"
                )
        if backend is None:
            return
        for sender in backend.grad_bound.late_outliers():
            if not backend.roll_back():
                backend.reset_moments()  # what it put there would freeze the expert
            if sender is not None:
                self.book.cause(sender, now)
                self._roll_back(sender, uid, now, f"a warm-up gradient of {uid} far past the bound it then learned")
        if backend.keeps_state and not backend.grad_bound.warming_up and not self.book.open_strikes(uid, now):
            backend.release_state()

    def _strike(self, trainer: Hashable, uid: str, now: float) -> bool:
        """A strike for ``trainer`` on ``uid``; True when it was one too many (refused, undone)."""
        if not self.book.strike(uid, trainer, now):
            return False
        self._roll_back(trainer, uid, now, f"{self.book.max_strikes} gradients past the bounds of {uid} "
                        f"within {self.book.strike_window:g} s")
        return True

    def _refuse_for_cause(self, trainer: Hashable, uid: str, now: float, why: str) -> None:
        self.book.refuse(trainer, TRAINER_REFUSED)
        self.book.cause(trainer, now)
        self._roll_back(trainer, uid, now, why)

    def _roll_back(self, trainer: Hashable, uid: str, now: float, why: str) -> None:
        """``trainer`` is refused for cause: undo it on every expert it struck (``uid`` too)."""
        rolled = []
        for struck in dict.fromkeys([uid, *self.book.struck(trainer, now)]):
            backend = self.backends.get(struck)
            if backend is not None and backend.roll_back():
                rolled.append(struck)
        self.book.clear_strikes(trainer)
        self.rollbacks += len(rolled)
        until = self.book.refused_until(trainer, now)
        log.warning(
            "trainer %s refused for %.0f s: %s%s", _name(trainer), (until or now) - now, why,
            f"; rolled back {', '.join(rolled)}" if rolled else "",
        )

    def forget(self, uid: str) -> None:
        """``uid`` is no longer served."""
        self.book.forget_expert(uid)

    def snapshot(self, now: float) -> TrainersStatus:
        """Per-trainer counts (``volunteer status``) and rollbacks in all."""
        return {"trainers": self.book.snapshot(now), "rollbacks": self.rollbacks}


__all__ = ["TrainerJudge"]
