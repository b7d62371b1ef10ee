"""A replica-sync round's bookkeeping: the sans-I/O core of ``/volunteer/<swarm>/expert-sync/1.0.0``.

Each live replica of an expert sends its floating-point parameters to every other member of the
group, and averages what it received with its own. ``SyncRound`` keeps one member's view of a
round: who is in the group, whose parameters arrived, who is known gone, and the deadline (from
``now`` when the round opened). The round is done when every member either contributed or is
gone, or at the deadline; it then finishes with what it has, as hivemind's averager does: a
member that vanished simply is not in the average, so the parameters it would have brought keep
this replica's own values. The version after a round is the highest of the contributors'.

The round only collects: turning ``params`` and ``contributions`` into new parameters is an
``Aggregate`` (``aggregate.py``), which the driver has the runtime run beside the expert's other
work, never on the event loop.

No trio, no clock: the driver (``syncdriver.py``) passes ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import torch

from .errors import StateMismatchError, SyncError


@dataclass(frozen=True)
class SyncOutcome:
    """A finished round: the version after it, who contributed and who did not (gone or late).
    (No tensors: the parameters it produced are in the expert.)"""

    uid: str
    version: int
    contributors: tuple[str, ...]
    missing: tuple[str, ...]


class SyncRound:
    """One member's view of one round of averaging ``uid`` (see the module docstring)."""

    def __init__(
        self,
        uid: str,
        me: str,
        members: Iterable[str],
        version: int,
        params: Sequence[tuple[str, torch.Tensor]],
        *,
        now: float,
        timeout: float,
    ) -> None:
        self.uid = uid
        self.me = me
        self.members = frozenset(members) - {me}
        self.version = version
        self.params = dict(params)
        self.opened = now
        self.deadline = now + timeout
        self._received: dict[str, tuple[int, Mapping[str, torch.Tensor]]] = {}
        self._gone: set[str] = set()
        self.finished = False

    @property
    def waiting(self) -> frozenset[str]:
        """Members neither heard from nor known gone."""
        return self.members - self._received.keys() - self._gone

    @property
    def received(self) -> frozenset[str]:
        """Members whose parameters arrived."""
        return frozenset(self._received)

    def add(self, peer: str, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Take a member's parameters. SyncError from a non-member, twice, or after the round
        finished; StateMismatchError when names, shapes or dtypes differ from ours."""
        if self.finished:
            raise SyncError(f"sync round of {self.uid!r} is already finished")
        if peer not in self.members:
            raise SyncError(f"{peer} is not in the sync group of {self.uid!r}")
        if peer in self._received:
            raise SyncError(f"{peer} contributed twice to one round of {self.uid!r}")
        if tensors.keys() != self.params.keys() or any(
            t.shape != self.params[name].shape or t.dtype != self.params[name].dtype for name, t in tensors.items()
        ):
            raise StateMismatchError(f"{peer}'s parameters of {self.uid!r} differ in names, shapes or dtypes")
        self._received[peer] = (version, tensors)
        self._gone.discard(peer)  # it did send: a failed send of ours to it does not matter

    def gone(self, peer: str) -> None:
        """A member will not contribute (its connection died, or it refused ours)."""
        if peer in self.members and peer not in self._received:
            self._gone.add(peer)

    def done(self, now: float) -> bool:
        """Whether to finish now: nobody left to wait for, or the deadline has passed."""
        return self.finished or not self.waiting or now >= self.deadline

    @property
    def contributions(self) -> list[Mapping[str, torch.Tensor]]:
        """The parameters that arrived, in the order they arrived (ours are ``params``)."""
        return [tensors for _, tensors in self._received.values()]

    def finish(self) -> SyncOutcome:
        """Close the round: no more contributions. The group's highest version, who contributed
        and who is missing; the caller aggregates ``params`` and ``contributions``."""
        self.finished = True
        version = max([self.version, *(v for v, _ in self._received.values())])
        missing = tuple(sorted(self.members - self._received.keys()))
        return SyncOutcome(self.uid, version, tuple(sorted(self._received)), missing)


__all__ = ["SyncOutcome", "SyncRound"]
