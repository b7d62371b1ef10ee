"""Peers a checked proof excludes, as the replicas act on them: not a holder for placement, not a
catch-up source, not a sync partner, no weight in a round, no hand-off pusher.

Checking a proof is a recompute (``experts/verdicts.py``), which the replicas never import: a
node hands its ``ReplicaManager`` and ``ReplicaSync`` the checker's book through the
``Exclusions`` protocol below, and the replicas only ask it. An accusation nobody could check is
not in it, so it changes nothing here."""

from __future__ import annotations

from typing import Mapping, Protocol

PROVEN_LIAR = "proven_liar"  # refusal reason: a checked proof excludes the peer


class Exclusions(Protocol):
    """Whether a checked proof excludes a peer (a PeerID or its text)."""

    def excluded(self, peer: object) -> bool: ...


class NoExclusions:
    """No proofs checked: nobody is excluded (a node without a verdict watcher, and tests)."""

    def excluded(self, peer: object) -> bool:
        return False


NO_EXCLUSIONS = NoExclusions()


def without_excluded(hosts: Mapping[str, Mapping[str, int]], exclusions: Exclusions) -> dict[str, dict[str, int]]:
    """``hosts`` (uid → {peer: version}) without the peers ``exclusions`` excludes."""
    return {uid: {peer: v for peer, v in holders.items() if not exclusions.excluded(peer)} for uid, holders in hosts.items()}


__all__ = ["NO_EXCLUSIONS", "PROVEN_LIAR", "Exclusions", "NoExclusions", "without_excluded"]
