"""How far a trainer trusts the volunteers it calls: the vocabulary and the streak policy.

Every host of an expert stands, for one trainer, in one of six ``Standing``\\ s:

- **unproven**: it only declared that it hosts the expert;
- **proven**: it has shown that it holds the expert's state: one of its replies passed an audit
  (it matched another replica's answer to the same inputs, or a recomputation);
- **suspect**: a check failed and no third opinion has settled who was wrong yet (or none can);
- **outvoted**: its reply differed from two other replicas' that agreed (``audit.py``): not
  called for this expert any more. One outvote is not yet a verdict on the peer: honest replicas
  of a fast-training expert whose syncs fail for a while drift apart further than usual
  (measured: direction gaps up to 0.77 on a loaded machine), but only for that expert;
- **stale**: it claims no recent sync and two replicas that claim one outvoted its reply: honest
  but left behind, or lying behind that claim, it is not called for this expert until it declares
  a recent sync again (``audit.py``);
- **excluded**: it was caught (a non-finite reply, outvoted on ``outvotes_to_exclude`` different
  experts, or replies out of any plausible range again and again) and this trainer calls it no more.

Exclusion is per peer: a host caught lying about one expert is trusted with none. Results are
"audited", never "verified": an audit compares replicas within a tolerance, it proves nothing.

How often a host is audited follows BOINC's adaptive replication: a peer is **trusted** after
``trust_after`` valid results in a row (audits it passed), and from then on re-checked with
probability ``1/streak``, never below ``audit_rate``; an untrusted peer, a pair (uid, peer) not yet
proven and a suspect pair are checked at the higher ``untrusted_rate`` / ``suspect_rate``. A failed
check (a reply the guard rejected, a disagreement) ends the streak.

A new identity costs an attacker nothing, so a peer's record starts empty, not clean: a **fresh**
peer (fewer than ``prove_after`` audits passed, on any of its experts) has every reply audited
(``fresh_rate``) and is picked with ``fresh_weight`` only, a tenth of a proven host's. A liar that
rejoins under a fresh key each time it is excluded is caught on its first audited lie, which is
its first reply, and meanwhile it is called sparingly; an honest joiner passes its first few audits
in as many replies and is weighed as usual from then on.

``TrustLedger`` is pure: no clock, no trio, no torch. Callers report what they observed and read
back standings, audit probabilities and pick weights. Its tables are bounded (least recently seen
forgotten first; an exclusion is remembered longest).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, fields

from ..errors import ExpertConfigError
from .standing import Standing


@dataclass(frozen=True)
class TrustPolicy:
    """The streak policy's numbers (BOINC's adaptive replication) and the ledger's bounds."""

    audit_rate: float = 0.02  # the floor of a trusted peer's re-check probability
    untrusted_rate: float = 0.2  # a peer short of ``trust_after``, or a pair not yet proven
    suspect_rate: float = 0.5  # a pair whose last check failed and was not settled
    fresh_rate: float = 1.0  # a peer that has passed fewer than ``prove_after`` audits
    trust_after: int = 10  # valid results in a row that make a peer trusted
    prove_after: int = 3  # audits a peer passes (any expert) before it weighs more than ``fresh_weight``
    # weights a mixture multiplies into its choice among an expert's replicas
    proven_weight: float = 1.0
    unproven_weight: float = 0.5
    suspect_weight: float = 0.2
    fresh_weight: float = 0.1  # a fresh peer's, on any expert (identities are free)
    # replies of one peer in a row that the guard rejected as implausible (no accepted reply of
    # it in between) that exclude it: an honest host's reply is out of range rarely, never 8 in a row
    guard_strikes: int = 8
    # experts on which two other replicas outvoted a peer's reply that exclude it (a liar lies on
    # every expert it serves; an honest replica drifts off on one at a time)
    outvotes_to_exclude: int = 2
    max_pairs: int = 65536  # (uid, peer) records kept
    max_peers: int = 16384  # peer records kept, and exclusions remembered

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ExpertConfigError(f"TrustPolicy.{f.name} must be a non-negative number, got {value!r}")
        for name in ("audit_rate", "untrusted_rate", "suspect_rate", "fresh_rate"):
            if getattr(self, name) > 1:
                raise ExpertConfigError(f"TrustPolicy.{name} is a probability, got {getattr(self, name)!r}")
        if min(self.trust_after, self.guard_strikes, self.outvotes_to_exclude, self.max_pairs, self.max_peers) < 1:
            raise ExpertConfigError(
                "TrustPolicy: trust_after, guard_strikes, outvotes_to_exclude, max_pairs and max_peers must be >= 1"
            )


DEFAULT_POLICY = TrustPolicy()


@dataclass
class PairRecord:
    """What a trainer has seen of one host serving one expert."""

    standing: Standing = Standing.UNPROVEN
    passed: int = 0  # audits it passed
    disagreed: int = 0  # audits where it disagreed with another replica
    rejected: int = 0  # replies the guard rejected


@dataclass
class PeerRecord:
    """What a trainer has seen of one host, over every expert it serves."""

    streak: int = 0  # valid results in a row
    replies: int = 0  # replies the guard checked
    excluded_after: int | None = None  # replies checked when it was excluded
    proof: bool = False  # excluded on a proof (a recompute contradicted a reply it signed)
    passed: int = 0
    exact: int = 0  # of those, exact audits (a recompute from the state it signed)
    disagreed: int = 0
    rejected: int = 0
    # guard rejections since the last accepted reply of the same kind (outputs, input gradients):
    # a host that lies in backwards only is not cleared by its honest forwards in between
    rejected_in_a_row: dict[str, int] = field(default_factory=dict)
    outvoted_on: list[str] = field(default_factory=list)  # experts it was outvoted on (distinct)

    def trusted(self, policy: TrustPolicy) -> bool:
        """Whether the peer has earned the low re-check rate."""
        return self.streak >= policy.trust_after

    def fresh(self, policy: TrustPolicy) -> bool:
        """Whether the peer has passed fewer than ``prove_after`` audits: a new identity, which
        costs nothing to make, and weighs (almost) nothing until proven."""
        return self.passed < policy.prove_after

    def under_suspicion(self, policy: TrustPolicy) -> bool:
        """Outvoted on an expert and not trusted again since (``trust_after`` audits passed in a
        row): checked and picked as a suspect on its other experts."""
        return bool(self.outvoted_on) and not self.trusted(policy)


class TrustLedger:
    """Standings and streaks of the hosts one trainer calls (see the module docstring)."""

    def __init__(self, policy: TrustPolicy = DEFAULT_POLICY) -> None:
        self.policy = policy
        self._pairs: OrderedDict[tuple[str, str], PairRecord] = OrderedDict()
        self._peers: OrderedDict[str, PeerRecord] = OrderedDict()
        self._excluded: OrderedDict[str, str] = OrderedDict()  # peer -> why

    # --- reading -------------------------------------------------------------------------------
    def excluded(self, peer: str) -> bool:
        """Whether ``peer`` was caught and is no longer called."""
        return peer in self._excluded

    def exclusion_reason(self, peer: str) -> str | None:
        """Why ``peer`` was excluded (None if it was not)."""
        return self._excluded.get(peer)

    def standing(self, uid: str, peer: str) -> Standing:
        """``peer``'s standing as a host of ``uid``."""
        if peer in self._excluded:
            return Standing.EXCLUDED
        pair = self._pairs.get((uid, peer))
        return pair.standing if pair is not None else Standing.UNPROVEN

    def peer_standing(self, peer: str) -> Standing:
        """Excluded; else suspect if any of its experts is; else proven if any is; else unproven."""
        if peer in self._excluded:
            return Standing.EXCLUDED
        return _overall(pair.standing for (_, p), pair in self._pairs.items() if p == peer)

    def trusted(self, peer: str) -> bool:
        """Whether ``peer`` has ``trust_after`` valid results in a row."""
        record = self._peers.get(peer)
        return record is not None and record.trusted(self.policy)

    def audit_probability(self, uid: str, peer: str) -> float:
        """The chance that a reply of ``peer`` for ``uid`` is audited (0 once excluded)."""
        policy = self.policy
        if peer in self._excluded:
            return 0.0
        pair = self._pairs.get((uid, peer))
        record = self._peers.get(peer)
        rate = self._audit_rate(pair, record)
        if self._fresh(record):
            # every reply of a new identity until it has passed a few: a rejoined liar's first lie is caught
            return max(rate, policy.fresh_rate)
        return rate

    def at_floor(self, uid: str, peer: str) -> bool:
        """Whether audits of ``peer`` serving ``uid`` are at the trusted floor: a proven pair of a
        trusted peer, neither fresh nor under suspicion. Only these may a cost budget thin out;
        every audit that earns or questions a standing runs whatever it costs."""
        policy = self.policy
        pair = self._pairs.get((uid, peer))
        record = self._peers.get(peer)
        if peer in self._excluded or pair is None or record is None or self._fresh(record):
            return False
        if record.under_suspicion(policy) or pair.standing is not Standing.PROVEN:
            return False
        return record.trusted(policy)

    def _audit_rate(self, pair: PairRecord | None, record: PeerRecord | None) -> float:
        policy = self.policy
        suspicious = record is not None and record.under_suspicion(policy)
        if suspicious or (pair is not None and pair.standing is Standing.SUSPECT):
            # a peer outvoted on one expert is checked as a suspect on all the others until it is
            # trusted again: a liar's second outvote comes soon, an honest replica's streak rebuilds
            return max(policy.audit_rate, policy.suspect_rate)
        if pair is None or pair.standing is not Standing.PROVEN or record is None or not record.trusted(policy):
            return max(policy.audit_rate, policy.untrusted_rate)
        return max(policy.audit_rate, min(1.0, 1.0 / record.streak))

    def pick_weight(self, uid: str, peer: str) -> float:
        """A factor for choosing ``peer`` among ``uid``'s replicas: 0 once excluded or stale,
        less for unproven and suspect hosts than for proven ones, and least for a fresh peer."""
        standing = self.standing(uid, peer)
        record = self._peers.get(peer)
        suspicious = record is not None and record.under_suspicion(self.policy)
        if standing in (Standing.UNPROVEN, Standing.PROVEN) and suspicious:
            standing = Standing.SUSPECT  # outvoted on another expert: picked as a suspect here
        weight = {
            Standing.EXCLUDED: 0.0,
            Standing.OUTVOTED: 0.0,
            Standing.STALE: 0.0,
            Standing.SUSPECT: self.policy.suspect_weight,
            Standing.UNPROVEN: self.policy.unproven_weight,
            Standing.PROVEN: self.policy.proven_weight,
        }[standing]
        if weight > 0.0 and self._fresh(record):
            return min(weight, self.policy.fresh_weight)
        return weight

    # --- what was observed -------------------------------------------------------------------
    def passed(self, uid: str, peer: str, *, exact: bool = False) -> None:
        """A reply of ``peer`` for ``uid`` passed an audit (``exact``: a recompute from the state
        it signed, ``audit.py``): a valid result, the pair is proven."""
        if peer in self._excluded:
            return
        pair, record = self._pair(uid, peer), self._peer(peer)
        if pair.standing is not Standing.OUTVOTED:  # a verdict stands (an audit in flight may end later)
            pair.standing = Standing.PROVEN
        pair.passed += 1
        record.passed += 1
        record.exact += exact
        record.streak += 1

    def exact_passed(self, peer: str) -> int:
        """Exact audits ``peer`` passed: the proven work a judge or a contributor is weighed by."""
        record = self._peers.get(peer)
        return 0 if record is None or peer in self._excluded else record.exact

    def disagreed(self, uid: str, peer: str) -> None:
        """A reply of ``peer`` for ``uid`` disagreed with another replica's: the pair is suspect
        until a later audit passes, and the peer's streak starts over."""
        if peer in self._excluded:
            return
        pair, record = self._failed_check(uid, peer)
        if pair.standing not in (Standing.STALE, Standing.OUTVOTED):  # a disagreement is no news
            pair.standing = Standing.SUSPECT

    def outvoted(self, uid: str, peer: str) -> bool:
        """Two other replicas of ``uid`` agreed and ``peer``'s reply differed from both: the pair
        is outvoted (not picked for ``uid`` again). Returns True when that makes
        ``outvotes_to_exclude`` experts: the caller then excludes the peer."""
        if peer in self._excluded:
            return False
        pair, record = self._failed_check(uid, peer)
        pair.standing = Standing.OUTVOTED
        if uid not in record.outvoted_on:
            record.outvoted_on.append(uid)
        return len(record.outvoted_on) >= self.policy.outvotes_to_exclude

    def outvoted_on(self, peer: str) -> list[str]:
        """The experts on which ``peer`` was outvoted, first first."""
        record = self._peers.get(peer)
        return list(record.outvoted_on) if record is not None else []

    def stale(self, uid: str, peer: str) -> bool:
        """``peer`` claims no recent sync of ``uid`` and aligned replicas outvoted its reply: not
        picked for ``uid`` until ``realigned``. False if it already was stale (or is excluded)."""
        if peer in self._excluded:
            return False
        if self._pair(uid, peer).standing in (Standing.STALE, Standing.OUTVOTED):
            return False
        pair, _ = self._failed_check(uid, peer)
        pair.standing = Standing.STALE
        return True

    def realigned(self, uid: str, peer: str) -> None:
        """``peer`` declares a recent sync of ``uid`` again: a stale pair is unproven (and audited
        strictly) from now on."""
        pair = self._pairs.get((uid, peer))
        if pair is not None and pair.standing is Standing.STALE:
            pair.standing = Standing.UNPROVEN

    def replied(self, peer: str) -> None:
        """A reply of ``peer`` arrived and is being checked."""
        self._peer(peer).replies += 1

    def accepted(self, peer: str, kind: str = "") -> None:
        """A reply of ``peer`` passed the guard (its guard rejections in a row of that ``kind``
        start over)."""
        record = self._peers.get(peer)
        if record is not None:
            record.rejected_in_a_row.pop(kind, None)
            self._peers.move_to_end(peer)

    def rejected(self, uid: str, peer: str, kind: str = "") -> bool:
        """The guard rejected a reply of ``peer`` for ``uid`` as implausible: an invalid result.
        Returns True when that makes ``guard_strikes`` of that ``kind`` in a row (whatever
        replies of other kinds passed in between): the caller then excludes it."""
        if peer in self._excluded:
            return False
        pair, record = self._pair(uid, peer), self._peer(peer)
        pair.rejected += 1
        record.rejected += 1
        in_a_row = record.rejected_in_a_row[kind] = record.rejected_in_a_row.get(kind, 0) + 1
        record.streak = 0
        return in_a_row >= self.policy.guard_strikes

    def exclude(self, peer: str, reason: str, *, proof: bool = False) -> bool:
        """Exclude ``peer`` for ``reason`` (``proof``: a recompute contradicted a reply it
        signed, ``audit.py``); False if it already was (the first reason stays)."""
        if peer in self._excluded:
            return False
        self._excluded[peer] = reason
        self._peer(peer).excluded_after = self._peer(peer).replies
        self._peer(peer).proof = proof
        while len(self._excluded) > self.policy.max_peers:
            self._excluded.popitem(last=False)
        return True

    # --- the per-peer view ---------------------------------------------------------------------
    def report(self) -> dict[str, dict]:
        """Per peer: standing, streak, trusted, audits passed and failed, replies rejected, why it
        was excluded, the experts it was outvoted on, and its standing per expert."""
        peers = set(self._peers) | set(self._excluded)
        experts: dict[str, dict[str, Standing]] = {}
        for (uid, peer), pair in self._pairs.items():
            experts.setdefault(peer, {})[uid] = Standing.EXCLUDED if peer in self._excluded else pair.standing
        out = {}
        for peer in sorted(peers):
            record = self._peers.get(peer) or PeerRecord()
            mine = experts.get(peer, {})
            overall = Standing.EXCLUDED if peer in self._excluded else _overall(mine.values())
            out[peer] = {
                "standing": overall.value,
                "replies": record.replies,
                "excluded_after_replies": record.excluded_after,
                "streak": record.streak,
                "trusted": record.trusted(self.policy),
                "fresh": peer not in self._excluded and record.fresh(self.policy),
                "audits_passed": record.passed,
                "exact_audits_passed": record.exact,
                "audits_disagreed": record.disagreed,
                "replies_rejected": record.rejected,
                "excluded_because": self._excluded.get(peer),
                "excluded_on_proof": record.proof,
                "outvoted_on": list(record.outvoted_on),
                "experts": {uid: standing.value for uid, standing in sorted(mine.items())},
            }
        return out

    # --- tables ---------------------------------------------------------------------------------
    def _pair(self, uid: str, peer: str) -> PairRecord:
        return _touch(self._pairs, (uid, peer), PairRecord, self.policy.max_pairs)

    def _peer(self, peer: str) -> PeerRecord:
        return _touch(self._peers, peer, PeerRecord, self.policy.max_peers)

    def _fresh(self, record: PeerRecord | None) -> bool:
        return (record or PeerRecord()).fresh(self.policy)

    def _failed_check(self, uid: str, peer: str) -> tuple[PairRecord, PeerRecord]:
        """Count a check ``peer``'s reply for ``uid`` failed (on the pair and the peer; its
        streak starts over); returns the pair's and the peer's records."""
        pair, record = self._pair(uid, peer), self._peer(peer)
        pair.disagreed += 1
        record.disagreed += 1
        record.streak = 0
        return pair, record


def _touch(table: OrderedDict, key, make, bound: int):
    """``table[key]``, made if missing, as the most recently used; the least recent go past ``bound``."""
    record = table.get(key)
    if record is None:
        record = table[key] = make()
        while len(table) > bound:
            table.popitem(last=False)
    else:
        table.move_to_end(key)
    return record


def _overall(standings) -> Standing:
    found = set(standings)
    for standing in (Standing.OUTVOTED, Standing.SUSPECT, Standing.STALE, Standing.PROVEN):
        if standing in found:
            return standing
    return Standing.UNPROVEN


__all__ = ["DEFAULT_POLICY", "PairRecord", "PeerRecord", "Standing", "TrustLedger", "TrustPolicy"]
