"""Keeping a host's experts declared over a running DHTNode: heartbeats, tombstones on leave.

``ExpertDeclarer`` re-declares a host's experts every ``expert_update_period`` (all of them
batched: one STORE per close peer per heartbeat) with an expiration of ``expert_expiration``, so
a crashed host's experts vanish within one expiration; ``withdraw`` publishes tombstones so a
leaving host's experts vanish at once. Lookups of what is declared are in ``grid.py``.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Mapping, Sequence

import trio

from ..errors import DHTError, VolunteerError, describe
from .grid import HostInfo, expert_key, is_valid_uid, make_declarations, make_tombstones
from .profile import PROFILES_KEY, Profile, profile_item

log = logging.getLogger(__name__)

def _no_version(uid: str) -> int:
    return 0


def _never_synced(uid: str) -> float | None:
    return None


class ExpertDeclarer:
    """Keeps a host's experts declared while it runs; ``withdraw`` removes them at once.

    ``loads()`` gives each uid's load, ``versions(uid)`` its version (count of optimizer
    updates; 0 by default) and ``synced_ages(uid)`` the seconds since its replicas last averaged
    (None: never), all read afresh every heartbeat; ``profile()``, when given, the volunteer's
    public profile (``profile.py``), stored beside the declarations and withdrawn with them."""

    def __init__(
        self,
        dht,
        uids: Iterable[str],
        *,
        loads: Callable[[], Mapping[str, float]] = dict,
        addrs: Callable[[], Sequence[bytes]] | None = None,
        versions: Callable[[str], int] = _no_version,
        synced_ages: Callable[[str], float | None] = _never_synced,
        profile: "Callable[[], Profile] | None" = None,
    ) -> None:
        uids = list(uids)
        bad = [u for u in uids if not is_valid_uid(u)]
        if bad:
            raise DHTError(f"invalid expert uid {bad[0]!r}: expected name.i.j… (e.g. ffn.0.3)")
        self.dht = dht
        self.uids = sorted(set(uids))
        self.loads = loads
        self.versions = versions
        self.synced_ages = synced_ages
        self.profile = profile  # the volunteer's public profile, stored with each heartbeat
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
        versions = {uid: self.versions(uid) for uid in self.uids}
        ages = {uid: age for uid in self.uids if (age := self.synced_ages(uid)) is not None}
        items = make_declarations(
            self.uids, info, now, expiration, loads=loads, versions=versions, synced_ages=ages, config=dht.config
        )
        # Recorded before the store: a withdraw while this heartbeat is in flight must write its
        # tombstones at least this late, or the heartbeat could land after them and outlive them.
        self.last_expiration = max(self.last_expiration, expiration)
        if self.profile is not None:
            items.append(profile_item(info.peer.to_bytes(), self.profile(), expiration))
        before = dht.stats["bytes_out"]
        accepted = await dht.store_many(items, cached_peers=True, replicas=dht.config.expert_replicas)
        self.heartbeat_bytes += dht.stats["bytes_out"] - before
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
        if self.profile is not None:
            items.append((PROFILES_KEY, dht.host.peer_id.to_bytes(), None, float(self.last_expiration)))
        accepted = await dht.store_many(items, cached_peers=True, replicas=dht.config.expert_replicas)
        return max(accepted) if accepted else 0

    async def forget(self, uid: str) -> None:
        """Stop declaring ``uid`` and tombstone its record (an expert set aside while the others
        stay declared); the next heartbeat rewrites the grid prefix records without it."""
        if uid not in self.uids:
            return
        self.uids = [u for u in self.uids if u != uid]
        if self.last_expiration:
            item = (expert_key(uid), self.dht.host.peer_id.to_bytes(), None, float(self.last_expiration))
            await self.dht.store_many([item], cached_peers=True, replicas=self.dht.config.expert_replicas)
        if not self.paused:
            self._wake.set()  # the prefix records are rewritten at once, without it

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


__all__ = ["ExpertDeclarer"]
