"""Who each connection is, for the dashboard: a relay, a volunteer, a trainer, or some other peer.

Told from what we know without asking: our relay reservations, the peers our expert server
answered (trainers), and identify's protocol list (relays speak circuit-relay hop; volunteers
serve this swarm's DHT or experts). Pure: the host is only read.
"""

from __future__ import annotations

from typing import Any, Container

from ..net.identity import PeerID
from ..net.nat.circuit import HOP

RELAY, TRAINER, VOLUNTEER, PEER = "relay", "trainer", "volunteer", "peer"


def role_of(peer_id: str, protocols: frozenset[str], *, swarm_id: str, relays: Container[str], served: Container[str]) -> str:
    """The role of one peer; a relay we hold a reservation on stays a relay even if it also serves a DHT."""
    if peer_id in relays or HOP in protocols:
        return RELAY
    if peer_id in served:
        return TRAINER
    # every protocol a volunteer serves (DHT, experts, replicas) lives under /volunteer/<swarm>/;
    # a trainer (a DHT client) advertises none of them
    prefix = f"/volunteer/{swarm_id}/"
    if any(str(p).startswith(prefix) for p in protocols):
        return VOLUNTEER
    return PEER


def classify_connections(rows: list[dict], host: Any, swarm_id: str, reachability: dict | None,
                         served: Container[str]) -> list[dict]:
    """``rows`` (``connections_view``'s) with a ``role`` each."""
    relays = {str(r.get("peer_id")) for r in (reachability or {}).get("relays", []) if r.get("peer_id")}
    for row in rows:
        peer = row.get("peer_id") or ""
        info = None
        try:
            info = host.peerstore.get(PeerID.from_string(peer)) if host is not None else None
        except Exception:  # an id we cannot parse back: no protocols known
            info = None
        protocols = frozenset(getattr(info, "protocols", None) or ())
        row["role"] = role_of(peer, protocols, swarm_id=swarm_id, relays=relays, served=served)
    return rows


__all__ = ["PEER", "RELAY", "TRAINER", "VOLUNTEER", "classify_connections", "role_of"]
