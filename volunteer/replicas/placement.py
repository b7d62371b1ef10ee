"""Automatic placement: which grid experts this volunteer hosts. Pure functions, no clock.

``place`` takes the grids, the live hosts of each uid with their versions (from the DHT), this
volunteer's peer id, its capacity and what it hosts now, and says what to host:

- Spare capacity is filled least-replicated first: experts nobody hosts, then those below their
  grid's ``replicas``, then the rest (more replicas still serve more trainers).
- A re-check moves an expert only when some grid expert has fewer than ``replicas`` live hosts and
  this volunteer hosts one that has more than ``replicas``; at most ``max_moves`` per re-check.
  It never drops an expert it alone hosts (an over-replicated expert has other hosts).
- Ties break by a hash of (peer id, uid), so volunteers joining at once with the same view spread
  over different experts instead of all picking the first ones. When an expert has k hosts too
  many, only the k holders ranked first (stalest version, then that hash) may drop it, so holders
  re-checking at once never drop it below its target together.
- A move of a copy no update ever reached (version 0) to an expert nobody hosts costs nothing (no
  training is lost, nothing is downloaded) and is not counted against ``max_moves``: donors that
  started together with the same view undo all their duplicate picks at their first re-check.
- Re-checks are spread (``recheck_delay``): volunteers started together re-check one after the
  other, each seeing what the one before moved, instead of all moving to the same experts at once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from .config import DEFAULT_CONFIG, ReplicasConfig
from .grid import GridSpec

# uid → {peer id (str): version} of the hosts alive now; may include this volunteer itself
Hosts = Mapping[str, Mapping[str, int]]


def tie_break(peer: str, uid: str) -> int:
    """A stable pseudo-random rank of ``uid`` for ``peer`` (different peers order uids differently)."""
    return int.from_bytes(hashlib.sha256(f"{peer}\x00{uid}".encode()).digest()[:8], "big")


@dataclass(frozen=True)
class Placement:
    """What to host after a decision: ``host`` (everything), ``add`` (start hosting: catch up
    first), ``drop`` (stop hosting) and ``outside`` (hosted uids in no declared grid: kept, but
    the volunteer is warned)."""

    host: tuple[str, ...]
    add: tuple[str, ...]
    drop: tuple[str, ...]
    outside: tuple[str, ...]


def _others(hosts: Hosts, uid: str, me: str) -> dict[str, int]:
    return {peer: version for peer, version in hosts.get(uid, {}).items() if peer != me}


def place(
    grids: Sequence[GridSpec],
    hosts: Hosts,
    *,
    me: str,
    capacity: int,
    hosting: Collection[str] = (),
    max_moves: int = DEFAULT_CONFIG.max_moves_per_recheck,
    proven: Hosts | None = None,
) -> Placement:
    """Decide what to host (see the module docstring). ``hosting`` empty: a first placement.
    ``proven``: the hosts among ``hosts`` that proved they hold the state (default: all). Only
    they make a hosted copy droppable: a declaration and a dial are anyone's to give, and a copy
    dropped for squatters is lost; what to add still reads every declared host."""
    vouched = hosts if proven is None else proven
    target: dict[str, int] = {}
    for grid in grids:
        for uid in grid.uids():
            target.setdefault(uid, grid.replicas)
    kept = set(hosting)
    outside = tuple(sorted(uid for uid in kept if uid not in target))
    others = {uid: len(_others(hosts, uid, me)) for uid in target}

    def want_key(uid: str) -> tuple[int, int, int]:
        count = others[uid]
        tier = 0 if count == 0 else 1 if count < target[uid] else 2
        return (tier, count, tie_break(me, uid))

    add: list[str] = []
    spare = capacity - len(kept)
    if spare > 0:
        candidates = sorted((uid for uid in target if uid not in kept), key=want_key)
        add = candidates[:spare]

    drop: list[str] = []
    if kept:
        chosen = kept | set(add)
        under = sorted((uid for uid in target if uid not in chosen and others[uid] < target[uid]), key=want_key)
        over = sorted(
            (uid for uid in kept if uid in target and _may_drop(vouched, uid, me, target[uid])),
            key=lambda uid: (-(len(_others(vouched, uid, me)) + 1 - target[uid]), tie_break(me, uid)),
        )
        mine = {uid: hosts.get(uid, {}).get(me, 0) for uid in kept}
        moves = 0
        for new, old in zip(under, over):
            free = mine[old] == 0 and others[new] == 0  # an untrained copy to an unhosted expert
            if not free:
                if moves >= max(0, max_moves):
                    continue
                moves += 1
            add.append(new)
            drop.append(old)

    host = (kept - set(drop)) | set(add)
    return Placement(tuple(sorted(host)), tuple(add), tuple(drop), outside)


def _may_drop(hosts: Hosts, uid: str, me: str, replicas: int) -> bool:
    """Whether ``me`` is among the holders of an over-replicated ``uid`` allowed to leave it: the
    ``count - replicas`` first by (version, hash), so simultaneous re-checks agree."""
    holders = dict(hosts.get(uid, {}))
    holders.setdefault(me, 0)
    excess = len(holders) - replicas
    if excess <= 0 or len(holders) < 2:
        return False
    ranked = sorted(holders, key=lambda peer: (holders[peer], tie_break(peer, uid)))
    return me in ranked[:excess]


def recheck_delay(me: str, count: int, period: float, jitter: float) -> float:
    """How long volunteer ``me`` waits before its re-check number ``count``: ``period`` times a
    factor in [1 - jitter, 1 + jitter], pseudo-random but stable per (peer, count), so volunteers
    started together drift apart instead of re-checking in step."""
    share = tie_break(me, f"recheck-{count}") / 2**64
    return period * (1.0 - jitter + 2.0 * jitter * share)


def make_room_for(incoming: str, hosts: Hosts, *, me: str, hosting: Collection[str]) -> str | None:
    """Which hosted expert a full volunteer drops to take ``incoming``, a sole copy a leaver hands
    off: the one with the most other live hosts (ties: the stalest here, then by hash), and only
    one that keeps at least one other host. Two experts with a copy each beat one with two copies
    and one lost. None: every hosted expert is a sole copy too."""
    others = {uid: _others(hosts, uid, me) for uid in hosting if uid != incoming}
    held = [uid for uid, peers in others.items() if peers]
    if not held:
        return None
    mine = {uid: hosts.get(uid, {}).get(me, 0) for uid in held}
    return max(held, key=lambda uid: (len(others[uid]), -mine[uid], tie_break(me, uid)))


def catch_up_source(hosts: Hosts, uid: str, *, me: str) -> str | None:
    """The replica to download ``uid``'s state from: the freshest live one (highest version; ties
    by hash, so joiners spread over equally fresh replicas), or None when nobody else hosts it."""
    others = _others(hosts, uid, me)
    if not others:
        return None
    return max(others, key=lambda peer: (others[peer], -tie_break(me + peer, uid)))


VERSION_CLAIM = "version_claim"  # a version far above what the other replicas declare: not believed


def claim_is_suspect(version: int, others: Sequence[int], *, factor: float, margin: int) -> bool:
    """Whether ``version`` is more than ``factor`` times the lower median of ``others`` plus
    ``margin`` (no others: never)."""
    ranked = sorted(others)
    return bool(ranked) and version > factor * ranked[(len(ranked) - 1) // 2] + margin


def suspect_claims(claims: Mapping[str, int], *, factor: float, margin: int) -> frozenset[str]:
    """The peers whose declared version is far above what the other replicas declare: more than
    ``factor`` times the lower median of the others' plus ``margin``. A version is a claim
    nobody checks; one that outruns every other replica's by that much is suspect, not fresh."""
    return frozenset(
        peer for peer, version in claims.items()
        if claim_is_suspect(version, [v for p, v in claims.items() if p != peer], factor=factor, margin=margin)
    )


def catch_up_order(hosts: Hosts, uid: str, *, me: str, factor: float, margin: int) -> tuple[list[str], frozenset[str]]:
    """Whom to download ``uid``'s state from, in order, and which claims are suspect: the other
    live replicas freshest first (ties by hash, so joiners spread over equally fresh replicas),
    suspect claims (``suspect_claims``) after every other, never first."""
    others = _others(hosts, uid, me)
    suspects = suspect_claims(others, factor=factor, margin=margin)
    order = sorted(others, key=lambda peer: (peer in suspects, -others[peer], tie_break(me + peer, uid)))
    return order, suspects


def expert_memory_bytes(parameters: int, bytes_per_value: int = 4) -> int:
    """GPU memory one expert needs for training: its parameters, their gradients and Adam's two
    moments (activations of a batch come on top; callers keep a margin)."""
    return 4 * parameters * bytes_per_value


def capacity(
    *,
    max_experts: int | None = None,
    gpu_memory_bytes: int | None = None,
    bytes_per_expert: int | None = None,
    config: ReplicasConfig = DEFAULT_CONFIG,
) -> int:
    """How many experts to host: ``--max-experts`` if given; else what fits in the GPU memory
    allowed (``--max-gpu-memory``, or the device's); else ``config.default_capacity`` (no GPU)."""
    if max_experts is not None:
        return max(0, int(max_experts))
    if gpu_memory_bytes is not None and bytes_per_expert:
        return max(0, int(gpu_memory_bytes // bytes_per_expert))
    return config.default_capacity


__all__ = [
    "Hosts",
    "Placement",
    "capacity",
    "catch_up_order",
    "catch_up_source",
    "expert_memory_bytes",
    "make_room_for",
    "place",
    "recheck_delay",
    "suspect_claims",
    "tie_break",
]
