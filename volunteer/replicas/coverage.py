"""Pure views of a swarm's replicated experts: when a grid's next sync round starts, and how well
the swarm covers its grids. No trio, no clock: callers pass ``now`` and what the DHT said.

Round timing is not negotiated between replicas: each one opens the round of a grid at the next
wall-clock multiple of its ``sync_period`` (``next_round_at``), so replicas whose clocks agree
within a few seconds meet within the sync driver's ``stash_ttl`` without a message."""

from __future__ import annotations

import math
from typing import Mapping, NotRequired, Sequence, TypedDict

from .grid import GridSpec, grid_of
from .placement import Hosts, suspect_claims


def next_round_at(now: float, period: float) -> float:
    """The first multiple of ``period`` strictly after ``now`` (seconds of the wall clock)."""
    if not period > 0:
        raise ValueError("a sync period must be positive")
    at = math.ceil(now / period) * period
    return at + period if at <= now else at


class GridCoverage(TypedDict):
    """How the swarm covers one grid (``grid_coverage``)."""

    prefix: str
    size: list[int]
    total: int
    hosted: int
    replicas_target: int
    under_replicated: list[str]
    unhosted: list[str]


class Coverage(TypedDict):
    """The swarm's coverage of its grids (``coverage``), with warnings; a replica manager adds
    how old its survey is."""

    grids: list[GridCoverage]
    warnings: list[str]
    surveyed_age_s: NotRequired[float | None]


def grid_coverage(grid: GridSpec, hosts: Hosts) -> GridCoverage:
    """How the swarm covers one grid: experts hosted, replicas per expert, under-replicated and
    unhosted uids (the dashboard and ``volunteer experts`` show this)."""
    counts = {uid: len(hosts.get(uid, {})) for uid in grid.uids()}
    unhosted = sorted(uid for uid, n in counts.items() if n == 0)
    under = sorted(uid for uid, n in counts.items() if 0 < n < grid.replicas)
    return {
        "prefix": grid.prefix,
        "size": list(grid.size),
        "total": grid.count,
        "hosted": sum(1 for n in counts.values() if n),
        "replicas_target": grid.replicas,
        "under_replicated": under,
        "unhosted": unhosted,
    }


def coverage(grids: Sequence[GridSpec], hosts: Hosts, *, mine: Sequence[str] = ()) -> Coverage:
    """The swarm's coverage of every grid, plus warnings: experts with no host, and experts this
    volunteer (``mine``) hosts outside every declared grid."""
    rows = [grid_coverage(grid, hosts) for grid in grids]
    warnings = []
    for row in rows:
        if row["unhosted"]:
            warnings.append(f"grid {row['prefix']!r}: {len(row['unhosted'])} of {row['total']} experts have no host")
    outside = sorted(uid for uid in mine if grid_of(uid, grids) is None)
    if outside and grids:
        warnings.append(f"hosting {len(outside)} expert(s) outside every declared grid: {', '.join(outside[:4])}")
    return {"grids": rows, "warnings": warnings}


def hosts_of(found: Mapping[str, Sequence[object]]) -> dict[str, dict[str, int]]:
    """``uid → {peer id: version}`` from DHT declarations (``get_experts`` / ``list_experts``).
    A declaration without a version (older hosts) counts as version 0."""
    return {
        uid: {str(getattr(decl, "peer")): int(getattr(decl, "version", 0) or 0) for decl in decls}
        for uid, decls in found.items()
        if decls
    }


__all__ = ["Coverage", "GridCoverage", "coverage", "grid_coverage", "hosts_of", "next_round_at"]


def claim_standings(hosts: Hosts, *, factor: float, margin: int) -> dict[str, dict[str, str]]:
    """``uid → {peer: standing}`` of each declared replica, judged from the DHT's word alone (what
    ``volunteer experts`` can see without fetching a state): ``suspect`` when its version claim is
    far above the other replicas' (``suspect_claims``), ``sole`` when no other replica declares
    the uid (nothing to compare), else ``plausible`` (its claim is in line with the others'; that
    its state matches theirs is only proven by fetching it)."""
    out: dict[str, dict[str, str]] = {}
    for uid, claims in hosts.items():
        suspects = suspect_claims(claims, factor=factor, margin=margin)
        out[uid] = {
            peer: "suspect" if peer in suspects else ("sole" if len(claims) == 1 else "plausible")
            for peer in claims
        }
    return out
