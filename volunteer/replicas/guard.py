"""What a sync round believes of the contributions it received: a pure policy over tensors (no
trio, no clock, no backend).

A replica that declares an expert can join its sync rounds, so a contribution is a claim, not a
fact. ``SyncGuard.decide`` screens a finished round's contributions and turns the rest into new
parameters and a version:

- **non-finite** values (NaN, ±inf) are refused outright (``sync_nonfinite``);
- **standing**: identities are free and so is patience, so standing is never bought with elapsed
  rounds of looking honest, nor with agreement: only **lineage** gives it. A peer has standing
  in an expert's rounds when we loaded its state (``vouch``: we caught up from it, or it
  corroborated what we loaded), or when it and we founded the expert together (a pair's very
  first round while our own copy is still an untrained initialisation, version 0: it becomes
  half of our state, as a catch-up source would be all of it). A peer that loaded *our* state
  proves nothing (anyone may fetch it), so standing is not symmetric. Any other peer, however
  long it stays within the drift and however many agree with it, is never weighed, never
  teaches the bound and is not followed (``unvouched`` in the verdict when within the bound);
  it still merges ours if it vouches for us, so honest followers follow their lineage. The cost:
  the training a follower receives reaches the replicas it loaded from only through the
  trainers' calls to it, never through their rounds;
- **distance**: each contribution's L2 distance from our own parameters is bounded by what honest
  replicas drift apart in a round, learned per expert: ``drift_slack`` times the larger of our
  own change since our last round (training and the last merge) and the median of the distances
  we merged in past rounds, each teaching at most ``sync_drift_own_share`` of our own typical
  training step when we train (peers that sit at the bound would otherwise teach that the drift
  is the bound, and it would ratchet up round by round). A peer with standing not merged last
  round (refused, or clipped) is held to twice that plus ``drift_slack`` times how far we moved since (unmerged, two honest replicas
  drift apart by what each moves); a peer without standing, never merged, is only labelled
  against twice the bound. Only when nothing is learned yet (a first round) is the bound a share
  of our own parameters' norm (``sync_bootstrap_share``: wide enough for two independent
  initialisations), and only a founding pair merges on it (an untrained copy and one peer: two
  volunteers that built the same expert at once must become one). A contribution past it is left
  out of the round (``sync_outlier``); refused distances never teach the bound. A peer with
  standing farther than the bound (back from a refusal) pulls us by one honest drift toward it (the
  bound over ``drift_slack``): standing never buys more than a round's honest drift;
- **bias** (among peers with standing: a catch-up source may be a liar too): what an honest replica adds between two rounds (its training steps) adds up no more
  steadily than our own steps; a liar that pushes one way adds the same again and again. Per
  peer, the guard follows its *innovation*, what its contribution added since we last met: its
  difference from our parameters when our last round merged it (both started from that round's
  result), or the change of that difference when it did not (unmerged, the difference is a
  random walk and only its increments are steps). An exponentially forgotten sum of the
  innovations is compared with the forgotten sum of their squared norms: for independent ones
  ``|sum|^2 / sum |x|^2`` stays near 1, for a fixed push it grows towards ``(1 + decay) / (1 -
  decay)``. A peer past ``sync_bias_ratio`` and past ``sync_bias_own_margin`` times the same
  ratio of our own steps (momentum makes every honest replica's steps add up alike), after
  ``sync_bias_rounds`` rounds, is left out of the round (``sync_bias``) when there is a witness: another peer that is not, or we ourselves, when we train
  between rounds. Only with three or more inputs, and its innovations are still followed, so a
  peer that stops pushing is taken back. A replica that alone receives all of an expert's
  training also moves steadily and may be left out the same way by the others: geometry alone
  cannot tell it from a liar;
- **aggregate**: what is left goes to an ``Aggregate`` (``aggregate.robust`` by default:
  CenteredClip from the coordinate-wise median with three or more inputs, the mean of a pair);
- **pull**: a push too patient for the bias test still has to move us, so when we train, the
  aggregate's result is held to what honest merges do, on the scale of our own typical training
  step (no peer sets it): a round moves us at most ``sync_pull_cap`` of it, and the steady part of
  what merges moved us is budgeted. Honest pulls add up no more steadily than our own steps, so
  the squared norm of their forgotten sum (at ``sync_pull_decay``) exceeds the forgotten sum of
  their squared norms by little (momentum allowed for: ``sync_pull_steadiness`` of the excess our
  own steps show); a push, at any rate, split over any identities, turning slowly or not, makes
  the excess grow with the square of how far it carried us. The part of a pull along the sum of past pulls that would take the excess past
  ``sync_steady_budget`` steps squared is dropped. Exempt: a pull back against our own steady
  training, up to our own steady rate (a replica that trains more than the others is brought
  back to them; a liar doing so only undoes our own steps);
- **version**: the lower median of the accepted inputs' versions (ours counts), never below our
  own: one peer's claim alone never raises it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from .aggregate import Aggregate, flatten, robust, unflatten
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
    used, who was within the bound but has no standing with us (nothing of it used) and who was
    refused (peer → reason), with the distance bound the round applied to peers with standing."""

    parameters: dict[str, torch.Tensor]
    version: int
    accepted: tuple[str, ...]
    refused: dict[str, str]
    bound: float
    unvouched: tuple[str, ...] = ()


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] if ordered else 0.0


@dataclass
class _Sums:
    """Forgotten sums of a series of vectors: their sum and the sum of their squared norms, each
    term weighed down by ``decay`` a round; ``weight`` is what a term of norm 1 a round adds up
    to (the squared norms' sum over it is their mean square)."""

    total: torch.Tensor | None = None
    energy: float = 0.0
    weight: float = 0.0
    rounds: int = 0

    def add(self, value: torch.Tensor, decay: float) -> None:
        if self.total is None or self.total.shape != value.shape:
            self.total, self.energy, self.weight, self.rounds = torch.zeros_like(value), 0.0, 0.0, 0
        self.total = self.total * decay + value
        self.energy = self.energy * decay * decay + float(value.norm()) ** 2
        self.weight = self.weight * decay * decay + 1.0
        self.rounds += 1

    def ratio(self, rounds: int) -> float:
        """``|sum|^2 / sum of |x|^2`` (near 1 for independent terms, up to ``(1 + decay) / (1 -
        decay)`` for a fixed one); 0 before ``rounds`` terms."""
        if self.total is None or self.rounds < rounds or self.energy <= 0:
            return 0.0
        return float(self.total.norm()) ** 2 / self.energy


@dataclass
class _PeerRecord:
    steps: _Sums = field(default_factory=_Sums)  # its innovations: what it did since we last met
    left: torch.Tensor | None = None  # what of its difference from us our last round left standing
    strikes: int = 0  # times it was left out for a steady push
    held: int = 0  # rounds within the bound and without a push it must still sit out after one
    apart: float = 0.0  # how far we moved (L2, summed) in the rounds since it was last merged


@dataclass
class _ExpertRecord:
    distances: deque = field(default_factory=deque)
    previous: torch.Tensor | None = None  # our parameters when our last round opened
    result: torch.Tensor | None = None  # the parameters our last round decided
    own: _Sums = field(default_factory=_Sums)  # our own steps since each round (training)
    pulls: _Sums = field(default_factory=_Sums)  # how each round's merge moved us
    peers: dict[str, _PeerRecord] = field(default_factory=dict)  # peers with standing we follow
    # peers with standing: whose state we loaded, oldest first (insertion order), bounded
    vouched: dict[str, None] = field(default_factory=dict)


class SyncGuard:
    """Per-expert memory of honest drift and of each peer's deviations; ``decide`` is the round's
    verdict (see the module docstring). Bounded: ``max_group`` vouched and followed peers and
    ``drift_history`` distances per expert; ``forget`` drops an expert no longer hosted."""

    def __init__(self, config: ReplicasConfig = DEFAULT_CONFIG) -> None:
        self.config = config
        self._experts: dict[str, _ExpertRecord] = {}

    def forget(self, uid: str) -> None:
        """Drop what was learned of ``uid`` (no longer hosted)."""
        self._experts.pop(uid, None)

    def bound(self, uid: str, own: torch.Tensor) -> float:
        """How far the contribution of a peer with standing may be from ``own`` (flattened) in this
        round of ``uid``."""
        record = self._experts.get(uid)
        return self._bound_for(self._drift(record, self._own_change(record, own)), own)

    def _bound_for(self, drift: float, own: torch.Tensor) -> float:
        """The bound for an honest ``drift`` (a share of our norm before any is learned)."""
        if drift > 0:
            return self.config.sync_drift_slack * drift
        return self.config.sync_bootstrap_share * float(own.norm())

    @staticmethod
    def _own_change(record: _ExpertRecord | None, own: torch.Tensor) -> float:
        """How far we moved since our last round opened (0: no round yet)."""
        if record is None or record.previous is None or record.previous.shape != own.shape:
            return 0.0
        return float((own - record.previous).norm())

    @staticmethod
    def _drift(record: _ExpertRecord | None, moved: float) -> float:
        """The honest drift this round's evidence shows (0: none yet): the larger of how far we
        ``moved`` since our last round and the median distance we merged."""
        return max(moved, _median(list(record.distances)) if record is not None else 0.0)

    def vouch(self, uid: str, peer: str) -> None:
        """Give ``peer`` standing in ``uid``'s rounds: we loaded its state (caught up from it, or
        it corroborated what we loaded), so our lineage is its. The only way to standing besides
        founding an expert together; the oldest of more than ``max_group`` is forgotten."""
        vouched = self._experts.setdefault(uid, _ExpertRecord()).vouched
        vouched.pop(peer, None)  # re-inserted: the newest lineage stays longest
        vouched[peer] = None
        while len(vouched) > self.config.max_group:
            del vouched[next(iter(vouched))]

    def established(self, uid: str, peer: str) -> bool:
        """Whether ``peer``'s contributions to ``uid`` carry weight: we loaded its state, or we
        founded ``uid`` together (elapsed rounds and agreement never give standing)."""
        record = self._experts.get(uid)
        return record is not None and peer in record.vouched

    def bias(self, uid: str, peer: str) -> float:
        """``|sum|^2 / sum of |.|^2`` of ``peer``'s innovations in ``uid``'s rounds (what its
        contribution added since we last met: its difference from us less what our last round
        left of it), both forgotten at ``sync_bias_decay`` a round; 0 before ``sync_bias_rounds``
        rounds."""
        record = self._experts.get(uid)
        stats = None if record is None else record.peers.get(peer)
        return 0.0 if stats is None else stats.steps.ratio(self.config.sync_bias_rounds)

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
        moved = self._own_change(record, mine)
        drift = self._drift(record, moved)
        bound = self._bound_for(drift, mine)
        # founders: an untrained copy's first round with a single peer (two volunteers that built
        # the same expert at once must become one); the peer becomes half our state, so our lineage
        founding = drift <= 0 and own_version == 0 and len(candidates) == 1 and not record.vouched
        if founding:
            self.vouch(uid, candidates[0][0].peer)
        within: list[tuple[Contributed, torch.Tensor, float]] = []
        unvouched: list[str] = []
        for contribution, flat in candidates:
            distance = float((flat - mine).norm())
            if not self.established(uid, contribution.peer):
                # never weighed, only labelled: within what two unmerged honest replicas drift
                if distance <= 2 * bound:
                    unvouched.append(contribution.peer)
                else:
                    refused[contribution.peer] = OUTLIER
                continue
            stats = record.peers.get(contribution.peer)
            allowed = bound
            if stats is not None and stats.apart > 0:
                # not merged last round: two honest replicas drift apart by what each moved since
                allowed = 2 * bound + self.config.sync_drift_slack * stats.apart
            if distance <= allowed:
                within.append((contribution, flat, distance))
            else:
                refused[contribution.peer] = OUTLIER
        standing = [c for c, _ in candidates if self.established(uid, c.peer)]
        if record.result is not None and record.result.shape == mine.shape:
            record.own.add(mine - record.result, self.config.sync_bias_decay)
        witness = self._trains(record)
        if len(standing) + 1 >= 3:
            biased = [c.peer for c, _, _ in within if self._biased(record, c.peer)]
            # a witness: some peer does not move steadily from us, or we train, and a difference
            # steadier than our own steps is the peers' push, not our training
            if len(biased) < len(within) or witness:
                for peer in biased:
                    refused[peer] = BIAS
                    stats = record.peers.setdefault(peer, _PeerRecord())  # out for longer each time
                    stats.strikes = min(stats.strikes + 1, self.config.sync_bias_rounds)
                    stats.held = (stats.strikes + 1) * self.config.sync_bias_rounds
        for contribution, _, _ in within:  # caught pushing before: it sits its rounds out first
            stats = record.peers.get(contribution.peer)
            if contribution.peer not in refused and stats is not None and stats.held > 0:
                stats.held -= 1
                refused[contribution.peer] = BIAS
                stats.apart += moved  # unmerged, it and we drift apart by what each moves
        accepted = [w for w in within if w[0].peer not in refused]
        # a peer back from a refusal may be farther than the bound: its pull on us is clipped to
        # one honest drift, so standing never buys more than a round's honest drift
        reach = bound / self.config.sync_drift_slack  # one honest drift
        pulled = {c.peer: 1.0 if distance <= bound else reach / distance for c, _, distance in accepted}
        parameters = aggregate(own, [
            c.tensors if pulled[c.peer] >= 1.0 else unflatten(mine + (flat - mine) * pulled[c.peer], own, names)
            for c, flat, distance in accepted
        ])
        result = flatten(parameters, names) if accepted else mine
        steady = self._steady(record, mine, result - mine, witness)  # a round without a merge too
        if steady is not None:
            result = steady
            parameters = unflatten(result, own, names)
        for contribution, _, distance in accepted:  # a clipped pull leaves the rest still apart
            record.peers.setdefault(contribution.peer, _PeerRecord()).apart = (
                max(0.0, distance - bound) / self.config.sync_drift_slack
            )
        # differences are followed only where the bias test applies (three or more inputs with
        # standing) and only for peers with standing: in a pair, or for a peer never weighed,
        # they would cost a copy of the parameters for nothing
        followed = [(c.peer, flat) for c, flat in candidates
                    if self.established(uid, c.peer) and refused.get(c.peer, BIAS) == BIAS]
        if len(standing) + 1 < 3:
            followed = []
        # a bootstrap distance is no drift, and a clipped pull teaches no more than the bound;
        # when we train, no more than our own steps show either (peers at the bound would
        # otherwise teach that the drift is the bound, and it would ratchet up round by round)
        teach = self._teachable(record, bound)
        learned = [] if founding else [min(d, teach) for _, _, d in accepted]
        self._learn(record, mine, learned, followed, pulled)
        record.result = result
        versions = sorted([own_version] + [c.version for c, _, _ in accepted])
        version = max(own_version, versions[(len(versions) - 1) // 2])
        return Verdict(
            dict(parameters), version, tuple(c.peer for c, _, _ in accepted), refused, bound, tuple(unvouched)
        )

    def _learn(
        self,
        record: _ExpertRecord,
        mine: torch.Tensor,
        distances: Sequence[float],
        followed: Sequence[tuple[str, torch.Tensor]],
        pulled: Mapping[str, float],
    ) -> None:
        record.previous = mine
        record.distances.extend(distances)
        while len(record.distances) > self.config.sync_drift_history:
            record.distances.popleft()
        for peer, flat in followed:
            stats = record.peers.setdefault(peer, _PeerRecord())
            difference = flat - mine
            left = stats.left if stats.left is not None and stats.left.shape == difference.shape else None
            # its innovation: an honest peer's own steps since we last met, independent from round
            # to round whether we merged it (then we both started from our last result) or not
            # (then its difference from us is a random walk, and only its increments are steps)
            stats.steps.add(difference if left is None else difference - left, self.config.sync_bias_decay)
            share = pulled.get(peer, 0.0)  # how much of the difference we merged (it did as much)
            stats.left = None if share >= 1.0 else difference * max(0.0, 1.0 - 2.0 * share)
        for peer in list(record.peers):  # only peers with standing are followed
            if peer not in record.vouched:
                del record.peers[peer]

    def _biased(self, record: _ExpertRecord, peer: str) -> bool:
        """Whether ``peer``'s innovations add up more steadily than honest ones would: past
        ``sync_bias_ratio``, and past ``sync_bias_own_margin`` times our own steps' ratio (an
        optimizer with momentum makes every honest replica's steps, and so their differences,
        add up alike)."""
        stats = record.peers.get(peer)
        if stats is None:
            return False
        own = record.own.ratio(self.config.sync_bias_rounds)
        limit = max(self.config.sync_bias_ratio, self.config.sync_bias_own_margin * own)
        return stats.steps.ratio(self.config.sync_bias_rounds) > limit

    def _teachable(self, record: _ExpertRecord, bound: float) -> float:
        """The most a merged distance may teach the drift: ``sync_drift_own_share`` of our own
        typical training step when we train (two honest replicas that train alike drift apart
        by about sqrt(2) of a step; a peer that trains more than we do is still merged, it only
        teaches no wider bound), else the bound (an idle replica has no step of its own)."""
        if record.own.weight <= 0 or record.own.energy <= 0:
            return bound
        step = (record.own.energy / record.own.weight) ** 0.5
        return min(bound, self.config.sync_drift_own_share * step)

    def _trains(self, record: _ExpertRecord) -> bool:
        """Whether we take steps of our own between rounds (training, not merges): then a peer
        whose innovations add up more steadily than our own steps is pushing, whoever else agrees
        with it, and our own typical step is a scale no peer sets. An idle replica witnesses
        nothing: steady training on the others is what it should follow."""
        return record.own.rounds >= self.config.sync_bias_rounds and record.own.energy > 0

    def _steady(
        self, record: _ExpertRecord, mine: torch.Tensor, pull: torch.Tensor, trains: bool
    ) -> torch.Tensor | None:
        """Our parameters after this round's merge ``pull``, held to what honest merges do; None:
        the pull stands (it is followed either way).

        Only when we ``trains`` (our own typical step is then a scale no peer sets). A round's
        pull is at most ``sync_pull_cap`` of that step. Honest pulls add up about as steadily as
        our own steps: the forgotten sum of them has a squared norm near the forgotten sum of their
        squared norms, more with momentum (``sync_pull_steadiness`` of our own steps' excess ratio
        is allowed). A patient push, at any rate,
        turning slowly or not, makes the excess grow with the square of how far it carried us;
        held to ``sync_steady_budget`` of our step, it carries us about that far, however its
        steps are split across rounds and identities. Exempt: a pull back against our own steady
        training by up to our own steady rate (a replica that trains more than the others is
        brought back to them; a liar doing so only undoes our own steps)."""
        trained = record.own.total
        if not trains or trained is None or trained.shape != pull.shape or record.own.weight <= 0:
            record.pulls.add(pull, self.config.sync_pull_decay)
            return None
        step = (record.own.energy / record.own.weight) ** 0.5  # our typical training step
        own_ratio = max(1.0, record.own.ratio(self.config.sync_bias_rounds))
        size = float(trained.norm())  # our forgotten steps' sum: (1 - decay) of it, our steady rate
        back = torch.zeros_like(pull)
        along = float(pull @ trained) / size if size > 0 else 0.0
        if along < 0:  # against our own steady training: exempt up to our steady rate
            back = trained * (max(along, -size * (1 - self.config.sync_bias_decay)) / size)
        rest = pull - back
        changed = False
        size = float(rest.norm())
        if size > self.config.sync_pull_cap * step:
            rest, changed = rest * (self.config.sync_pull_cap * step / size), True
        pulls, decay = record.pulls, self.config.sync_pull_decay
        if pulls.total is not None and pulls.total.shape == rest.shape:
            total = float(pulls.total.norm())
            excess = total ** 2 - pulls.energy
            # a share of what our own steps' steadiness (momentum) lets honest pulls add up to
            steadiness = self.config.sync_pull_steadiness * (own_ratio - 1.0) * pulls.energy
            allowed = steadiness + (self.config.sync_steady_budget * step) ** 2
            room = max(0.0, allowed - decay * decay * excess)
            along = float(rest @ pulls.total) / total if total > 0 else 0.0
            if total > 0 and 2 * decay * total * along > room:
                rest, changed = rest - (along - room / (2 * decay * total)) * (pulls.total / total), True
        pulls.add(rest, decay)
        return mine + back + rest if changed else None


def finite(params: Parameters) -> bool:
    """Whether every floating-point value of ``params`` is finite."""
    return all(bool(torch.isfinite(t).all()) for t in params.values() if t.is_floating_point())


__all__ = ["BIAS", "NONFINITE", "OUTLIER", "Contributed", "SyncGuard", "Verdict", "finite"]
