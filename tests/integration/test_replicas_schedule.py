"""When a volunteer re-checks its placement (``replicas/schedule.py``): after each sync round that
proves a co-holder it had not proved before, and not after rounds that prove the same again. The
sync rounds and the re-check are stand-ins: only the schedule's timing is under test."""

from __future__ import annotations

import functools

import trio

from volunteer.experts.standing import Standing
from volunteer.net.identity import KeyPair
from volunteer.replicas import ReplicasConfig
from volunteer.replicas.placement import Placement
from volunteer.replicas.schedule import Schedule
from volunteer.replicas.sync import SyncOutcome

SPREAD = 1.0
CONFIG = ReplicasConfig(recheck_period=3600.0, early_recheck_spread=SPREAD)
NOTHING = Placement((), (), (), ())


class _Host:
    def __init__(self) -> None:
        self.peer_id = KeyPair.generate().peer_id


class _Store:
    backends: dict = {}

    def suspect(self, uid: str) -> bool:
        return False


class _Declarer:
    def refresh(self) -> None:
        pass


class _Sync:
    """Every round merges every peer asked, as a founding pair's first round does: proven."""

    def __init__(self) -> None:
        self.standings: dict[tuple[str, str], Standing] = {}
        self.last_sync: dict[str, float] = {}

    async def average(self, uid, peers) -> SyncOutcome:
        for peer in peers:
            self.standings[(uid, str(peer))] = Standing.PROVEN
        self.last_sync[uid] = trio.current_time()
        return SyncOutcome(uid, 0, tuple(str(p) for p in peers), ())


async def test_each_new_proof_calls_for_a_recheck_and_a_repeated_one_does_not(autojump_clock):
    """Two donors' duplicate picks are not all proven in the same tick: a re-check that ran after
    the first proof, and could move nothing, must not leave the second copy to the period (the
    test of two donors started together then waited 600 s and failed one run in eighteen)."""
    rechecks: list[float] = []

    async def recheck() -> Placement:
        rechecks.append(trio.current_time())
        return NOTHING  # the copy proven so far is the other donor's to move

    async def survey() -> None:
        pass

    partner = KeyPair.generate().peer_id
    schedule = Schedule(host=_Host(), dht=None, store=_Store(), sync=_Sync(), declarer=_Declarer(), grids=[],  # type: ignore[arg-type]
                        config=CONFIG, clock=trio.current_time, recheck=recheck, survey=survey)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(schedule.run, auto_place=True))
            await trio.sleep(10.0)
            assert rechecks == []  # nothing proven: the period (an hour) is far off
            await schedule._one_round("dup.0", [partner])
            await trio.sleep(SPREAD + 0.1)
            assert len(rechecks) == 1
            await schedule._one_round("dup.0", [partner])  # proven again: nothing new to move
            await trio.sleep(SPREAD + 0.1)
            assert len(rechecks) == 1
            await schedule._one_round("dup.1", [partner])  # the second duplicate's proof, late
            await trio.sleep(SPREAD + 0.1)
            assert len(rechecks) == 2
            schedule.pause()
            await schedule._one_round("dup.2", [partner])
            await trio.sleep(SPREAD + 0.1)
            assert len(rechecks) == 2  # a paused volunteer re-checks nothing
            nursery.cancel_scope.cancel()
