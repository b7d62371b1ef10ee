"""Live experts over a running DHTNode: heartbeat declarations, tombstones on leave, lookups.

``ExpertDeclarer`` re-declares a host's experts every ``expert_update_period`` (all of them
batched: one STORE per close peer per heartbeat) with an expiration of ``expert_expiration``, so
a crashed host's experts vanish within one expiration; ``withdraw`` publishes tombstones so a
leaving host's experts vanish at once. ``get_experts`` and ``find_best_experts`` return only
declarations alive now (sans-I/O selection and beam search in ``experts.py``).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Mapping, Sequence

import trio

from ..errors import DHTError, VolunteerError, describe
from .experts import (
    BeamSearch,
    Declaration,
    ExpertMatch,
    HostInfo,
    expert_key,
    is_valid_uid,
    make_declarations,
    make_tombstones,
    select_alive,
)

log = logging.getLogger(__name__)

# Expert lookups stop once this many peers returned records for a key. Every host stores its
# declarations (and tombstones) on the same k closest peers of a key, so two holders almost
# always have every host's sub-key; the default quorum (3) made a 64x64 beam search ~10% slower
# (31.5 vs 28.2 ms median, benchmarks/dht.py) and quorum 1 leans on a single holder.
EXPERT_QUORUM = 2


async def get_experts(dht, uids: Iterable[str], *, max_age: float = 0.0) -> dict[str, list[Declaration]]:
    """Hosts serving each uid now, best first (fresh heartbeat, then lowest load); ``max_age`` as in
    ``DHTNode.get_many``."""
    uids = [u for u in dict.fromkeys(uids)]
    found = await dht.get_many([expert_key(u) for u in uids], quorum=EXPERT_QUORUM, max_age=max_age)
    now = dht.clock()
    return {uid: select_alive(found[expert_key(uid)], now, dht.config) for uid in uids}


async def find_best_experts(
    dht, prefix: str, grid_scores: Sequence[Sequence[float]], beam_size: int, *, max_age: float = 0.0
) -> list[ExpertMatch]:
    """Beam search over a grid of experts (Learning@home): the ``beam_size`` best live experts.

    ``max_age`` > 0 reuses this node's grid lookups of the last ``max_age`` seconds: a trainer
    searching every step trades that much staleness (a host that left may linger that long) for
    most of the round trips. The default asks the network every time, so a leaver is gone at once.
    """
    search = BeamSearch(prefix, grid_scores, beam_size, dht.clock(), dht.config)
    while keys := search.wanted():
        found = await dht.get_many([expert_key(k) for k in keys], quorum=EXPERT_QUORUM, max_age=max_age)
        search.feed({k: found[expert_key(k)] for k in keys}, dht.clock())
    return search.result()


async def walk_grid(dht, prefix: str, *, depth: int | None = None, limit: int = 4096) -> dict[str, list[Declaration]]:
    """Live experts under ``prefix`` from the grid's prefix records alone, one batched round per
    level: ``{uid: [hosts that list it, best first]}``. A host's record under ``name.i.`` names
    one of its uids per next index (``name.i.j`` itself at the last level), so every (uid, host)
    pair of a grid shows up. ``depth`` stops after that many levels (a grid's dimensions);
    ``limit`` bounds the prefixes fetched."""
    level = [prefix.rstrip(".") + "."]
    result: dict[str, list[Declaration]] = {}
    fetched = 0
    for _ in range(depth or 64):
        fetched += len(level)
        found = await dht.get_many([expert_key(p) for p in level], quorum=EXPERT_QUORUM)
        now = dht.clock()
        next_level: set[str] = set()
        for key in level:
            for decl in select_alive(found[expert_key(key)], now, dht.config):
                for index, uid in decl.children:
                    if uid == f"{key}{index}" and is_valid_uid(uid):
                        result.setdefault(uid, []).append(decl)  # a leaf at this level
                    elif uid.startswith(f"{key}{index}."):
                        next_level.add(f"{key}{index}.")
        level = sorted(next_level)[: max(0, limit - fetched)]
        if not level:
            break
    return result


async def list_experts(dht, prefix: str, *, limit: int = 4096) -> dict[str, list[Declaration]]:
    """Every live expert under ``prefix`` at any depth, with each uid's own records (per-expert
    load and heartbeat): what ``volunteer experts`` shows."""
    uids = await walk_grid(dht, prefix, limit=limit)
    hosts = await get_experts(dht, sorted(uids))
    return {uid: decls for uid, decls in hosts.items() if decls}


async def grid_experts(dht, prefix: str, depth: int) -> dict[str, list[Declaration]]:
    """Every live expert of a ``depth``-dimensional grid in ``depth`` rounds (mixtures of experts
    cache this between batches)."""
    found = await walk_grid(dht, prefix, depth=depth)
    return {uid: hosts for uid, hosts in found.items() if uid.count(".") == depth}


class ExpertDeclarer:
    """Keeps a host's experts declared while it runs; ``withdraw`` removes them at once."""

    def __init__(
        self,
        dht,
        uids: Iterable[str],
        *,
        loads: Callable[[], Mapping[str, float]] = dict,
        addrs: Callable[[], Sequence[bytes]] | None = None,
    ) -> None:
        uids = list(uids)
        bad = [u for u in uids if not is_valid_uid(u)]
        if bad:
            raise DHTError(f"invalid expert uid {bad[0]!r}: expected name.i.j… (e.g. ffn.0.3)")
        self.dht = dht
        self.uids = sorted(set(uids))
        self.loads = loads
        self.addrs = addrs or (lambda: [a.to_bytes() for a in dht.host.shareable_addrs()[: dht.config.max_addrs]])
        self.paused = False
        self.last_declared: float | None = None  # when a heartbeat last reached at least one peer
        self.last_expiration = 0.0  # expiration of the newest declaration (tombstones must match it)
        self.declarations = 0
        self.heartbeat_bytes = 0  # DHT bytes sent by heartbeats, for "bytes per expert per minute"
        self._wake = trio.Event()

    async def declare_once(self) -> int:
        """One heartbeat: sign and store every uid and grid prefix; returns peers reached (max over keys)."""
        if not self.uids:
            return 0
        dht = self.dht
        now = dht.clock()
        expiration = now + dht.config.expert_expiration
        loads = dict(self.loads())
        host_load = sum(loads.values()) / len(loads) if loads else 0.0
        info = HostInfo(dht.host.peer_id, tuple(self.addrs()), host_load)
        items = make_declarations(self.uids, info, now, expiration, loads=loads, config=dht.config)
        before = dht.stats["bytes_out"]
        accepted = await dht.store_many(items, cached_peers=True, replicas=dht.config.expert_replicas)
        self.heartbeat_bytes += dht.stats["bytes_out"] - before
        self.last_expiration = max(self.last_expiration, expiration)
        self.declarations += 1
        reached = max(accepted) if accepted else 0
        if reached > 1:  # more than our own storage
            self.last_declared = now
        return reached

    async def withdraw(self) -> int:
        """Tombstone every declaration (graceful leave or pause): lookups stop returning them at once."""
        if not self.uids or not self.last_expiration:
            return 0
        dht = self.dht
        items = make_tombstones(self.uids, dht.host.peer_id, self.last_expiration)
        accepted = await dht.store_many(items, cached_peers=True, replicas=dht.config.expert_replicas)
        return max(accepted) if accepted else 0

    async def pause(self) -> None:
        """Stop declaring and withdraw (``volunteer pause``)."""
        self.paused = True
        await self.withdraw()

    def resume(self) -> None:
        """Declare again right away."""
        self.paused = False
        self._wake.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeat until cancelled; on cancellation, try (briefly) to withdraw."""
        task_status.started()
        try:
            while True:
                if not self.paused:
                    try:
                        await self.declare_once()
                    except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                        log.warning("declaring experts failed: %s", describe(exc))
                self._wake = trio.Event()
                with trio.move_on_after(self.dht.config.expert_update_period):
                    await self._wake.wait()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                try:
                    await self.withdraw()
                except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                    log.warning("withdrawing experts failed: %s", describe(exc))


__all__ = ["ExpertDeclarer", "find_best_experts", "get_experts", "grid_experts", "list_experts", "walk_grid"]
