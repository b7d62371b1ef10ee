"""The daemon part that applies fold / pause / finish, the run-when policies and self-care to a
running volunteer node: a thin trio driver around the pure cores ``fold.Conduct``,
``policy.RunPolicy`` and ``selfcare``'s ``FailureStreaks`` / ``VisibilityWatch``. It acts on the
node only through ``control.NodeControl`` (the node owns every verb: pause, finish, set-aside,
take-back, the look-up of our own record, re-joining); the decisions stay here.

Three tasks, started by ``run`` once the node is up:

* the policy sampler: every ``period`` seconds it asks the probe (``probes.py``) how the machine
  looks, hands the observations and the probe's ``now`` to ``RunPolicy`` and the verdict to
  ``Conduct``; each change is logged with its reason and origin;
* the reconciler: whenever ``Conduct`` changes it makes the node match, one change at a time:
  ``node.pause()`` withdraws the experts at once, ``node.resume()`` declares them again, a finish
  drains in-flight calls, hands off sole copies and saves checkpoints, and a pause that lasts
  (``Conduct.pause_lasts``) hands off sole copies as a graceful leave would;
* the visibility watch: every heartbeat while serving, it asks the peers closest to one of its
  experts' keys whether they hold its record; after two misses it re-dials the swarm's bootstrap
  peers and relays, bootstraps the DHT again and declares at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from .control import NodeControl
from .fold import Conduct, Event
from .policy import GPU_USE_LINE, GPU_USE_UNKNOWN, Observations, PolicySettings, RunPolicy
from .probes import CpuSample, SystemProbe, other_load
from .selfcare import DEFAULT_FAILURE_LIMIT, FailureStreaks, SwarmContact, VisibilityWatch
from .status import AskReply, ObservedView, PolicyView, SelfCareView, StewardSnapshot

log = logging.getLogger(__name__)

POLICY_PERIOD = 5.0  # seconds between samples of the machine (BOINC looks every 10 s)
CONTACT_PERIOD = 2.0  # seconds between looks at how many peers the node is connected to
VISIBILITY_CHECK_TIMEOUT = 20.0  # a look-up of our own record that takes longer counts as a miss
FINISH_DEADLINE = 60.0  # in-flight calls a finish waits for at most


class TrafficMeter:
    """Bytes in and out over every connection, counted as each connection's counters grow
    (a connection's bytes since the last look are lost if it closes in between)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Any, int]] = {}  # id(conn) -> (conn, bytes at the last look)

    def step(self, connections: list[Any]) -> int:
        """Bytes moved since the last call, over ``connections`` (the Host's, open or not)."""
        grown = 0
        seen: dict[int, tuple[Any, int]] = {}
        for conn in connections:
            total = int(conn.bytes_sent) + int(conn.bytes_received)
            before = self._seen.get(id(conn))
            grown += total - before[1] if before is not None and before[0] is conn else total
            seen[id(conn)] = (conn, total)
        self._seen = seen
        return max(0, grown)


class Steward:
    """Applies the donor's choice, the run-when verdict and self-care to ``node``."""

    def __init__(
        self,
        conduct: Conduct,
        settings: PolicySettings,
        probe: SystemProbe | None,
        *,
        period: float = POLICY_PERIOD,
        failure_limit: int = DEFAULT_FAILURE_LIMIT,
        transferred_today: Callable[[float], int] = lambda now: 0,
        on_fold: Callable[[str], None] | None = None,
        on_choice: Callable[[Conduct], None] | None = None,
        contact: SwarmContact | None = None,
        contact_period: float = CONTACT_PERIOD,
    ) -> None:
        self.conduct = conduct
        self.settings = settings
        self.policy = RunPolicy(settings)
        self.probe = probe
        self.period = period
        self.streaks = FailureStreaks(limit=failure_limit)
        self.visibility = VisibilityWatch()
        self.contact = contact or SwarmContact()  # cut off from the swarm, and back
        self.contact_period = contact_period
        self.transferred_today = transferred_today
        self.on_fold = on_fold  # told of a fold from the donor (the first one records consent)
        self.on_choice = on_choice  # told of each change of the donor's choice (kept across restarts)
        self.clock: Callable[[], float] = probe.now if probe is not None else time.time  # wall clock
        self.node: NodeControl | None = None
        self._nursery: trio.Nursery | None = None  # runs the set-asides ``outcome`` asks for
        self.last_observations: Observations | None = None
        self._cpu: CpuSample | None = None
        self._last_transfer: tuple[float, int] | None = None  # (when, transferred today) at the last sample
        self._changed = trio.Event()
        self._lock = trio.Lock()  # one change of the node's state at a time

    # --- running ---------------------------------------------------------------------------------------
    async def run(self, node: NodeControl, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample, reconcile and watch ``node`` until cancelled. The node's expert server tells
        each call's outcome to ``outcome`` (``VolunteerOptions.on_outcome``)."""
        self.node = node
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.probe is not None:
                self.sample()  # the first verdict before anything is declared
            await self._reconcile()
            nursery.start_soon(self._reconcile_loop)
            if self.probe is not None:
                nursery.start_soon(self._sample_loop)
            nursery.start_soon(self._watch_visibility)
            nursery.start_soon(self._watch_contact)
            task_status.started()

    def _note(self, event: Event | None) -> None:
        if event is None:
            return
        # fold, pause, finish are the donor's own actions, whether typed, clicked or set as a
        # policy: notices (INFO, which `join` shows), never warnings; WARN is kept for problems
        # (an expert that keeps failing, experts unseen in the DHT, cut off from the swarm)
        log.info("%s", event.line, extra={"conduct_event": True})
        self._changed.set()

    # --- the donor's verbs -----------------------------------------------------------------------------
    async def ask(self, action: str, origin: str) -> AskReply:
        """fold / pause / finish from ``origin`` (cli, web). Returns once the experts are declared
        or withdrawn accordingly; a finish's draining, hand-off and checkpoints go on after."""
        now = self.clock()
        if action == "fold":
            self._take_back(now)
            if self.on_fold is not None:
                self.on_fold(origin)
        event = self.conduct.ask(action, origin, now)
        self._note(event)
        if event is not None and self.on_choice is not None:
            self.on_choice(self.conduct)
        await self._match()
        self._changed.set()
        paused = self.node.paused if self.node is not None else not self.conduct.serving
        return AskReply(ok=True, paused=paused, state=self.conduct.state, text=self.conduct.text,
                        changed=event is not None)

    # --- the run-when policies -------------------------------------------------------------------------
    def sample(self) -> Observations:
        """Observe the machine once and hand the verdict to ``Conduct``."""
        assert self.probe is not None
        probe = self.probe
        now = probe.now()
        load = probe.other_load()
        if load is None:
            cpu = probe.cpu()
            if cpu is not None:
                load = other_load(self._cpu, cpu)
                self._cpu = cpu
        transferred, ahead = self._transfer_figures(now)
        seen = Observations(
            on_battery=probe.on_battery(),
            other_load=load,
            programs=probe.programs() if self.settings.pause_programs else frozenset(),
            input_idle_s=probe.input_idle_s() if self.settings.when_idle else None,
            transferred_today=transferred,
            transfer_ahead=ahead,
            gpu_users=probe.gpu_users() if self.settings.pause_on_gpu_use else None,
        )
        self.last_observations = seen
        self._note(self.conduct.set_verdict(self.policy.decide(seen, now), now))
        return seen

    def _transfer_figures(self, now: float) -> tuple[int, int]:
        """Bytes moved today, and what the rate since the last sample moves in one more period
        (0 without a cap, or at the day's first sample, or when the count went down at midnight)."""
        if not self.settings.daily_transfer:
            return 0, 0
        moved = self.transferred_today(now)
        last, self._last_transfer = self._last_transfer, (now, moved)
        if last is None or now <= last[0] or moved < last[1]:
            return moved, 0
        rate = (moved - last[1]) / (now - last[0])
        return moved, int(rate * self.period)

    async def _sample_loop(self) -> None:
        while True:
            await trio.sleep(self.period)
            self.sample()
            self._changed.set()  # a pause that lasts hands off: the reconciler looks again

    # --- making the node match ---------------------------------------------------------------------------
    async def _reconcile_loop(self) -> None:
        while True:
            await self._changed.wait()
            self._changed = trio.Event()
            await self._reconcile()

    async def _match(self) -> None:
        """Declare and take calls, or withdraw and refuse them, as ``Conduct`` says now."""
        node = self.node
        if node is None:
            return
        async with self._lock:
            if self.conduct.serving:
                if node.paused:
                    node.resume(quiet=True)  # the conduct event said it
                    self.visibility.reset()
            elif not node.paused:
                await node.pause(quiet=True)

    async def _reconcile(self) -> None:
        node = self.node
        if node is None:
            return
        await self._match()
        conduct = self.conduct
        if conduct.serving:
            return
        if conduct.choice == "finishing":
            await self._finish(node)
        elif conduct.pause_lasts(self.clock()):
            conduct.handed_off = True
            self._log_hand_off("the pause lasts", await node.hand_off())

    async def _finish(self, node: NodeControl) -> None:
        done = await node.finish(FINISH_DEADLINE)
        self._log_hand_off("finishing", (done.handed_off, done.kept))
        finished = self.conduct.finished(self.clock(), f"in-flight calls done, checkpoints saved ({done.saved} experts)")
        self._note(finished)
        if finished is not None and self.on_choice is not None:
            self.on_choice(self.conduct)

    @staticmethod
    def _log_hand_off(why: str, moved: tuple[int, int] | None) -> None:
        if moved is not None and any(moved):
            log.info("%s: handed off %d sole copies; %d could not be (their checkpoints keep them)", why, *moved)

    # --- self-care: experts that keep failing ----------------------------------------------------------
    def outcome(self, uid: str, error: str | None) -> None:
        """One expert call's outcome (error None: answered); K failures in a row set it aside."""
        if error is None:
            self.streaks.succeeded(uid)
        elif self.streaks.failed(uid, error) and self._nursery is not None:
            self._nursery.start_soon(self._set_aside, uid)

    async def _set_aside(self, uid: str) -> None:
        node = self.node
        if node is None or uid not in node.hosted():
            return
        why = self.streaks.set_aside.get(uid, "keeps failing")
        log.warning("expert %s %s: set aside (withdrawn, calls refused); `volunteer fold` takes it back", uid, why)
        await node.set_aside(uid)
        self._note(self.conduct.set_hold(self.streaks.hold(set(node.hosted())), self.clock()))

    def _take_back(self, now: float) -> None:
        node = self.node
        uids = self.streaks.take_back()
        if node is None:
            return
        back = node.take_back(uids)
        if back:
            log.info("took back %d expert(s) set aside after failures: %s", len(back), ", ".join(back))
        self._note(self.conduct.set_hold(None, now))

    # --- self-care: visible in the DHT ----------------------------------------------------------------
    async def _watch_visibility(self) -> None:
        node = self.node
        period = node.heartbeat_period if node is not None else None
        if node is None or period is None:
            return  # the kind cannot tell whether we are visible
        while True:
            await trio.sleep(period * self.visibility.quiet)
            if not self.conduct.serving or node.paused:
                self.visibility.reset()
                continue
            seen: bool | None = False  # a look-up that takes too long counts as a miss
            with trio.move_on_after(VISIBILITY_CHECK_TIMEOUT):
                seen = await node.visible()
            if seen is None:  # nothing declared yet
                self.visibility.reset()
                continue
            if self.visibility.observe(seen, self.clock()):
                await self._rejoin(node)

    async def _rejoin(self, node: NodeControl) -> None:
        log.warning("our experts have not been visible in the DHT for %d heartbeats: re-joining the swarm "
                    "(re-dialling %d bootstrap peers and relays)", self.visibility.misses_allowed, node.entry_points)
        answered = None
        with trio.move_on_after(VISIBILITY_CHECK_TIMEOUT):
            answered = await node.rejoin()
        log.info("re-joined: %d of %d bootstrap peers and relays answered; experts declared again",
                 answered or 0, node.entry_points)

    # --- self-care: in touch with the swarm --------------------------------------------------------
    async def _watch_contact(self) -> None:
        node = self.node
        if node is None or not node.entry_points:
            return  # the first node of a new swarm has no one to be cut off from
        while True:
            await trio.sleep(self.contact_period)
            connected = node.connected_peers()
            now = self.clock()
            change = self.contact.observe(connected, now)
            if change == "cut":
                log.warning("%s", self.contact.text(_clock_time(self.contact.cut_off_since)))
            elif change == "back":
                log.info("back in touch with the swarm: %d peer(s) connected", connected)
                continue
            if change in ("cut", "redial"):
                await self._redial(node)

    async def _redial(self, node: NodeControl) -> int | None:
        """Re-dial the swarm's bootstrap peers and relays (``NodeControl.redial``); how many
        answered (0 when none did within VISIBILITY_CHECK_TIMEOUT, None where the kind cannot)."""
        answered: int | None = 0
        with trio.move_on_after(VISIBILITY_CHECK_TIMEOUT):
            answered = await node.redial()
        if answered is not None:
            log.info("re-dialled the swarm: %d of %d bootstrap peers and relays answered", answered, node.entry_points)
        return answered

    def state_text(self) -> str:
        """What the node does and why (``Conduct.text``), and that it is cut off when it is."""
        cut = self.contact.text(_clock_time(self.contact.cut_off_since)) if self.contact.cut_off_since else None
        return f"{self.conduct.text}; {cut}" if cut else self.conduct.text

    # --- status ---------------------------------------------------------------------------------------
    def snapshot(self) -> StewardSnapshot:
        """The snapshot's ``conduct``, ``policy`` and ``self_care`` pieces."""
        now = self.clock()
        seen = self.last_observations
        gpu_unknown = seen is not None and self.settings.pause_on_gpu_use and seen.gpu_users is None
        observed = None if seen is None else ObservedView(
            on_battery=seen.on_battery, other_load=seen.other_load,
            input_idle_s=seen.input_idle_s, transferred_today=seen.transferred_today,
            gpu_users=None if seen.gpu_users is None else sorted(seen.gpu_users),
            # the GPU-use policy where nothing tells which programs use the GPU
            gpu_use=None if not self.settings.pause_on_gpu_use else
            (GPU_USE_UNKNOWN if seen.gpu_users is None else "watched"),
        )
        return StewardSnapshot(
            conduct=self.conduct.view(now),
            policy=PolicyView(
                settings=self.settings.as_dict(),
                lines=[f"{line} ({GPU_USE_UNKNOWN})" if line == GPU_USE_LINE and gpu_unknown else line
                       for line in self.settings.describe()],
                verdict=self.conduct.verdict.as_dict(),
                observed=observed,
            ),
            self_care=SelfCareView(
                failure_limit=self.streaks.limit,
                set_aside=dict(self.streaks.set_aside),
                visibility=self.visibility.view(now),
                contact=self.contact.view(now),
            ),
        )


def _clock_time(when: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when)) if when is not None else "?"


__all__ = ["CONTACT_PERIOD", "POLICY_PERIOD", "Steward", "TrafficMeter"]
