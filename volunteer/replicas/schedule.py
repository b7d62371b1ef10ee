"""When a volunteer's replicas act, once it hosts what it chose at the start (``ReplicaManager.run``).

- re-checks of placement (automatic placement only): one follows each sync round that proves a
  co-holder not proven before (volunteers started together picked from the same view; the round
  proves their duplicate copies to each other, and only a proven co-holder lets a copy move),
  spread per volunteer; besides, every ``recheck_period``, jittered so volunteers do not re-check
  in step (``placement.recheck_delay``);
- surveys of the grids (named experts place nothing, but the coverage view must follow the swarm):
  soon after the start, then every ``recheck_period``;
- a sync round of every hosted grid expert at each wall-clock multiple of its grid's
  ``sync_period``, with the other live replicas (``ReplicaSync.average``), all in parallel.

The schedule decides only when; what a re-check and a survey do is the manager's (``recheck``,
``survey``), handed in. A paused schedule (``pause``) runs none of them.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import trio

from ..dht.declare import ExpertDeclarer
from ..dht.grid import get_experts, survey_quorum
from ..dht.node import DHTNode
from ..errors import VolunteerError, describe
from ..experts.standing import Standing
from ..net.identity import PeerID
from ..net.service import HostAPI
from .config import ReplicasConfig
from .coverage import next_round_at
from .grid import GridSpec
from .placement import Placement, recheck_delay, tie_break
from .store import BackendStore
from .survey import remember_addrs
from .sync import SyncOutcome
from .syncdriver import ReplicaSync

log = logging.getLogger(__name__)

SURVEY_TIMEOUT = 30.0  # a DHT survey of the grids that takes longer is abandoned for this re-check
EARLY_SURVEY = 15.0  # seconds after the start a volunteer of named experts surveys the grids again


class Schedule:
    """The loops of a volunteer's replicas: re-checks (``recheck``), surveys (``survey``) and each
    grid's sync rounds; ``outcomes`` and ``failures`` count what the rounds did."""

    def __init__(
        self,
        *,
        host: HostAPI,
        dht: DHTNode,
        store: BackendStore,
        sync: ReplicaSync,
        declarer: ExpertDeclarer,
        grids: list[GridSpec],
        config: ReplicasConfig,
        clock: Callable[[], float],
        recheck: Callable[[], Awaitable[Placement | None]],
        survey: Callable[[], Awaitable[object]],
    ) -> None:
        self.host = host
        self.dht = dht
        self.store = store
        self.sync = sync
        self.declarer = declarer
        self.grids = grids
        self.config = config
        self.clock = clock  # the wall clock replicas align their sync rounds on
        self.recheck = recheck
        self.survey = survey
        self.paused = False  # no sync, survey or re-check while set (``pause``)
        self.failures = 0  # sync rounds that failed
        self.outcomes: dict[str, SyncOutcome] = {}  # uid → its last finished sync round
        # a sync round proved a co-holder it had not proved before: a duplicate copy may now move
        self._new_proof = trio.Event()

    @property
    def me(self) -> str:
        return str(self.host.peer_id)

    async def run(self, *, auto_place: bool, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Re-check placement (``auto_place``) or survey, and sync every grid, until cancelled."""
        async with trio.open_nursery() as nursery:
            if auto_place:
                nursery.start_soon(self._recheck_loop)
            elif self.grids:
                nursery.start_soon(self._survey_loop)
            for grid in self.grids:
                nursery.start_soon(self._sync_loop, grid)
            task_status.started()

    def pause(self) -> None:
        """Run no sync round, survey or re-check until ``resume()``."""
        self.paused = True

    def resume(self) -> None:
        """Sync, survey and re-check again (the next period's round; a missed one is not made up)."""
        self.paused = False

    async def _recheck_loop(self) -> None:
        # volunteers started together picked from the same view, and a re-check that moved copies
        # may have moved two to the same expert: a sync round proves the co-holders to each other,
        # and a re-check right after it (spread per volunteer, so they move one after the other)
        # undoes the duplicates, minutes before the period would. Every new proof calls for one:
        # the rounds of a start's duplicates do not all prove in the same tick (a declaration not
        # yet found, a round that ran out), and a re-check that ran before a proof could not move
        # that copy; waiting a period for the next was the lost minutes the early re-check is for.
        # Rounds that prove again whom they proved already call for none
        count = 0
        while True:
            count += 1
            with trio.move_on_after(recheck_delay(self.me, count, self.config.recheck_period, self.config.recheck_jitter)):
                await self._new_proof.wait()
                await trio.sleep(self.config.early_recheck_spread * tie_break(self.me, f"early-{count}") / 2**64)
            # a proof from here on calls for the next re-check: this one's survey may precede it
            self._new_proof = trio.Event()
            if self.paused:
                continue
            try:
                await self.recheck()
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.warning("placement re-check failed: %s", describe(exc))

    async def _survey_loop(self) -> None:
        """Named experts place nothing, but the coverage view must not stay the start's, taken
        before the peers were up: surveyed again soon after the start, then every re-check period."""
        await trio.sleep(min(EARLY_SURVEY, self.config.recheck_period))
        while True:
            with trio.move_on_after(SURVEY_TIMEOUT):
                try:
                    if not self.paused:
                        await self.survey()
                except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                    log.info("coverage survey failed: %s", describe(exc))
            await trio.sleep(self.config.recheck_period)

    async def _sync_loop(self, grid: GridSpec) -> None:
        # every replica of a grid opens its round at the same wall-clock multiple of its period
        while True:
            now = self.clock()
            await trio.sleep(max(0.0, next_round_at(now, grid.sync_period) - now))
            await self.sync_grid(grid)

    async def sync_grid(self, grid: GridSpec) -> int:
        """One sync round of every hosted expert of ``grid`` with its other live replicas (from a
        fresh DHT lookup), all in parallel, each bounded by ``sync_timeout``; rounds run."""
        mine = [uid for uid in self.store.backends if grid.contains(uid)]
        if not mine or self.paused:
            return 0
        try:
            with trio.fail_after(self.config.sync_timeout):
                found = await get_experts(self.dht, mine, quorum=survey_quorum(self.dht))
        except (VolunteerError, OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
            log.debug("sync of grid %s: lookup failed: %s", grid.prefix, describe(exc))
            return 0
        rounds = 0
        remember_addrs(self.host, found)
        async with trio.open_nursery() as nursery:
            for uid in mine:
                peers = [d.peer for d in found.get(uid, []) if d.peer != self.host.peer_id]
                if peers:
                    rounds += 1
                    nursery.start_soon(self._one_round, uid, peers)
        return rounds

    async def _one_round(self, uid: str, peers: list[PeerID]) -> None:
        first = uid not in self.sync.last_sync
        if self.store.suspect(uid):
            # it took gradients past its bound lately: until its trainer is cleared or refused
            # (and the expert rolled back), it is no reference for the others; it sits out
            log.info("sync of %s skipped: it took gradients past its bound lately", uid)
            return
        proven_before = {str(peer) for peer in peers if self.sync.standings.get((uid, str(peer))) is Standing.PROVEN}
        try:
            outcome = await self.sync.average(uid, peers)
        except VolunteerError as exc:  # e.g. the expert was dropped or handed over meanwhile
            self.failures += 1
            log.debug("sync of %s failed: %s", uid, describe(exc))
            return
        self.outcomes[uid] = outcome
        if any(self.sync.standings.get((uid, peer)) is Standing.PROVEN for peer in set(outcome.contributors) - proven_before):
            self._new_proof.set()
        if first:
            # its first sync age: declared now, not a heartbeat period later (until a trainer
            # reads one, no audit can compare this replica with another)
            self.declarer.refresh()
        if outcome.missing:
            log.debug("sync of %s finished without %d replica(s)", uid, len(outcome.missing))


__all__ = ["EARLY_SURVEY", "SURVEY_TIMEOUT", "Schedule"]
