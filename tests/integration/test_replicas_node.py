"""Replicated experts through ``open_volunteer`` nodes: a late joiner catches up before
it declares, replicas agree after a sync, a replica killed mid-sync stalls nobody, and a leaver's
sole expert is handed over at its version. Loopback only; the swarm file's grid is a SwarmSpec's."""

from __future__ import annotations

import torch
import trio

from volunteer.cli import views
from volunteer.dht import DHTConfig
from volunteer.dht.grid import get_experts
from volunteer.experts import ExpertsConfig
from volunteer.net.stack import StackOptions
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.replicas import ReplicasConfig
from volunteer.replicas.state import state_digest
from volunteer.swarmfile import GridSpec, SwarmSpec

SWARM = "replicanode"
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
# heartbeats at start and when the experts change (the manager wakes the declarer), not on a timer
DHT = DHTConfig(swarm_id=SWARM, expert_update_period=600.0, expert_expiration=1200.0)
# rounds and re-checks only when a test asks: periods far beyond any test's bound; a round that
# waited for its deadline would outlast the test's fail_after, so liveness shows without timing
CONFIG = ReplicasConfig(sync_timeout=600.0, recheck_period=3600.0, handoff_timeout=60.0)
HIDDEN = 8
GRID = GridSpec("rep", (2,), "ffn", HIDDEN, replicas=2, sync_period=3600.0)
ALONE = GridSpec("solo", (1,), "ffn", HIDDEN, replicas=1, sync_period=3600.0)


def spec(*bootstrap, grids=(GRID,)) -> SwarmSpec:
    return SwarmSpec(SWARM, SWARM, list(bootstrap), [], grids=list(grids))


def options(**changes) -> VolunteerOptions:
    base = dict(listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, dht_config=DHT, nat=False, mdns=False,
                experts_config=ExpertsConfig(device="cpu"), replicas_config=CONFIG)
    return VolunteerOptions(**{**base, **changes})


async def train(node, uid: str, steps: int, seed: int = 0) -> None:
    """``steps`` optimizer updates of ``uid`` through the node's runtime (a trainer's backward)."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, HIDDEN, generator=gen)
        await node.runtime.backward(uid, [x], [torch.randn(4, HIDDEN, generator=gen)])
    await node.runtime.settled()  # the last step is applied: the test reads the state next


async def declared_versions(dht, uid: str) -> dict:
    return {str(d.peer): d.version for d in (await get_experts(dht, [uid]))[uid]}


async def until(predicate, what: str) -> None:
    while not await predicate():
        await trio.sleep(0.02)


async def test_late_joiner_catches_up_before_declaring_and_replicas_agree_after_a_sync():
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry), options(place=True, max_experts=2)) as first:
            assert sorted(first.runtime.uids) == ["rep.0", "rep.1"]
            await train(first, "rep.0", 3)
            version = first.runtime.backends["rep.0"].updates
            assert version == 3
            digest = state_digest(first.runtime.backends["rep.0"])
            first.declarer.resume()  # declare the new version now
            await until(lambda: _has_version(seed.dht, "rep.0", str(first.host.peer_id), 3), "declared")

            async with open_volunteer(spec(entry), options(place=True, max_experts=2)) as late:
                joined = late.runtime.backends["rep.0"]
                # downloaded before the runtime even started: the state equals the replica's
                assert late.replicas.caught_up["rep.0"] == version
                assert state_digest(joined) == digest and joined.updates == version
                # and its first declaration already carried the caught-up version and, no round
                # having run (the grid syncs hourly), a sync age: a copy of a replica is in sync
                # with it, so trainers can audit the joiner from its first reply
                mine = str(late.host.peer_id)
                await until(lambda: _has_version(seed.dht, "rep.0", mine, version), "declared")
                assert late.replicas.sync.rounds == 0 and "rep.0" in late.replicas.sync.last_sync
                assert await _has_synced(seed.dht, "rep.0", mine)

                # trained apart, then synced with no training in between: the joiner merges the
                # replica it loaded from; that one never weighs the joiner (anyone may load a state)
                await train(first, "rep.0", 2, seed=1)
                await train(late, "rep.0", 1, seed=2)
                source = {n: p.detach().clone() for n, p in first.runtime.backends["rep.0"].module.named_parameters()}
                joiner = {n: p.detach().clone() for n, p in late.runtime.backends["rep.0"].module.named_parameters()}
                seeded = str(first.host.peer_id)  # caught up from nobody: no sync age yet
                assert not await _has_synced(seed.dht, "rep.0", seeded)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(first.replicas.sync_grid, GRID)
                    nursery.start_soon(late.replicas.sync_grid, GRID)
                # its first round's age is declared at once, not a heartbeat period (here 600 s) later
                await until(lambda: _has_synced(seed.dht, "rep.0", seeded), "first sync age declared")
                for n, p in first.runtime.backends["rep.0"].module.named_parameters():
                    assert torch.equal(p, source[n])
                for n, p in late.runtime.backends["rep.0"].module.named_parameters():
                    assert torch.allclose(p, (source[n] + joiner[n]) / 2, atol=1e-6)
                # in a pair each keeps its own version: the other's claim alone is not evidence
                assert (first.runtime.backends["rep.0"].updates, late.runtime.backends["rep.0"].updates) == (5, 4)
                assert late.replicas.outcomes["rep.0"].contributors
                row = next(r for r in views.expert_rows(late, trio.current_time()) if r["uid"] == "rep.0")
                assert row["version"] == 4 and row["last_sync_age_s"] is not None
                coverage = views.coverage_view(late)
                assert coverage["grids"][0]["prefix"] == "rep" and coverage["grids"][0]["total"] == 2
                # and trainers see it too (`volunteer experts`): the next heartbeat declares the sync's age
                late.declarer.resume()
                await until(lambda: _has_synced(seed.dht, "rep.0", mine), "sync age declared")


async def _has_synced(dht, uid: str, peer: str) -> bool:
    from volunteer.dht.grid import get_experts

    found = await get_experts(dht, [uid])
    return any(str(d.peer) == peer and d.synced_age is not None for d in found.get(uid, []))


async def _has_version(dht, uid: str, peer: str, version: int) -> bool:
    return (await declared_versions(dht, uid)).get(peer) == version


async def test_a_replica_killed_mid_sync_does_not_stall_the_others():
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry), options(place=True, max_experts=2)) as a, open_volunteer(
            spec(entry), options(place=True, max_experts=2)
        ) as b:
            async with trio.open_nursery() as nursery:
                victim = await nursery.start(_doomed_replica, entry)
                node, scope = victim
                for uid in ("rep.0", "rep.1"):
                    holders = lambda uid=uid: _holders(seed.dht, uid, 3)  # noqa: E731
                    await until(holders, "three replicas declared")
                async with trio.open_nursery() as rounds:
                    rounds.start_soon(a.replicas.sync_grid, GRID)
                    rounds.start_soon(b.replicas.sync_grid, GRID)
                    # the victim received contributions (stashed: it opens no round) and dies
                    while not node.replicas.sync._stash:
                        await trio.sleep(0.01)
                    scope.cancel()
                dead = str(node.host.peer_id)
                for survivor in (a, b):
                    for uid in ("rep.0", "rep.1"):
                        outcome = survivor.replicas.outcomes[uid]
                        assert dead in outcome.missing and len(outcome.contributors) == 1


async def _holders(dht, uid: str, count: int) -> bool:
    return len((await get_experts(dht, [uid]))[uid]) >= count


async def _doomed_replica(entry, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    with trio.CancelScope() as scope:
        async with open_volunteer(spec(entry), options(place=True, max_experts=2)) as node:
            task_status.started((node, scope))
            await trio.sleep_forever()


async def test_a_leaver_hands_its_sole_expert_over_at_its_version():
    grids = (GRID, ALONE)
    async with open_volunteer(spec(grids=grids), options()) as seed:
        entry = seed.host.full_addrs()[0]
        # the receiver hosts one expert of another grid and has room for one more
        async with open_volunteer(spec(entry, grids=grids), options(uids=["rep.0"], max_experts=2)) as receiver:
            async with open_volunteer(spec(entry, grids=grids), options(uids=["solo.0"])) as leaver:
                assert leaver.runtime.uids == ["solo.0"]
                await until(lambda: _holders(seed.dht, "rep.0", 1), "receiver declared")
                await train(leaver, "solo.0", 4)
                leaver.leave()
            assert leaver.handed_off is not None
            assert leaver.handed_off.done["solo.0"] == (str(receiver.host.peer_id), 4)
            taken = receiver.runtime.backends["solo.0"]
            assert taken.updates == 4
            mine = str(receiver.host.peer_id)
            await until(lambda: _has_version(seed.dht, "solo.0", mine, 4), "receiver declares it")


async def test_a_full_volunteer_refuses_a_hand_off_and_the_leaver_says_so():
    grids = (GRID, ALONE)
    async with open_volunteer(spec(grids=grids), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry, grids=grids), options(uids=["rep.0"], max_experts=1)):
            async with open_volunteer(spec(entry, grids=grids), options(uids=["solo.0"])) as leaver:
                await train(leaver, "solo.0", 1)
                # the receiver must be known as a host of the swarm's experts before the leave
                await until(lambda: _holders(seed.dht, "rep.0", 1), "receiver declared")
                leaver.leave()
            assert "solo.0" in leaver.handed_off.failed and "no capacity" in leaver.handed_off.failed["solo.0"]


async def test_a_full_volunteer_drops_an_expert_others_hold_to_take_a_leavers_sole_copy():
    grids = (GRID, ALONE)
    async with open_volunteer(spec(grids=grids), options()) as seed:
        entry = seed.host.full_addrs()[0]
        # both full (one expert each), both hosting rep.0: whichever the leaver tries first takes it
        async with open_volunteer(spec(entry, grids=grids), options(uids=["rep.0"], max_experts=1)) as one, \
                open_volunteer(spec(entry, grids=grids), options(uids=["rep.0"], max_experts=1)) as other:
            async with open_volunteer(spec(entry, grids=grids), options(uids=["solo.0"])) as leaver:
                await train(leaver, "solo.0", 3)
                await until(lambda: _holders(seed.dht, "rep.0", 2), "both replicas of rep.0 declared")
                leaver.leave()
            receiver_id, version = leaver.handed_off.done["solo.0"]
            receiver, keeper = (one, other) if receiver_id == str(one.host.peer_id) else (other, one)
            assert receiver_id == str(receiver.host.peer_id) and version == 3
            assert receiver.runtime.uids == ["solo.0"] and receiver.runtime.backends["solo.0"].updates == 3
            assert keeper.runtime.uids == ["rep.0"]  # the copy the receiver gave up is still served
            await until(lambda: _has_version(seed.dht, "solo.0", receiver_id, 3), "receiver declares it")
            await until(lambda: _holders_are(seed.dht, "rep.0", {str(keeper.host.peer_id)}), "receiver withdrew rep.0")


async def test_a_full_volunteer_does_not_give_up_a_copy_whose_other_host_is_dead():
    grids = (GRID, ALONE)
    async with open_volunteer(spec(grids=grids), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry, grids=grids), options(uids=["rep.0"], max_experts=1)) as receiver:
            async with trio.open_nursery() as nursery:
                node, scope = await nursery.start(_doomed_replica, entry)
                await until(lambda: _holders(seed.dht, "rep.0", 2), "both replicas of rep.0 declared")
                node.declarer.withdraw = _no_tombstones  # killed: its record of rep.0 lingers
                scope.cancel()
            async with open_volunteer(spec(entry, grids=grids), options(uids=["solo.0"])) as leaver:
                await train(leaver, "solo.0", 2)
                leaver.leave()
            # the receiver's rep.0 is the only live copy: it keeps it and refuses the leaver's
            assert "solo.0" in leaver.handed_off.failed and "no capacity" in leaver.handed_off.failed["solo.0"]
            assert receiver.runtime.uids == ["rep.0"]


async def _holders_are(dht, uid: str, peers: set) -> bool:
    return {str(d.peer) for d in (await get_experts(dht, [uid]))[uid]} == peers


async def test_a_killed_hosts_declarations_do_not_count_as_a_replica_in_a_survey():
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry), options(uids=["rep.0"])) as survivor:
            async with trio.open_nursery() as nursery:
                node, scope = await nursery.start(_doomed_replica, entry)
                await until(lambda: _holders(seed.dht, "rep.0", 2), "both replicas declared")
                dead = str(node.host.peer_id)
                node.declarer.withdraw = _no_tombstones  # as a killed process: its records outlive it
                scope.cancel()
            assert dead in await declared_versions(seed.dht, "rep.0")
            hosts = await survivor.replicas.survey()
            assert set(hosts["rep.0"]) == {str(survivor.host.peer_id)}


async def _no_tombstones() -> int:
    return 0


async def test_a_volunteer_of_named_experts_sees_the_coverage_its_peers_brought_later():
    """The demo's last screen said 12 of 16 experts had no host right after training through all
    16: a volunteer that places nothing kept the survey of its start, before its peers were up."""
    often = ReplicasConfig(sync_timeout=600.0, recheck_period=0.2, handoff_timeout=60.0)
    with trio.fail_after(60):
        async with open_volunteer(spec(), options(uids=["rep.0"], expert_class="ffn", hidden_dim=HIDDEN,
                                                  replicas_config=often)) as first:
            assert "rep.1" in first.replicas.coverage()["grids"][0]["unhosted"]  # surveyed alone, at its start
            entry = first.host.full_addrs()[0]
            async with open_volunteer(spec(entry), options(uids=["rep.1"], expert_class="ffn", hidden_dim=HIDDEN)):
                while first.replicas.coverage()["grids"][0]["unhosted"]:
                    await trio.sleep(0.05)


async def test_a_paused_volunteer_runs_no_sync_rounds():
    """Outside its network hours a volunteer said 'paused' and still synced every round."""
    fast = GridSpec("fast", (1,), "ffn", HIDDEN, replicas=2, sync_period=0.2)
    quick = ReplicasConfig(sync_timeout=1.0, recheck_period=3600.0, handoff_timeout=60.0)
    named = dict(uids=["fast.0"], expert_class="ffn", hidden_dim=HIDDEN, replicas_config=quick)
    with trio.fail_after(60):
        async with open_volunteer(spec(grids=(fast,)), options(**named)) as first:
            entry = first.host.full_addrs()[0]
            async with open_volunteer(spec(entry, grids=(fast,)), options(**named)):
                while first.replicas.sync.rounds < 2:  # the pair syncs
                    await trio.sleep(0.05)
                await first.pause(quiet=True)
                await trio.sleep(1.2)  # a round under way ends within its timeout (1 s)
                paused_at = first.replicas.sync.rounds
                await trio.sleep(1.0)  # five periods
                assert first.replicas.sync.rounds == paused_at
                first.resume()
                while first.replicas.sync.rounds == paused_at:
                    await trio.sleep(0.05)


async def _placing_donor(entry, grid, config, go, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    await go.wait()
    async with open_volunteer(spec(entry, grids=(grid,)), options(place=True, max_experts=8, replicas_config=config)) as node:
        task_status.started(node)
        await trio.sleep_forever()


async def test_two_donors_started_together_undo_their_duplicate_picks():
    """Two donors placing from the same empty view picked about a quarter of their experts twice
    and left as many unhosted, for good: neither copy could be dropped until proven, and their
    re-checks ran in step and moved one expert each to the same place. The re-check period here
    is far beyond the test's bound: only the early re-checks, after the rounds that prove the
    copies, can spread them in time."""
    wide = GridSpec("dup", (16,), "ffn", HIDDEN, replicas=1, sync_period=0.5)
    quick = ReplicasConfig(sync_timeout=5.0, recheck_period=600.0, early_recheck_spread=1.0, handoff_timeout=60.0)
    everything = set(wide.uids())
    with trio.fail_after(60):
        async with open_volunteer(spec(grids=(wide,)), options()) as seed:
            entry = seed.host.full_addrs()[0]
            async with trio.open_nursery() as nursery:
                go, donors = trio.Event(), []

                async def start() -> None:
                    donors.append(await nursery.start(_placing_donor, entry, wide, quick, go))

                async with trio.open_nursery() as starting:
                    starting.start_soon(start)
                    starting.start_soon(start)
                    go.set()  # both survey an empty grid: their picks overlap
                a, b = donors

                def spread() -> bool:
                    mine, theirs = set(a.runtime.uids), set(b.runtime.uids)
                    return mine | theirs == everything and not mine & theirs

                while not spread():
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
