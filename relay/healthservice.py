"""The relay's swarm health page as a Host service: a background refresher that looks at each
swarm in bounded work, and the page (``healthpage.health_app``) served from its cached model.

Every ``refresh_period`` the service reads, per swarm: each declared grid's live experts
(``walk_grid`` from prefix records, then the experts' own records for at most
``MAX_UID_LOOKUPS`` uids: versions, last sync, paths), the volunteers' public profiles (one key),
the trainers' vouches (one key, merged into a ``Ledger`` per swarm that the service keeps for its
lifetime: a donor that pauses or leaves keeps its credit; a relay restart begins it again from the
vouches still in the DHT), the published proofs (``volunteer.experts.verdicts``: each new one
checked once by recompute, from the first one published on; the page lists who they exclude), and
whether each entry point answers a DHT ping. The whole refresh runs under ``REFRESH_BOUND``
seconds; what it has not finished by then shows as partial. Requests only read the last model,
so a flood of page views never turns into DHT traffic.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from volunteer.errors import VolunteerError, describe
from volunteer.dht.verdicts import PROOFS_KEY, accused_in_index
from volunteer.dht.vouches import CONTRIBUTIONS_KEY, Ledger, Vouch
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.service import BaseService, HostAPI
from volunteer.swarmfile import GridSpec

from .health import PeerCheck, SwarmObservation, entry_point_checks, health_model

if TYPE_CHECKING:
    from volunteer.experts.verdicts import VerdictWatch

log = logging.getLogger(__name__)

REFRESH_PERIOD = 10.0  # seconds between two looks at the swarms
REFRESH_BOUND = 8.0  # seconds one look may take, all swarms together
PING_TIMEOUT = 3.0  # seconds an entry point has to answer
MAX_UID_LOOKUPS = 1024  # experts whose own records one refresh reads (beyond: prefix records only)
MAX_ENTRY_POINTS = 32  # entry points pinged per swarm and refresh


@dataclass(frozen=True)
class WatchedSwarm:
    """A swarm the page shows: its id, its grids and its entry points (from its swarm file)."""

    swarm_id: str
    grids: Sequence[GridSpec] = ()
    relays: Sequence[Multiaddr] = ()
    bootstrap: Sequence[Multiaddr] = ()


class HealthService(BaseService):
    """Keeps the health model fresh and serves the page on an already bound socket (bound before
    anything starts, so a busy port is one line) for the Host's lifetime."""

    def __init__(self, swarms: Sequence[WatchedSwarm], dhts: dict, hop, sock: socket.socket,
                 *, refresh_period: float = REFRESH_PERIOD) -> None:
        from volunteer.web.serve import listener_address

        self.swarms = list(swarms)
        self.dhts = dhts  # swarm id -> DHTNode, filled as the relay's DHT services start
        self.hop = hop
        self.sock = sock
        self.addr: tuple[str, int] = listener_address(sock)
        self.refresh_period = refresh_period
        self.ledgers: dict[str, Ledger] = {}  # swarm id -> the vouches merged over every refresh
        self.verdicts: dict[str, "VerdictWatch"] = {}  # swarm id -> its checker of proofs, kept across refreshes
        self._listed: dict[str, list[str]] = {}  # swarm id -> the hosts its last refresh listed
        self.model: dict | None = None  # the last refresh's model; None until the first ends
        self.last_seen: dict[str, float] = {}  # entry point address -> wall clock of its last answer
        self.refreshes = 0

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from volunteer.web.serve import serve_app

        from .healthpage import health_app
        from .metrics import relay_registry

        self.host = host
        app = health_app(lambda: self.model, relay_registry(self.hop, self.dhts))
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_app, app, self.sock)
            nursery.start_soon(self._refresh_forever)
            task_status.started()

    def snapshot(self) -> dict:
        """Where the page is served, how often it was refreshed, and whether it has a model yet."""
        return {"addr": f"{self.addr[0]}:{self.addr[1]}", "swarms": [s.swarm_id for s in self.swarms],
                "refreshes": self.refreshes, "ready": self.model is not None}

    async def _refresh_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.warning("the health page's refresh failed: %s", describe(exc))
            await trio.sleep(self.refresh_period)

    async def refresh(self) -> dict:
        """Look at every swarm once (bounded by ``REFRESH_BOUND``) and replace the cached model."""
        from .metrics import snapshot

        observations: dict[str, SwarmObservation] = {}
        with trio.move_on_after(REFRESH_BOUND):
            async with trio.open_nursery() as nursery:
                for swarm in self.swarms:
                    nursery.start_soon(self._observe_into, swarm, observations)
        clock = self._clock()
        ordered = [observations.get(s.swarm_id) or SwarmObservation(s.swarm_id, s.grids, entry_points=self._points(s, {}),
                                                                     observed_at=clock(), complete=False)
                   for s in self.swarms]
        self.model = health_model(ordered, snapshot(self.hop), clock(), relay_id=str(self.host.peer_id),
                                  ledgers=self.ledgers)
        self.refreshes += 1
        return self.model

    def _clock(self):
        for dht in self.dhts.values():
            return dht.clock
        import time

        return time.time

    async def _observe_into(self, swarm: WatchedSwarm, out: dict[str, SwarmObservation]) -> None:
        dht = self.dhts.get(swarm.swarm_id)
        if dht is None:
            return
        answered: dict[str, bool] = {}
        experts: dict = {}
        profiles: dict = {}
        vouches: list = []
        complete = True
        async with trio.open_nursery() as nursery:
            for addr in [*swarm.relays, *swarm.bootstrap][:MAX_ENTRY_POINTS]:
                nursery.start_soon(self._ping_entry, dht, addr, answered)
            try:
                experts = await self._experts(dht, swarm.grids)
                profiles = await self._profiles(dht)
                vouches = await self._vouches(dht)
                if swarm.swarm_id in self.verdicts or accused_in_index(await dht.get(PROOFS_KEY), dht.clock()):
                    # each new proof checked once, by recompute (torch is loaded only once one is published)
                    await self._verdict_watch(swarm.swarm_id, dht, experts).read()
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                complete = False
                log.info("health refresh of swarm %s was partial: %s", swarm.swarm_id, describe(exc))
        now = dht.clock()
        ledger = self.ledgers.setdefault(swarm.swarm_id, Ledger(swarm.swarm_id))
        for vouch in vouches:
            ledger.merge(vouch, now)
        checked = self.verdicts.get(swarm.swarm_id)
        report = checked.book.report() if checked is not None else {"excluded": {}, "refused": {}}
        out[swarm.swarm_id] = SwarmObservation(swarm.swarm_id, swarm.grids, experts, profiles, vouches=vouches,
                                               entry_points=self._points(swarm, answered), observed_at=now,
                                               complete=complete, excluded=report["excluded"],
                                               accusations_refused=sum(report["refused"].values()))

    def _verdict_watch(self, swarm_id: str, dht, experts: dict) -> "VerdictWatch":
        """This swarm's checker of published proofs (the hosts listed now looked up besides the
        index), made at the first refresh: it loads the recompute (torch) only then."""
        from functools import partial

        from volunteer.experts.client import call_expert
        from volunteer.experts.verdicts import VerdictWatch, snapshot_fetcher

        self._listed[swarm_id] = sorted({str(decl.peer) for hosts in experts.values() for decl in hosts})
        watch = self.verdicts.get(swarm_id)
        if watch is None:
            fetch = snapshot_fetcher(partial(call_expert, self.host, swarm_id=swarm_id, timeout=PING_TIMEOUT))
            watch = self.verdicts[swarm_id] = VerdictWatch(dht, self.host.keypair, swarm_id, fetch,
                                                           peers=lambda: self._listed.get(swarm_id, []))
        return watch

    def _points(self, swarm: WatchedSwarm, answered: dict[str, bool]) -> list[PeerCheck]:
        roles = (("relay", swarm.relays[:MAX_ENTRY_POINTS]), ("bootstrap", swarm.bootstrap[:MAX_ENTRY_POINTS]))
        points = entry_point_checks(roles, self.host.peer_id, answered, self.last_seen)
        if not any(p.is_self for p in points):  # this relay serves the swarm's DHT: an entry point too
            announced = self.host.full_addrs()
            if announced:
                points.insert(0, PeerCheck("relay", str(announced[0]), True, None, True))
        return points

    async def _ping_entry(self, dht, addr: Multiaddr, answered: dict[str, bool]) -> None:
        from volunteer.dht.routing import Contact

        text = str(addr)
        peer = addr.peer_id
        if peer is None or peer == self.host.peer_id:
            answered[text] = peer is not None
            if peer is not None:
                self.last_seen[text] = dht.clock()
            return
        ok = False
        with trio.move_on_after(PING_TIMEOUT):
            try:
                await self.host.connect(addr)
                ok = await dht.ping(Contact(peer, (addr.without_peer_id().to_bytes(),)))
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.debug("entry point %s did not answer: %s", text, describe(exc))
        answered[text] = ok
        if ok:
            self.last_seen[text] = dht.clock()

    @staticmethod
    async def _experts(dht, grids: Sequence[GridSpec]) -> dict:
        from volunteer.dht.grid import get_experts, walk_grid

        found: dict = {}
        for grid in grids:
            listed = await walk_grid(dht, grid.prefix, depth=len(grid.size))
            found.update({uid: hosts for uid, hosts in listed.items() if grid.contains(uid)})
        # the experts' own records carry what prefix records leave out (last sync); read them for
        # a bounded number of uids, and keep the prefix records' view of the rest
        wanted = sorted(found)[:MAX_UID_LOOKUPS]
        if wanted:
            own = await get_experts(dht, wanted)
            found.update({uid: hosts for uid, hosts in own.items() if hosts})
        return found

    @staticmethod
    async def _profiles(dht) -> dict:
        from volunteer.dht.profile import PROFILES_KEY, Profile

        from volunteer.errors import DHTRecordError

        profiles = {}
        now = dht.clock()
        for record in (await dht.get(PROFILES_KEY)).values():
            if record.value is None or record.expiration <= now:
                continue
            try:
                profiles[str(record.signer)] = Profile.decode(record.value)
            except DHTRecordError:
                continue  # a malformed profile leaves that volunteer unnamed, nothing more
        return profiles

    @staticmethod
    async def _vouches(dht) -> list:
        """The vouches stored under the swarm's contributions key (the ledger checks each one)."""
        from volunteer.errors import DHTRecordError

        found = []
        now = dht.clock()
        for record in (await dht.get(CONTRIBUTIONS_KEY)).values():
            if record.value is None or record.expiration <= now:
                continue
            try:
                vouch = Vouch.decode(record.value)
            except DHTRecordError:
                continue  # a malformed vouch counts for nobody
            if vouch.trainer == record.signer.to_bytes():  # stored by the trainer that signed it
                found.append(vouch)
        return found


__all__ = ["HealthService", "WatchedSwarm"]
