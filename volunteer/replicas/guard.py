"""What a sync round believes of the contributions it received: a pure policy over tensors (no
trio, no clock, no backend).

A replica that declares an expert can join its sync rounds, so a contribution is a claim, not a
fact. ``SyncGuard.decide`` screens a finished round's contributions and turns the rest into new
parameters and a version:

- **non-finite** values (NaN, ±inf) are refused outright (``sync_nonfinite``);
- **distance**: each contribution's L2 distance from our own parameters is bounded by what honest
  replicas drift apart in a round, learned per expert: ``drift_slack`` times the largest of our
  own change since our last round (training and the last merge), the median of the distances we
  accepted in past rounds and, with three or more inputs, our distance from the inputs'
  coordinate-wise median (a majority statistic a single liar cannot move far). Only when none of
  these exists yet (a pair's first round) is the bound a share of our own parameters' norm
  (``sync_bootstrap_share``: wide enough for two independent initialisations).
  A contribution past it is left out of the round (``sync_outlier``); accepted distances teach
  the bound, refused ones never do;
- **bias**: between two honest replicas the difference of their parameters wanders like a random
  walk from round to round; a liar that pushes one fixed direction adds up linearly. Per peer, an
  exponentially forgotten sum of its differences from our parameters is compared with the
  forgotten sum of their squared norms: for independent differences ``|sum|^2 / sum |d|^2``
  stays near 1, for a fixed push it grows towards ``(1 + decay) / (1 - decay)``. A peer past
  ``sync_bias_ratio`` (after ``sync_bias_rounds`` rounds) is left out of the round
  (``sync_bias``) when at least one other accepted peer is not: that witness shows it is the
  peer, not us, that moves steadily. Only with three or more inputs (in a pair the other opinion
  is all there is), and its differences are still followed, so a peer that stops pushing is
  taken back. A replica that alone receives all of an expert's training also moves steadily and
  is left out the same way by the idle ones: geometry alone cannot tell it from a liar;
- **aggregate**: what is left goes to an ``Aggregate`` (``aggregate.robust`` by default:
  CenteredClip from the coordinate-wise median with three or more inputs, the mean of a pair);
- **version**: the lower median of the accepted inputs' versions (ours counts), never below our
  own: one peer's claim alone never raises it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from .aggregate import Aggregate, coordinate_median, flatten, robust
from .config import DEFAULT_CONFIG, ReplicasConfig

Parameters = Mapping[str, torch.Tensor]

NONFINITE = "sync_nonfinite"
OUTLIER = "sync_outlier"
BIAS = "sync_bias"


@dataclass(frozen=True)
class Contributed:
    """One peer's contribution to a round: its claimed version and its parameters."""

    peer: str
    version: int
    tensors: Parameters


@dataclass
class Verdict:
    """What a round decided: the new parameters, the version after it, whose contributions were
    used and who was refused (peer → reason), with the distance bound the round applied."""

    parameters: dict[str, torch.Tensor]
    version: int
    accepted: tuple[str, ...]
    refused: dict[str, str]
    bound: float


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] if ordered else 0.0


@dataclass
class _PeerRecord:
    deviation: torch.Tensor | None = None  # forgotten sum of its differences from our parameters
    energy: float = 0.0  # forgotten sum of their squared norms
    rounds: int = 0


@dataclass
class _ExpertRecord:
    distances: deque = field(default_factory=deque)
    previous: torch.Tensor | None = None  # our parameters when our last round opened
    peers: dict[str, _PeerRecord] = field(default_factory=dict)


class SyncGuard:
    """Per-expert memory of honest drift and of each peer's deviations; ``decide`` is the round's
    verdict (see the module docstring). Bounded: ``max_group`` peers and ``drift_history``
    distances per expert; ``forget`` drops an expert no longer hosted."""

    def __init__(self, config: ReplicasConfig = DEFAULT_CONFIG) -> None:
        self.config = config
        self._experts: dict[str, _ExpertRecord] = {}

    def forget(self, uid: str) -> None:
        """Drop what was learned of ``uid`` (no longer hosted)."""
        self._experts.pop(uid, None)

    def bound(self, uid: str, own: torch.Tensor, centre_spread: float | None = None) -> float:
        """How far a contribution may be from ``own`` (flattened) in this round of ``uid``."""
        record = self._experts.get(uid)
        evidence = []
        if record is not None:
            if record.previous is not None and record.previous.shape == own.shape:
                evidence.append(float((own - record.previous).norm()))
            evidence.append(_median(list(record.distances)))
        if centre_spread is not None:
            evidence.append(centre_spread)
        drift = max(evidence, default=0.0)
        if drift > 0:
            return self.config.sync_drift_slack * drift
        return self.config.sync_bootstrap_share * float(own.norm())

    def bias(self, uid: str, peer: str) -> float:
        """``|sum of differences|^2 / sum of |difference|^2`` of ``peer``'s contributions to
        ``uid``'s rounds from our parameters, both forgotten at ``sync_bias_decay`` a round; 0
        before ``sync_bias_rounds`` rounds."""
        record = self._experts.get(uid)
        stats = None if record is None else record.peers.get(peer)
        if stats is None or stats.deviation is None or stats.rounds < self.config.sync_bias_rounds or stats.energy <= 0:
            return 0.0
        return float(stats.deviation.norm()) ** 2 / stats.energy

    def decide(
        self,
        uid: str,
        own: Parameters,
        own_version: int,
        contributions: Sequence[Contributed],
        aggregate: Aggregate = robust,
    ) -> Verdict:
        """The round's verdict for ``uid``: screen ``contributions``, ``aggregate`` the rest with
        ``own``, and learn from what was accepted."""
        names = sorted(own)
        mine = flatten(own, names)
        record = self._experts.setdefault(uid, _ExpertRecord())
        refused: dict[str, str] = {}
        candidates: list[tuple[Contributed, torch.Tensor]] = []
        for contribution in contributions[: self.config.max_group]:
            flat = flatten(contribution.tensors, names)
            if not bool(torch.isfinite(flat).all()):
                refused[contribution.peer] = NONFINITE
            else:
                candidates.append((contribution, flat))
        spread = None
        if len(candidates) + 1 >= 3:  # how far we are from the majority: a liar cannot move it much
            spread = float((mine - coordinate_median(torch.stack([mine] + [flat for _, flat in candidates]))).norm())
        bound = self.bound(uid, mine, spread)
        accepted: list[tuple[Contributed, torch.Tensor, float]] = []
        for contribution, flat in candidates:
            distance = float((flat - mine).norm())
            if not distance <= bound:
                refused[contribution.peer] = OUTLIER
            else:
                accepted.append((contribution, flat, distance))
        if len(accepted) + 1 >= 3:
            biased = [c.peer for c, _, _ in accepted if self.bias(uid, c.peer) > self.config.sync_bias_ratio]
            if len(biased) < len(accepted):  # a witness: some peer does not move steadily from us
                for peer in biased:
                    refused[peer] = BIAS
                accepted = [a for a in accepted if a[0].peer not in refused]
        parameters = aggregate(own, [c.tensors for c, _, _ in accepted])
        # differences are followed only where the bias test applies (three or more inputs): in a
        # pair they would cost a copy of the parameters for nothing
        followed = [(c.peer, flat) for c, flat in candidates if c.peer not in refused or refused[c.peer] == BIAS]
        if len(candidates) + 1 < 3:
            followed = []
        self._learn(record, mine, [d for _, _, d in accepted], followed, contributions)
        versions = sorted([own_version] + [c.version for c, _, _ in accepted])
        version = max(own_version, versions[(len(versions) - 1) // 2])
        return Verdict(
            dict(parameters), version, tuple(c.peer for c, _, _ in accepted), refused, bound
        )

    def _learn(
        self,
        record: _ExpertRecord,
        mine: torch.Tensor,
        distances: Sequence[float],
        followed: Sequence[tuple[str, torch.Tensor]],
        contributions: Sequence[Contributed],
    ) -> None:
        record.previous = mine
        record.distances.extend(distances)
        while len(record.distances) > self.config.sync_drift_history:
            record.distances.popleft()
        decay = self.config.sync_bias_decay
        for peer, flat in followed:
            stats = record.peers.setdefault(peer, _PeerRecord())
            deviation = flat - mine
            if stats.deviation is None or stats.deviation.shape != deviation.shape:
                stats.deviation, stats.energy, stats.rounds = torch.zeros_like(deviation), 0.0, 0
            stats.deviation = stats.deviation * decay + deviation
            stats.energy = stats.energy * decay * decay + float(deviation.norm()) ** 2
            stats.rounds += 1
        present = {c.peer for c in contributions}
        for peer in list(record.peers):
            if peer not in present and len(record.peers) > self.config.max_group:
                del record.peers[peer]


def finite(params: Parameters) -> bool:
    """Whether every floating-point value of ``params`` is finite."""
    return all(bool(torch.isfinite(t).all()) for t in params.values() if t.is_floating_point())


__all__ = ["BIAS", "NONFINITE", "OUTLIER", "Contributed", "SyncGuard", "Verdict", "finite"]
