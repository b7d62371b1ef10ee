"""Keeping a host's experts declared over a running DHTNode: heartbeats, tombstones on leave.

``ExpertDeclarer`` re-declares a host's experts every ``expert_update_period`` (all of them
batched: one STORE per close peer per heartbeat) with an expiration of ``expert_expiration``, so
a crashed host's experts vanish within one expiration; ``withdraw`` publishes tombstones so a
leaving host's experts vanish at once. Lookups of what is declared are in ``grid.py``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import trio

from ..errors import DHTError, VolunteerError, describe
from ..net.service import BaseService, HostAPI
from .grid import HostInfo, is_valid_uid, make_declarations, make_tombstones
from .profile import PROFILES_KEY, Profile, profile_item
from .status import DeclarerStatus

if TYPE_CHECKING:
    from .node import DHTNode

log = logging.getLogger(__name__)

WITHDRAW_ON_EXIT = 2.0  # seconds a cancelled declarer spends tombstoning before it gives up


def _no_version(uid: str) -> int:
    return 0


def _never_synced(uid: str) -> float | None:
    return None


class ExpertDeclarer(BaseService):
    """Keeps a host's experts declared while it runs, as a Host service; ``withdraw`` removes
    them at once.

    ``loads()`` gives each uid's load, ``versions(uid)`` its version (count of optimizer
    updates; 0 by default) and ``synced_ages(uid)`` the seconds since its replicas last averaged
    (None: never), all read afresh every heartbeat; ``profile()``, when given, the volunteer's
    public profile (``profile.py``), stored beside the declarations and withdrawn with them.
    What is declared changes only through ``add`` and ``drop``; ``pause`` / ``resume`` stop and
    restart the heartbeats."""

    def __init__(
        self,
        dht: DHTNode,
        uids: Iterable[str] = (),
        *,
        loads: Callable[[], Mapping[str, float]] = dict,
        addrs: Callable[[], Sequence[bytes]] | None = None,
        versions: Callable[[str], int] = _no_version,
        synced_ages: Callable[[str], float | None] = _never_synced,
        profile: "Callable[[], Profile] | None" = None,
    ) -> None:
        uids = list(uids)
        for uid in uids:
            _check_uid(uid)
        self.dht = dht
        self.host = dht.host
        self._uids = sorted(set(uids))
        self.loads = loads
        self.versions = versions
        self.synced_ages = synced_ages
        self.profile = profile  # the volunteer's public profile, stored with each heartbeat
        self.addrs = addrs or (lambda: [a.to_bytes() for a in dht.host.shareable_addrs()[: dht.config.max_addrs]])
        self.paused = False
        self.last_declared: float | None = None  # when a heartbeat last reached at least one peer
        self.last_expiration = 0.0  # expiration of the newest declaration (tombstones must match it)
        self._tombstoned_at = 0.0  # last_expiration when every declaration was last tombstoned
        self.declarations = 0
        self.heartbeat_bytes = 0  # DHT bytes sent by heartbeats, for "bytes per expert per minute"
        self._wake = trio.Event()

    @property
    def uids(self) -> list[str]:
        """The uids declared at each heartbeat (a copy: change them with ``add`` / ``drop``)."""
        return list(self._uids)

    # --- what is declared ---------------------------------------------------------------------
    def add(self, uid: str) -> None:
        """Declare ``uid`` from now on; unless paused, the next heartbeat starts at once."""
        _check_uid(uid)
        if uid not in self._uids:
            self._uids = sorted({*self._uids, uid})
            self._wake_unless_paused()

    async def drop(self, uid: str) -> None:
        """Stop declaring ``uid`` and tombstone its record (trainers stop picking us for it at
        once); the grid prefix records are rewritten by the next heartbeat, which starts at once."""
        if uid not in self._uids:
            return
        self._uids = [u for u in self._uids if u != uid]
        if self.last_expiration:
            items = make_tombstones([uid], self.dht.host.peer_id, self.last_expiration, prefixes=False)
            try:
                await self.dht.store_many(items, cached_peers=True, replicas=self.dht.config.expert_replicas)
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.debug("tombstone of %s failed: %s", uid, describe(exc))
        self._wake_unless_paused()

    def refresh(self) -> None:
        """Something declared changed (a version, a sync age): unless paused, the next heartbeat
        starts at once."""
        self._wake_unless_paused()

    def _wake_unless_paused(self) -> None:
        if not self.paused:
            self._wake.set()

    # --- heartbeats and tombstones ------------------------------------------------------------
    async def declare_once(self) -> int:
        """One heartbeat: sign and store every uid and grid prefix; returns peers reached (max over keys)."""
        if not self._uids:
            return 0
        dht = self.dht
        uids = list(self._uids)
        now = dht.clock()
        expiration = now + dht.config.expert_expiration
        loads = dict(self.loads())
        host_load = sum(loads.values()) / len(loads) if loads else 0.0
        info = HostInfo(dht.host.peer_id, tuple(self.addrs()), host_load)
        versions = {uid: self.versions(uid) for uid in uids}
        ages = {uid: age for uid in uids if (age := self.synced_ages(uid)) is not None}
        items = make_declarations(
            uids, info, now, expiration, loads=loads, versions=versions, synced_ages=ages, config=dht.config
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
        """Stop declaring and tombstone every declaration (a graceful leave, or ``pause``):
        lookups stop returning them at once; ``resume`` declares again. Nothing is sent when
        nothing was declared since the last withdraw. Returns peers reached (max over keys)."""
        self.paused = True
        if not self._uids or self.last_expiration <= self._tombstoned_at:
            return 0
        dht = self.dht
        expiration = self.last_expiration
        items = make_tombstones(self._uids, dht.host.peer_id, expiration)
        if self.profile is not None:
            items.append((PROFILES_KEY, dht.host.peer_id.to_bytes(), None, float(expiration)))
        accepted = await dht.store_many(items, cached_peers=True, replicas=dht.config.expert_replicas)
        self._tombstoned_at = max(self._tombstoned_at, expiration)
        return max(accepted) if accepted else 0

    async def pause(self) -> None:
        """Stop declaring and withdraw (``volunteer pause``)."""
        await self.withdraw()

    def resume(self) -> None:
        """Declare again right away."""
        self.paused = False
        self._wake.set()

    def snapshot(self) -> DeclarerStatus:
        """The declarations' figures for ``volunteer status``: how many experts are declared now
        (none while paused), when a heartbeat last reached a peer, heartbeats and their bytes."""
        return {
            "experts_declared": 0 if self.paused else len(self._uids),
            "last_declared": self.last_declared,
            "declarations": self.declarations,
            "heartbeat_bytes": self.heartbeat_bytes,
        }

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeat until cancelled; on cancellation, try (briefly) to withdraw."""
        task_status.started()
        try:
            while True:
                # armed before the heartbeat: a change made while it is under way (read before
                # the change) starts the next one at once instead of being lost
                self._wake = trio.Event()
                if not self.paused:
                    try:
                        await self.declare_once()
                    except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                        log.warning("declaring experts failed: %s", describe(exc))
                with trio.move_on_after(self.dht.config.expert_update_period):
                    await self._wake.wait()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(WITHDRAW_ON_EXIT):
                try:
                    await self.withdraw()
                except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                    log.warning("withdrawing experts failed: %s", describe(exc))


def _check_uid(uid: str) -> None:
    if not is_valid_uid(uid):
        raise DHTError(f"invalid expert uid {uid!r}: expected name.i.j… (e.g. ffn.0.3)")


__all__ = ["ExpertDeclarer"]
