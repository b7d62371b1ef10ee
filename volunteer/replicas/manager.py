"""``ReplicaManager``: a volunteer's replicated experts while it runs, as a Host service.

It owns no decisions (placement, the sync round's bookkeeping and the hand-off plan are pure
functions beside it); it feeds them what the DHT says, on a schedule, and carries out their
answers through the store (the runtime's experts), the declarer and the two replica protocols:

- ``run`` starts by choosing what to host (``StartHosting``: placement's choice, or the uids
  named), each caught up before it is ever declared, and reports started only then;
- ``survey`` asks the DHT who hosts each grid expert, at which version, and remembers their
  addresses (catch-up, sync and hand-off dial them).
- ``prepare`` brings a new backend up to date before anyone sees it: a live replica's state,
  freshest believable claim first, raced and paced, checked before it is loaded; an expert whose
  replicas all refuse, stall or send implausible states is not hosted, so a volunteer never serves
  random (or a liar's) weights for an expert the swarm has trained.
- then its ``schedule`` (``schedule.py``) re-checks placement (automatic placement only: early
  after a sync round that proves a co-holder, then every ``recheck_period``, jittered) and opens
  a sync round of every hosted grid expert at each wall-clock multiple of its grid's
  ``sync_period`` with the other live replicas.
- ``hand_off_all`` (a graceful leave) pushes the experts no other live replica holds to
  volunteers with room, within ``handoff_timeout``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import trio

from ..dht.declare import ExpertDeclarer
from ..dht.grid import Declaration, get_experts, get_hosts_and_leavers, survey_quorum
from ..dht.node import DHTNode
from ..errors import ExpertConfigError, JoinError, VolunteerError, describe
from ..experts.backend import ExpertBackend
from ..experts.standing import Standing
from ..net.identity import PeerID
from ..net.service import BaseService, HostAPI
from ..net.upload import UploadMeter
from .config import DEFAULT_CONFIG, ReplicasConfig
from .coverage import Coverage, coverage, hosts_of
from .exclusions import NO_EXCLUSIONS, PROVEN_LIAR, Exclusions, without_excluded
from .grid import GridSpec, grid_of
from .handoff import HandOffResult, hand_off, plan_handoff
from .placement import VERSION_CLAIM, Hosts, Placement, catch_up_order, make_room_for, place
from .providers import ACTIVATION_MARGIN, placement_capacity, synced_ages, versions_of
from .store import BackendStore
from .survey import answering_only, declared_hosts, remember_addrs
from .sync import SyncOutcome
from .syncdriver import MAX_STANDINGS, ReplicaSync
from .catchup import race_for_state
from .schedule import SURVEY_TIMEOUT, Schedule
from .state import import_state
from .status import ReplicasStatus
from .transfer import PushClaim, StateService

log = logging.getLogger(__name__)

IMPLAUSIBLE_STATE = "implausible_state"  # a fetched state that is not finite or not at a trained scale
UNCORROBORATED_STATE = "uncorroborated_state"  # a fetched state no other source's state agreed with

# builds an empty backend (uid, class, hidden_dim): the daemon's make_backend with its settings
BuildBackend = Callable[[str, str, int], ExpertBackend]
START_CATCH_UPS = 2  # catch-ups at once when a node starts: sources serve only a few transfers each


@dataclass(frozen=True)
class StartHosting:
    """What a volunteer asked to host when it starts: the uids it named (hosted even when none of
    their replicas delivers their state, with a warning), or none and automatic placement; the
    expert class and width for named uids (None: each grid's own; outside every grid, required)."""

    uids: tuple[str, ...] = ()
    expert_class: str | None = None
    hidden_dim: int = 64


class ReplicaManager(BaseService):
    """Keeps a volunteer's grid experts placed, caught up, in sync and handed off on leave.

    Its collaborators: the Host, the DHT node, the store over the runtime's experts, the replica
    sync service and the declarer (``add`` / ``drop``). It builds its own state-transfer service
    (``state``), whose pushes it accepts and makes room for; a node runs ``state`` and ``sync``
    before it and the declarer after it."""

    def __init__(
        self,
        *,
        host: HostAPI,
        dht: DHTNode,
        store: BackendStore,
        sync: ReplicaSync,
        declarer: ExpertDeclarer,
        swarm_id: str,
        grids: Sequence[GridSpec],
        build: BuildBackend | None = None,
        capacity: int = DEFAULT_CONFIG.default_capacity,
        auto_place: bool = False,
        start: StartHosting = StartHosting(),
        config: ReplicasConfig = DEFAULT_CONFIG,
        clock: Callable[[], float] = time.time,
        upload: UploadMeter | None = None,
        exclusions: Exclusions = NO_EXCLUSIONS,
    ) -> None:
        self.host = host
        # peers a checked proof excludes (experts/verdicts.py's book, through ``Exclusions``): no
        # holder for placement, no catch-up source, no pusher; ``sync`` refuses them on its own
        self.exclusions = exclusions
        self.proven_liars: dict[str, None] = {}  # excluded peers that declared our grids' experts
        self.upload = upload  # the volunteer's shared upload cap: catch-up served and hand-off count
        self.dht = dht
        self.swarm_id = swarm_id
        self.grids = list(grids)
        self.store = store
        self.sync = sync
        self.declarer = declarer
        self.build = build
        self.capacity = capacity
        self.auto_place = auto_place
        self.start = start
        self.config = config
        self.clock = clock  # the wall clock replicas align their sync rounds on
        self.state = StateService(
            swarm_id, store, config, make_room=self.make_room, on_accepted=self.accepted, vouch=self.vouch,
            upload=upload,
        )
        self.hosts: dict[str, dict[str, int]] = {}  # the last survey: uid → {peer: version}
        self.surveyed_at: float | None = None  # trio time of the last survey
        self.moves = 0  # experts added or dropped by re-checks
        self.caught_up: dict[str, int] = {}  # uid → version downloaded before declaring it
        self.refusals: Counter[str] = Counter()  # claims refused by catch-up, by reason
        # (uid, peer) → how that replica stands with us, from catch-up; sync's verdicts in ``sync``
        self._standings: dict[tuple[str, str], Standing] = {}
        # uid -> the backend self-care set aside (``set_aside``): counted as hosted by placement
        # (no other expert takes its place), neither served, synced nor declared until taken back
        self.aside: dict[str, ExpertBackend] = {}
        # when re-checks, surveys and sync rounds happen (what a re-check or survey does is ours)
        self.schedule = Schedule(
            host=host, dht=dht, store=store, sync=sync, declarer=declarer, grids=self.grids, config=config,
            clock=clock, recheck=self.recheck, survey=self.survey,
        )

    @property
    def me(self) -> str:
        """This volunteer's peer id as placement and the sync core name it."""
        return str(self.host.peer_id)

    # --- what the DHT says ----------------------------------------------------------------------
    async def survey(self, uids: Sequence[str] = ()) -> dict[str, dict[str, int]]:
        """Live hosts (with versions) of every grid expert, plus ``uids``; their addresses are
        remembered so that catch-up, sync and hand-off can dial them."""
        found = await declared_hosts(self.dht, self.grids, uids)
        self._remember_hosts(found)
        self.hosts = await self.alive_only(hosts_of(found))
        self.surveyed_at = trio.current_time()
        return self.hosts

    def _remember_hosts(self, found: Mapping[str, Sequence[Declaration]]) -> None:
        remember_addrs(self.host, found)

    async def alive_only(self, hosts: Hosts) -> dict[str, dict[str, int]]:
        """``hosts`` without the hosts that do not answer (``survey.answering_only``) and those a
        checked proof excludes (their declarations count as nobody's copy)."""
        return await answering_only(self.host, self._believed(hosts), me=self.me, config=self.config)

    def _believed(self, hosts: Hosts) -> dict[str, dict[str, int]]:
        """``hosts`` without the peers a checked proof excludes (remembered, and counted once each)."""
        kept = without_excluded(hosts, self.exclusions)
        for uid, holders in hosts.items():
            for peer in holders:
                if peer not in kept[uid] and peer not in self.proven_liars:
                    self.proven_liars[peer] = None
                    self.refusals[PROVEN_LIAR] += 1
                    log.warning("not counting %s as a replica of anything: a checked proof excludes it", peer)
        while len(self.proven_liars) > MAX_STANDINGS:
            del self.proven_liars[next(iter(self.proven_liars))]
        return kept

    def coverage(self) -> Coverage:
        """The swarm's coverage of its grids as last surveyed (the status snapshot's ``coverage``)."""
        view = coverage(self.grids, self.hosts, mine=list(self.store.backends))
        view["surveyed_age_s"] = (
            round(trio.current_time() - self.surveyed_at, 1) if self.surveyed_at is not None else None
        )
        return view

    def snapshot(self) -> ReplicasStatus:
        """The grids' coverage as last surveyed, and what this volunteer did about it: experts
        moved by re-checks, caught up before declaring, sync rounds that failed, state transfers,
        and the peers' claims refused, by reason (``sync_outlier``, ``unsolicited_push``, ...)."""
        state = self.state
        return {
            "coverage": self.coverage(),
            "moves": self.moves,
            "caught_up": len(self.caught_up),
            "sync_failures": self.schedule.failures,
            "transfers": {"served": state.served, "received": state.received, "refused": state.refused},
            "refusals": dict(sorted((self.sync.refusals + state.refusals + self.refusals).items())),
            "standings": self.standings(),
            "proven_liars": sorted(self.proven_liars),
        }

    def standings(self) -> dict[str, dict[str, str]]:
        """``uid → {peer: standing}`` of the other replicas this volunteer dealt with (the
        trainer-side vocabulary): ``proven`` once its state checked out (we caught up from it, or
        its last sync contribution was accepted), ``suspect`` when its version claim or last
        contribution was refused, ``excluded`` after a non-finite or implausible state. The
        latest evidence wins; replicas never dealt with are ``unproven`` and not listed."""
        merged = {**self._standings, **self.sync.standings}
        out: dict[str, dict[str, str]] = {}
        for (uid, peer), standing in sorted(merged.items()):
            out.setdefault(uid, {})[peer] = standing.value
        return out

    def _stand(self, uid: str, peer: str, standing: Standing) -> None:
        self._standings.pop((uid, peer), None)  # re-inserted: the oldest stays first to forget
        self._standings[(uid, peer)] = standing
        self.sync.standings.pop((uid, peer), None)  # the newer evidence
        while len(self._standings) > MAX_STANDINGS:
            del self._standings[next(iter(self._standings))]

    def placement(self, hosts: Hosts) -> Placement:
        """What placement says this volunteer should host, given ``hosts``; only the hosts
        ``proven`` to us (``standings``) may make it drop a copy."""
        standings = self.standings()
        # our own copies, served or set aside, at the version they hold now (the declared one may
        # lag a heartbeat): a copy counts as untrained only when no update reached it
        held = {uid: dict(holders) for uid, holders in hosts.items()}
        for uid, backend in [*self.store.backends.items(), *self.aside.items()]:
            held.setdefault(uid, {})[self.me] = backend.updates
        proven = {
            uid: {peer: v for peer, v in holders.items() if standings.get(uid, {}).get(peer) == Standing.PROVEN.value}
            for uid, holders in held.items()
        }
        return place(
            self.grids, held, me=self.me, capacity=self.capacity, hosting=[*self.store.backends, *self.aside],
            max_moves=self.config.max_moves_per_recheck, proven=proven,
        )

    # --- catch-up -------------------------------------------------------------------------------
    async def prepare(self, backend: ExpertBackend, hosts: Hosts) -> bool:
        """Bring ``backend`` up to date from a live replica before it is declared. True when it
        may be hosted: caught up, already as fresh (its own checkpoint), or no other replica
        exists; False when replicas exist but none delivered a believable state in time, or
        their states disagree with no two agreeing.

        Sources are tried freshest first, suspect version claims only if no other delivered a
        state (``catch_up_order``), raced by ``catchup.race_for_state``: the first plausible state
        that no other delivered state contradicts wins (a sole source's is taken as it is), or
        the side our proven sources are on. A peer a checked proof excludes is no source."""
        hosts = self._believed(hosts)
        order, suspects = catch_up_order(
            hosts, backend.uid, me=self.me, factor=self.config.version_claim_factor,
            margin=self.config.version_claim_margin,
        )
        for peer in suspects:
            self._stand(backend.uid, peer, Standing.SUSPECT)
        if suspects:
            self.refusals[VERSION_CLAIM] += len(suspects)
            log.warning("%s: %d version claim(s) far above the other replicas' tried last", backend.uid, len(suspects))
        if not order:
            return True
        claims = hosts.get(backend.uid, {})
        if backend.updates > 0 and claims[order[0]] <= backend.updates:
            # our checkpoint is as fresh as any believable replica: kept, a lineage of its own (sync
            # weighs only replicas whose state we loaded, so it and they no longer merge)
            return True
        believable = [p for p in order if p not in suspects]
        known = self.standings().get(backend.uid, {})
        race = await race_for_state(self.host, backend, [believable, [p for p in order if p in suspects]],
                                    swarm_id=self.swarm_id, config=self.config,
                                    proven={peer for peer, v in known.items() if v == Standing.PROVEN.value})
        for source in race.implausible:
            self.refusals[IMPLAUSIBLE_STATE] += 1
            self._stand(backend.uid, source, Standing.EXCLUDED)
        for source in race.uncorroborated:
            self.refusals[UNCORROBORATED_STATE] += 1
            self._stand(backend.uid, source, Standing.SUSPECT)
        if race.chosen is None:
            why = ("their states disagree, and nothing we proved settles it" if race.uncorroborated
                   else "none delivered a believable state")
            log.warning("not hosting %s: of its %d live replicas, %s", backend.uid, len(order), why)
            return False
        source, header, payload = race.chosen.source, race.chosen.header, race.chosen.payload
        await trio.to_thread.run_sync(import_state, backend, header, payload)  # nobody serves it yet
        self.caught_up[backend.uid] = header.version
        # a copy of a replica's state is in sync with it: declared with a sync age from its first
        # heartbeat, so trainers can audit it before its first round (a volunteer that joins a
        # swarm mid-training is called at once)
        self.sync.aligned(backend.uid)
        self._stand(backend.uid, source, Standing.PROVEN)
        self.sync.guard.vouch(backend.uid, source)  # our lineage is its: standing in our rounds
        if race.corroborated_by is not None:
            self._stand(backend.uid, race.corroborated_by, Standing.PROVEN)
            self.sync.guard.vouch(backend.uid, race.corroborated_by)
        log.info("caught up %s from %s at version %d%s", backend.uid, source[-10:], header.version,
                 f" (corroborated by {race.corroborated_by[-10:]})" if race.corroborated_by else "")
        return True

    def make(self, uid: str) -> ExpertBackend | None:
        """An empty backend of grid expert ``uid`` (None: outside every grid, or no builder)."""
        grid = grid_of(uid, self.grids)
        if grid is None or self.build is None:
            return None
        return self.build(uid, grid.expert_class, grid.hidden_dim)

    # --- hosting changes ---------------------------------------------------------------------------
    async def add(self, uid: str, hosts: Hosts) -> bool:
        """Start hosting ``uid``: build, catch up, serve, then declare. True when it is hosted
        (False for one set aside: only ``take_back`` serves it again)."""
        if uid in self.store.backends:
            return True
        if uid in self.aside:
            return False
        try:
            backend = self.make(uid)
        except VolunteerError as exc:
            log.warning("cannot build %s: %s", uid, describe(exc))
            return False
        if backend is None:
            return False
        if not await self.prepare(backend, hosts):
            again = await self._look_again(uid, hosts)
            if again is None or not await self.prepare(backend, again):
                return False
        if uid in self.store.backends:  # a hand-off delivered it meanwhile
            return True
        self.store.add(backend)
        self.declarer.add(uid)
        return True

    async def _look_again(self, uid: str, hosts: Hosts) -> Hosts | None:
        """After every source of ``uid`` in ``hosts`` failed: a fresh survey of it (a survey may
        have been eclipsed, or a source was replaced), or None when it shows no live host that
        was not tried already."""
        tried = set(hosts.get(uid, {}))
        with trio.move_on_after(self.config.request_timeout):
            try:
                found = await get_experts(self.dht, [uid], quorum=survey_quorum(self.dht))
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.debug("looking %s up again: %s", uid, describe(exc))
                return None
            self._remember_hosts(found)
            fresh = await self.alive_only(hosts_of(found))
            if set(fresh.get(uid, {})) - tried - {self.me}:
                log.info("%s: looking again found hosts the first survey did not show", uid)
                return fresh
        return None

    async def drop(self, uid: str) -> None:
        """Stop hosting ``uid``: tombstone its record first (trainers stop picking us), then let
        the runtime forget it."""
        with trio.move_on_after(self.config.request_timeout):
            await self.declarer.drop(uid)
        if uid in self.store.backends:
            self.store.remove(uid)
        self.aside.pop(uid, None)  # placement moved it elsewhere: nothing left to take back
        self.sync.forget(uid)

    # --- self-care: the node's ``set_aside`` / ``take_back`` (kinds.hosting.Hosting) ----------
    def hosted(self) -> frozenset[str]:
        """The uids served now (those set aside excluded)."""
        return frozenset(self.store.backends)

    async def set_aside(self, uid: str) -> bool:
        """``drop`` ``uid`` (tombstone first) but keep its backend to take back; placement counts
        it as hosted meanwhile. False when it is not hosted."""
        backend = self.store.backends.get(uid)
        if backend is None:
            return False
        await self.drop(uid)
        self.aside[uid] = backend
        return True

    def take_back(self, uids: Sequence[str]) -> list[str]:
        """Serve and declare again those of ``uids`` set aside; returns the uids taken back."""
        back = []
        for uid in uids:
            backend = self.aside.pop(uid, None)
            if backend is None or uid in self.store.backends:
                continue
            self.store.add(backend)
            self.declarer.add(uid)
            back.append(uid)
        return back

    async def vouch(self, pusher: str, uid: str) -> PushClaim:
        """What the DHT says of a push of grid expert ``uid`` by ``pusher`` (the state service's
        ``vouch``): whether ``pusher`` declares it or tombstoned it (a leaver tombstones its
        experts before it hands them off), whether no other live host holds it, and the version the
        pusher declared (its record, or our last survey's once a tombstone replaced it). A uid
        outside every grid, or a lookup that fails, vouches for nothing."""
        if grid_of(uid, self.grids) is None or self.exclusions.excluded(pusher):
            return PushClaim(declared=False, sole=False)
        with trio.move_on_after(self.config.request_timeout):
            try:
                decls, left = await get_hosts_and_leavers(self.dht, uid, quorum=survey_quorum(self.dht))
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.debug("vouching for a push of %s: lookup failed: %s", uid, describe(exc))
                return PushClaim(declared=False, sole=False)
            own = [int(d.version or 0) for d in decls if str(d.peer) == pusher]
            declared = bool(own) or any(str(p) == pusher for p in left)
            # a leaver's tombstone replaced its declaration: the version our last survey saw
            version = own[0] if own else self.hosts.get(uid, {}).get(pusher)
            others = {uid: [d for d in decls if str(d.peer) not in (pusher, self.me)]}
            self._remember_hosts(others)
            alive = await self.alive_only(hosts_of(others))
            return PushClaim(declared=declared, sole=not alive.get(uid), version=version)
        return PushClaim(declared=False, sole=False)

    async def make_room(self, incoming: str) -> bool:
        """Full, and offered ``incoming`` by a leaver: drop the hosted expert with the most other
        live hosts (asked of the DHT now) to take it (BackendStore's ``make_room``). False when
        every hosted expert is a sole copy, or the DHT does not answer in time."""
        mine = [uid for uid in self.store.backends if grid_of(uid, self.grids) is not None and uid != incoming]
        if not mine or grid_of(incoming, self.grids) is None:
            return False
        hosts: dict[str, dict[str, int]] = {}
        with trio.move_on_after(self.config.request_timeout):
            try:
                found = await get_experts(self.dht, mine, quorum=survey_quorum(self.dht))
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.debug("making room for %s: lookup failed: %s", incoming, describe(exc))
                return False
            self._remember_hosts(found)
            # as in a survey: a killed host's lingering record must not make our copy look spare
            hosts = await self.alive_only(hosts_of(found))
        victim = make_room_for(incoming, hosts, me=self.me, hosting=mine)
        if victim is None:
            return False
        log.info("dropping %s (other replicas hold it) to take %s from a leaving volunteer", victim, incoming)
        await self.drop(victim)
        self.moves += 1
        return True

    async def accepted(self, backend: ExpertBackend) -> None:
        """A hand-off made us host ``backend``: declare it (the state service's ``on_accepted``)."""
        log.info("took over %s at version %d (handed off by a leaving volunteer)", backend.uid, backend.updates)
        self.declarer.add(backend.uid)

    async def recheck(self) -> Placement | None:
        """One placement re-check: survey, decide, then add (caught up) and drop what it says."""
        with trio.move_on_after(SURVEY_TIMEOUT):
            hosts = await self.survey()
            decision = self.placement(hosts)
            if decision.outside:
                log.warning("hosting %s outside every grid the swarm declares", ", ".join(decision.outside))
            if decision.add or decision.drop:
                log.info("placement re-check: adding %s, dropping %s", ", ".join(decision.add) or "nothing",
                         ", ".join(decision.drop) or "nothing")
            for uid in decision.add:
                if await self.add(uid, hosts):
                    self.moves += 1
            for uid in decision.drop:
                await self.drop(uid)
                self.moves += 1
            return decision
        log.warning("placement re-check: the DHT did not answer within %.0f s", SURVEY_TIMEOUT)
        return None

    # --- the schedule ------------------------------------------------------------------------------
    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Choose and catch up what to host (``start_hosting``), report started, then re-check
        placement (automatic placement only) and sync every grid (``schedule``), until cancelled."""
        await self.start_hosting()
        await self.schedule.run(auto_place=self.auto_place, task_status=task_status)

    async def sync_grid(self, grid: GridSpec) -> int:
        """One sync round of every hosted expert of ``grid`` now (``Schedule.sync_grid``)."""
        return await self.schedule.sync_grid(grid)

    @property
    def outcomes(self) -> dict[str, SyncOutcome]:
        """uid → its last finished sync round."""
        return self.schedule.outcomes

    async def start_hosting(self) -> list[str]:
        """What to host when the node starts: placement's choice (``auto_place``) or the uids
        named, each caught up from its freshest live replica before it is ever declared. An expert
        whose replicas all fail to deliver is left out under placement, hosted anyway (warned) when
        named. Returns the uids now hosted. JoinError when an expert cannot be built."""
        start = self.start
        hosts: dict[str, dict[str, int]] = {}
        with trio.move_on_after(SURVEY_TIMEOUT):
            try:
                hosts = await self.survey(start.uids)
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.warning("cannot survey the grid (placing on an empty view): %s", describe(exc))
        if self.auto_place:
            uids = list(self.placement(hosts).host)
            log.info("placement: hosting %d of the swarm's grid experts (capacity %d)", len(uids), self.capacity)
        else:
            uids = list(start.uids)
            outside = [uid for uid in uids if grid_of(uid, self.grids) is None]
            if outside:
                log.warning("hosting %d expert(s) outside every grid the swarm declares: %s", len(outside),
                            ", ".join(outside[:4]))
        try:
            backends = [self._build_at_start(uid) for uid in uids]
        except (ExpertConfigError, KeyError, ValueError) as exc:
            raise JoinError(f"cannot build experts: {describe(exc)}") from None
        limiter = trio.CapacityLimiter(START_CATCH_UPS)

        async def one(backend: ExpertBackend) -> None:
            async with limiter:
                ok = grid_of(backend.uid, self.grids) is None or await self.prepare(backend, hosts)
            if (ok or not self.auto_place) and backend.uid not in self.store.backends:  # named uids: hosted anyway
                self.store.add(backend)
                self.declarer.add(backend.uid)

        async with trio.open_nursery() as catchups:
            for backend in backends:
                catchups.start_soon(one, backend)
        return sorted(self.store.backends)

    def _build_at_start(self, uid: str) -> ExpertBackend:
        if self.build is None:
            raise ExpertConfigError("this volunteer builds no experts")
        grid = grid_of(uid, self.grids)
        if grid is not None and (self.auto_place or self.start.expert_class is None):
            return self.build(uid, grid.expert_class, grid.hidden_dim)
        return self.build(uid, self.start.expert_class or "", self.start.hidden_dim)

    # --- a paused volunteer is quiet (outside its network hours, or the donor's pause) -----------
    def pause(self) -> None:
        """Run no sync round, survey or re-check until ``resume()``: a paused volunteer uses no
        network for its replicas (one that paused outside its network hours still synced every
        round, and overshot a daily transfer cap)."""
        self.schedule.pause()

    def resume(self) -> None:
        """Sync, survey and re-check again (the next period's round; a missed one is not made up)."""
        self.schedule.resume()

    # --- leaving -------------------------------------------------------------------------------------
    async def hand_off_all(self, timeout: float | None = None) -> HandOffResult:
        """Push every hosted expert that no other live replica holds to a volunteer with room
        (tried best first), within ``timeout`` (``handoff_timeout``). Never raises; the result says
        what could not be handed off (the checkpoints still keep it)."""
        budget = self.config.handoff_timeout if timeout is None else timeout
        started = trio.current_time()
        mine = self.store.versions()
        if not mine:
            return HandOffResult()
        with trio.move_on_after(budget) as scope:
            try:
                hosts = await self.survey(list(mine))
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.warning("hand-off: the DHT lookup failed: %s", describe(exc))
                hosts = {}
        if scope.cancelled_caught:
            hosts = {}
        # receivers: volunteers serving experts of this swarm; how much room each has is not
        # declared, so each is offered them all and a full one refuses (the next candidate is tried)
        candidates = sorted({peer for holders in hosts.values() for peer in holders if peer != self.me})
        spare = {peer: len(mine) for peer in candidates}
        plan = plan_handoff(mine, hosts, spare, me=self.me, max_candidates=self.config.handoff_candidates)
        addrs = {peer: PeerID.from_string(peer) for peer in candidates}
        left = max(0.0, budget - (trio.current_time() - started))
        result = await hand_off(
            self.host, plan, self.store, swarm_id=self.swarm_id, addrs=addrs, timeout=left, config=self.config,
            upload=self.upload,
        )
        for uid, (peer, version) in sorted(result.done.items()):
            log.warning("handed off %s (version %d) to %s", uid, version, peer[-10:])
        return result


__all__ = [
    "ACTIVATION_MARGIN", "BuildBackend", "ReplicaManager", "StartHosting", "placement_capacity", "synced_ages", "versions_of",
]
