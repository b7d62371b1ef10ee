"""The swarm health page's model, pure: what a relay observed of its swarms in, the page's
figures out. No trio, no clock: ``now`` is passed in.

``SwarmObservation`` is one background refresh's catch for one swarm: the live declarations of
each grid's experts, the volunteers' public profiles (``volunteer.dht.profile``), the trainers'
vouches (``volunteer.dht.vouches``: the contributors' credit) and which entry points
(relays, bootstrap peers) answered. ``swarm_model`` turns it into the dict that the
HTML page, the JSON endpoint and the Prometheus collector all show, so the three never disagree.

What the model publishes is public by construction: peer ids (already public in the DHT), how a
volunteer is reached (direct or relayed, never its addresses), and names only of volunteers who
chose one (``volunteer join --name``). Entry points' addresses come from the swarm file, which
is public.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from volunteer.dht.grid import Declaration
from volunteer.dht.profile import Profile
from volunteer.dht.vouches import HALF_LIFE, Ledger, Vouch
from volunteer.net.multiaddr import Multiaddr
from volunteer.swarmfile import GridSpec

TOP_CONTRIBUTORS = 25  # contributors listed, most vouched calls first (the JSON counts every one)
MAX_VOLUNTEER_ROWS = 200  # volunteers listed on the page (the JSON counts every one)
MISSING, UNDER, COVERED = "missing", "under-replicated", "covered"


@dataclass(frozen=True)
class PeerCheck:
    """One entry point of the swarm (a relay or a bootstrap peer) and whether it answered."""

    role: str  # "relay", "bootstrap", or both ("relay, bootstrap")
    addr: str
    up: bool
    last_seen: float | None = None  # wall clock of its last answer
    is_self: bool = False  # the relay serving this page


@dataclass
class _EntryPoint:
    """One entry point peer while its addresses are merged into a ``PeerCheck``."""

    addr: str  # the first of its addresses, in the swarm file's order
    is_self: bool
    roles: list[str] = field(default_factory=list)
    up: bool = False  # any of its addresses answered
    last_seen: float | None = None  # the latest of their answers

    def add(self, role: str, up: bool, seen: float | None) -> None:
        if role not in self.roles:
            self.roles.append(role)
        self.up = self.up or up
        if seen is not None and (self.last_seen is None or seen > self.last_seen):
            self.last_seen = seen

    def check(self) -> PeerCheck:
        return PeerCheck(", ".join(self.roles), self.addr, self.up, self.last_seen, self.is_self)


def entry_point_checks(roles: Sequence[tuple[str, Sequence[Multiaddr]]], own: object, answered: Mapping[str, bool],
                       last_seen: Mapping[str, float]) -> list[PeerCheck]:
    """One row per entry point *peer*, in the swarm file's order: a peer named as relay and as
    bootstrap (or at several addresses) is one entry point, with its roles joined, up when any of
    its addresses answered, and the latest answer of them. ``own``: this relay's peer ID."""
    points: dict[object, _EntryPoint] = {}  # peer (or the address, without one) -> its merged row
    for role, addrs in roles:
        for addr in addrs:
            text = str(addr)
            peer = addr.peer_id
            is_self = peer is not None and peer == own
            point = points.setdefault(peer if peer is not None else text, _EntryPoint(text, is_self))
            point.add(role, is_self or answered.get(text, False), last_seen.get(text))
    return [point.check() for point in points.values()]


@dataclass(frozen=True)
class SwarmObservation:
    """What one refresh saw of one swarm (``observed_at``: wall clock). ``complete`` is False
    when a lookup ran out of its time bound: the page then says its figures may be partial."""

    swarm_id: str
    grids: Sequence[GridSpec] = ()
    experts: Mapping[str, Sequence[Declaration]] = field(default_factory=dict)  # uid -> live hosts
    profiles: Mapping[str, Profile] = field(default_factory=dict)  # peer id (text) -> profile
    vouches: Sequence[Vouch] = ()  # trainers' vouches found this refresh (unchecked: the ledger checks)
    # the swarm's shared verdicts as this relay checked them (``volunteer.experts.verdicts``):
    # peer -> {"accuser", "uid", "reason"} of each peer a proof excludes, and accusations refused
    excluded: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    accusations_refused: int = 0
    entry_points: Sequence[PeerCheck] = ()
    observed_at: float = 0.0
    complete: bool = True


def is_relayed(decl: Declaration) -> bool:
    """Whether a host declares only relayed addresses (reachable through a relay, not directly)."""
    if not decl.addrs:
        return False
    for raw in decl.addrs:
        try:
            if not Multiaddr.from_bytes(raw).is_relayed():
                return False
        except Exception:  # a malformed address of a peer: it shows as not relayed, nothing more
            continue
    return True


def expert_cell(uid: str, hosts: Sequence[Declaration], target: int, now: float) -> dict:
    """One expert of a grid: replicas live, the freshest version and how many hosts lag it, the
    seconds since its replicas last averaged, and how its hosts are reached."""
    versions = [d.version for d in hosts]
    newest = max(versions, default=0)
    synced = [d.synced_age + max(0.0, now - d.heartbeat) for d in hosts if d.synced_age is not None]
    relayed = sum(1 for d in hosts if is_relayed(d))
    count = len({d.peer for d in hosts})
    return {
        "uid": uid,
        "replicas": count,
        "target": target,
        "status": MISSING if count == 0 else UNDER if count < target else COVERED,
        "version": newest,
        "lagging": sum(1 for v in versions if v < newest),
        "last_sync_s": round(min(synced), 1) if synced else None,
        "direct": count - relayed,
        "relayed": relayed,
    }


def grid_model(grid: GridSpec, experts: Mapping[str, Sequence[Declaration]], now: float) -> dict:
    """One grid: every expert's cell in index order, and the counts of each status."""
    cells = [expert_cell(uid, experts.get(uid, ()), grid.replicas, now) for uid in grid.uids()]
    counts = {status: sum(1 for c in cells if c["status"] == status) for status in (COVERED, UNDER, MISSING)}
    return {
        "prefix": grid.prefix,
        "size": list(grid.size),
        "expert": grid.expert_class,
        "replicas_target": grid.replicas,
        "total": grid.count,
        "hosted": counts[COVERED] + counts[UNDER],
        "covered": counts[COVERED],
        "under_replicated": counts[UNDER],
        "missing": counts[MISSING],
        "healthy": counts[MISSING] == 0,
        "cells": cells,
    }


def volunteers_model(obs: SwarmObservation) -> list[dict]:
    """Every volunteer seen (declaring experts or a profile): its short id, public name (None
    unless it chose one), experts hosted, path (direct / relayed) and calls served."""
    hosted: dict[str, set[str]] = {}
    relayed: dict[str, bool] = {}
    for uid, hosts in obs.experts.items():
        for decl in hosts:
            peer = str(decl.peer)
            hosted.setdefault(peer, set()).add(uid)
            relayed[peer] = relayed.get(peer, True) and is_relayed(decl)
    rows = []
    for peer in sorted(set(hosted) | set(obs.profiles)):
        profile = obs.profiles.get(peer)
        via_relay = profile.relayed if profile is not None else relayed.get(peer, False)
        rows.append({
            "peer": peer,
            "short": peer[-8:],
            "name": profile.name if profile is not None else None,
            "experts": max(len(hosted.get(peer, ())), profile.experts if profile is not None else 0),
            "path": "relayed" if via_relay else "direct",
            "calls": profile.calls if profile is not None else 0,
            "samples": profile.samples if profile is not None else 0,
            "bytes_sent": profile.bytes_sent if profile is not None else 0,
            "direct_connection_share": _share(profile.peer_sessions_direct, profile.peer_sessions) if profile else None,
            "direct_data_share": _share(profile.bytes_direct, profile.bytes_direct + profile.bytes_relayed) if profile else None,
        })
    rows.sort(key=lambda r: (-int(r["calls"] or 0), -int(r["experts"] or 0), str(r["peer"])))
    return rows


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else round((ordered[middle - 1] + ordered[middle]) / 2, 4)


def direct_model(profiles: Sequence[Profile]) -> dict:
    """How much of the swarm's peer traffic went direct, from the counts each volunteer's profile
    reports (its NAT manager's ``DirectShare``, iroh's ``direct_connection_rate`` and
    ``direct_data_rate``): the shares pooled over every volunteer's sessions and bytes (None
    before anyone reports any), and the median volunteer's, which one volunteer's inflated
    counts cannot move much (the figures are each volunteer's own word)."""
    sessions = sum(p.peer_sessions for p in profiles)
    direct = sum(p.peer_sessions_direct for p in profiles)
    bytes_direct = sum(p.bytes_direct for p in profiles)
    bytes_relayed = sum(p.bytes_relayed for p in profiles)
    connection_shares = [s for p in profiles if (s := _share(p.peer_sessions_direct, p.peer_sessions)) is not None]
    data_shares = [s for p in profiles if (s := _share(p.bytes_direct, p.bytes_direct + p.bytes_relayed)) is not None]
    return {
        "direct_connection_share": _share(direct, sessions),
        "direct_data_share": _share(bytes_direct, bytes_direct + bytes_relayed),
        "median_direct_connection_share": _median(connection_shares),
        "median_direct_data_share": _median(data_shares),
        "reporting": sum(1 for p in profiles if p.peer_sessions or p.bytes_direct or p.bytes_relayed),
        "peer_sessions": sessions,
        "peer_sessions_direct": direct,
        "bytes_direct": bytes_direct,
        "bytes_relayed": bytes_relayed,
    }


def contributors_model(ledger: Ledger, obs: SwarmObservation, up: set[str], now: float) -> dict:
    """The swarm's contributors by what trainers vouched for (``volunteer.dht.vouches``), not
    by what volunteers report of themselves: cumulative, so a paused or departed donor keeps its
    place, with the recent average beside the total. Names come from the profiles of donors who
    chose one (else the short peer id); ``up`` says who is seen right now."""
    rows = ledger.contributors(now)
    listed = []
    for rank, row in enumerate(rows[:TOP_CONTRIBUTORS], 1):
        profile = obs.profiles.get(row["peer"])
        listed.append({**row, "rank": rank, "short": row["peer"][-8:], "name": profile.name if profile is not None else None,
                       "up": row["peer"] in up})
    return {"rows": listed, "count": len(rows), "half_life_days": round(ledger.half_life / 86400, 2),
            "refused": ledger.refused}


def verdicts_model(obs: SwarmObservation, up: set[str]) -> dict:
    """The peers a published proof excludes, as this relay checked each by recompute (an
    accusation it could not check, or that a recompute did not bear out, is only counted)."""
    rows = []
    for peer, proof in sorted(obs.excluded.items()):
        profile = obs.profiles.get(peer)
        rows.append({"peer": peer, "short": peer[-8:], "name": profile.name if profile is not None else None,
                     "uid": proof.get("uid", ""), "accuser": proof.get("accuser", ""),
                     "accuser_short": proof.get("accuser", "")[-8:], "reason": proof.get("reason", ""), "up": peer in up})
    return {"rows": rows, "count": len(rows), "refused": obs.accusations_refused}


def swarm_model(obs: SwarmObservation, now: float, ledger: Ledger | None = None) -> dict:
    """Everything the health page shows of one swarm (``ledger``: the vouches merged so far; a
    fresh one holding only this observation's when None)."""
    if ledger is None:
        ledger = Ledger(obs.swarm_id)
        for vouch in obs.vouches:
            ledger.merge(vouch, now)
    grids = [grid_model(grid, obs.experts, now) for grid in obs.grids]
    volunteers = volunteers_model(obs)
    points = [{"role": p.role, "addr": p.addr, "up": p.up, "self": p.is_self,
               "last_seen_s": 0.0 if p.is_self else None if p.last_seen is None else round(max(0.0, now - p.last_seen), 1)}
              for p in obs.entry_points]
    return {
        "swarm": obs.swarm_id,
        "observed_s": round(max(0.0, now - obs.observed_at), 1) if obs.observed_at else None,
        "complete": obs.complete,
        # every expert hosted, and (when the swarm file names entry points) one of them answering
        "healthy": all(g["healthy"] for g in grids) and (not points or any(p["up"] for p in points)),
        "grids": grids,
        "volunteers": {
            "up": len(volunteers),
            "direct": sum(1 for v in volunteers if v["path"] == "direct"),
            "relayed": sum(1 for v in volunteers if v["path"] == "relayed"),
            "rows": volunteers[:MAX_VOLUNTEER_ROWS],
        },
        "entry_points": points,
        # as the volunteers up report themselves (since each started): what is being served now
        "throughput": {
            "calls": sum(v["calls"] for v in volunteers),
            "samples": sum(v["samples"] for v in volunteers),
            "bytes_sent": sum(v["bytes_sent"] for v in volunteers),
        },
        "direct": direct_model(list(obs.profiles.values())),
        "contributors": contributors_model(ledger, obs, {v["peer"] for v in volunteers}, now),
        "verdicts": verdicts_model(obs, {v["peer"] for v in volunteers}),
    }


def health_model(observations: Sequence[SwarmObservation], relay: Mapping[str, object], now: float, *,
                 relay_id: str = "", ledgers: Mapping[str, Ledger] | None = None) -> dict:
    """The page's whole model: each swarm's, plus the relay's own figures (``relay.metrics.snapshot``).
    ``ledgers``: per swarm id, the vouches merged over the relay's refreshes (``HealthService``)."""
    return {
        "relay": {"peer": relay_id, **{k: relay[k] for k in ("reservations", "circuits", "circuits_total", "bytes_relayed")
                                       if k in relay}},
        "swarms": [swarm_model(obs, now, (ledgers or {}).get(obs.swarm_id)) for obs in observations],
    }


__all__ = ["COVERED", "HALF_LIFE", "MISSING", "PeerCheck", "SwarmObservation", "UNDER", "contributors_model", "direct_model",
           "entry_point_checks", "expert_cell", "grid_model", "health_model", "is_relayed", "swarm_model", "verdicts_model", "volunteers_model"]
