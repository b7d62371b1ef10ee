"""Replica sync between Hosts on the memory transport with real ffn backends: after a round with
no training in between, replicas give the same outputs; a pair keeps its own versions (one peer's
claim never raises ours); a
replica killed mid-round does not stall the others; a silent one is left out at the deadline; the
runtime aggregates a round, after the step its expert owes, on its worker or inline when cheap;
only a replica whose state we loaded is weighed (a follower merges its source, never the reverse),
and a crowd of fresh identities cannot push it out of a full group."""

from __future__ import annotations

import copy
import threading
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import torch
import trio

from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.runtime import open_runtime
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport
from volunteer.replicas.aggregate import mean
from volunteer.replicas.config import ReplicasConfig
from volunteer.replicas.errors import SyncError
from volunteer.replicas.store import BackendStore
from volunteer.replicas.syncdriver import ReplicaSync

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
EXPERTS = ExpertsConfig(device="cpu")
SWARM = "sy"
UID = "expert.0.0"


def replica(seed: int, steps: int):
    torch.manual_seed(seed)
    backend = make_backend(UID, "ffn", 8, config=EXPERTS)
    for _ in range(steps):
        backend.backward([torch.randn(4, 8)], [torch.randn(4, 8)])
    return backend


@asynccontextmanager
async def volunteer(network, backend, config=ReplicasConfig(), runtime=None, aggregate=mean):
    sync = ReplicaSync(SWARM, BackendStore({UID: backend}, runtime=runtime), config, aggregate=aggregate)
    async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET, services=[sync]) as host:
        yield host, sync


def lineage(*members) -> None:
    """Each of ``members`` (host, sync) gives the others standing, as replicas that caught up
    from one another would: only a peer whose state we loaded is weighed in our rounds."""
    for _, sync in members:
        for host, other in members:
            if other is not sync:
                sync.guard.vouch(UID, str(host.peer_id))


def outputs(backend, x):
    return backend.forward([x])[0]


async def one_round_each(a, b) -> dict:
    """Both (host, sync) sides average ``UID`` with the other at once; their results as "a", "b"."""
    results = {}

    async def run(name, sync, peer):
        results[name] = await sync.average(UID, [peer])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "a", a[1], b[0].full_addrs()[0])
        nursery.start_soon(run, "b", b[1], a[0].full_addrs()[0])
    return results


async def test_two_replicas_give_the_same_outputs_after_a_sync():
    network = MemoryNetwork()
    a, b = replica(1, steps=2), replica(2, steps=6)
    x = torch.randn(5, 8)
    assert not torch.allclose(outputs(a, x), outputs(b, x), atol=1e-3)
    async with open_runtime([a], EXPERTS) as runtime:  # one side through the runtime's worker
        async with volunteer(network, a, runtime=runtime) as (host_a, sync_a), volunteer(network, b) as (host_b, sync_b):
            lineage((host_a, sync_a), (host_b, sync_b))
            results = await one_round_each((host_a, sync_a), (host_b, sync_b))
    assert torch.allclose(outputs(a, x), outputs(b, x), atol=1e-5)
    assert (a.updates, b.updates) == (2, 6)  # in a pair each keeps its own: a claim is not evidence
    assert results["a"].contributors == (str(host_b.peer_id),) and results["b"].missing == ()
    assert UID in sync_a.last_sync and sync_b.rounds == 1


async def test_a_follower_merges_its_lineage_and_the_lineage_does_not_weigh_it():
    """Standing is not symmetric: b loaded a's state, so b merges a; a never loaded b's (anyone may
    fetch ours), so a round leaves a's parameters as they were and only counts b as aligned."""
    network = MemoryNetwork()
    a, b = replica(1, steps=2), replica(2, steps=6)
    before_a = {name: p.detach().clone() for name, p in a.module.named_parameters()}
    before_b = {name: p.detach().clone() for name, p in b.module.named_parameters()}
    config = ReplicasConfig(sync_bootstrap_share=1e6)  # a first round: within any bound
    async with volunteer(network, a, config) as (host_a, sync_a), volunteer(network, b, config) as (host_b, sync_b):
        sync_b.guard.vouch(UID, str(host_a.peer_id))  # b caught up from a
        results = await one_round_each((host_a, sync_a), (host_b, sync_b))
    for name, p in a.module.named_parameters():
        assert torch.equal(p, before_a[name])
    for name, p in b.module.named_parameters():
        assert torch.allclose(p, (before_a[name] + before_b[name]) / 2, atol=1e-6)
    assert results["a"].contributors == (str(host_b.peer_id),) and results["a"].refused == ()
    assert UID in sync_a.last_sync and UID in sync_b.last_sync  # within the drift: aligned
    assert (UID, str(host_b.peer_id)) not in sync_a.standings  # never weighed: not proven
    assert sync_b.standings[(UID, str(host_a.peer_id))].value == "proven"


async def test_the_runtime_aggregates_a_round_after_the_step_its_expert_owes():
    network = MemoryNetwork()
    a, b = replica(1, 2), replica(2, 6)
    reference = copy.deepcopy(a)  # a's training, with its steps taken at once
    theirs = {name: p.detach().clone() for name, p in b.module.named_parameters()}
    config = ExpertsConfig(device="cpu", inline_compute_limit=10.0)  # whatever has a cost runs inline
    x, g = torch.randn(4, 8), torch.randn(4, 8)
    aggregated: list[tuple[str, bool]] = []  # (thread, a's step still owed) per aggregate

    def recording(own, contributions):  # the guard's verdict runs where the aggregate does
        aggregated.append((threading.current_thread().name, a.step_owed))
        return mean(own, contributions)

    async with open_runtime([a], config) as runtime:
        for first in (True, False):  # the first pair teaches the costs on the worker; the second runs inline
            await runtime.forward(UID, [x], keep_graph=True)
            await runtime.backward(UID, [x], [g], settle_later=True)  # and nobody applies its step
            reference.forward([x])
            reference.backward([x], [g])
            if first:
                # the worker applies the first step at once; wait for it, so that the second pair
                # finds the runtime idle however loaded the machine is (else it queues behind it)
                await runtime.settled()
        assert a.step_owed
        threaded = ReplicasConfig(offload_bytes=1)  # hash, encode and decode in a thread, as for a big expert
        async with (
            volunteer(network, a, threaded, runtime=runtime, aggregate=recording) as (host_a, sync_a),
            volunteer(network, b, threaded) as (host_b, sync_b),
        ):
            lineage((host_a, sync_a), (host_b, sync_b))
            for _ in range(2):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sync_a.average, UID, [host_b.full_addrs()[0]])
                    nursery.start_soon(sync_b.average, UID, [host_a.full_addrs()[0]])
    # the first round's aggregate ran on the worker (its cost unknown), the second inline like a
    # cheap forward; both after the owed step, which was in the parameters a contributed
    assert aggregated == [("volunteer-experts-runtime", False), (threading.current_thread().name, False)]
    for name, p in a.module.named_parameters():
        assert torch.allclose(p, (dict(reference.module.named_parameters())[name] + theirs[name]) / 2, atol=1e-6)
    assert (a.updates, b.updates) == (4, 6)  # 2 + 2 steps trained here


async def test_a_replica_killed_mid_round_does_not_stall_the_others():
    network = MemoryNetwork()
    a, b, c = replica(1, 2), replica(2, 3), replica(3, 4)
    # a long deadline: only noticing the dead replica can end the round before the test's bound
    config = ReplicasConfig(sync_timeout=10_000)
    killed = trio.Event()
    async with AsyncExitStack() as stack:
        host_a, sync_a = await stack.enter_async_context(volunteer(network, a, config))
        host_b, sync_b = await stack.enter_async_context(volunteer(network, b, config))
        lineage((host_a, sync_a), (host_b, sync_b))
        async with trio.open_nursery() as outer:
            host_c = await outer.start(_doomed, network, c, config, killed)
            addrs = {name: h.full_addrs()[0] for name, h in (("a", host_a), ("b", host_b), ("c", host_c))}
            results = {}

            async def run(name, sync, peers):
                results[name] = await sync.average(UID, peers)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "a", sync_a, [addrs["b"], addrs["c"]])
                nursery.start_soon(run, "b", sync_b, [addrs["a"], addrs["c"]])
                # c accepts their contributions (it has no round open: they wait in its stash) and
                # dies before sending its own
                while sum(len(s) for s in _stash_of(host_c)) < 2:
                    await trio.sleep(0.01)
                killed.set()
    assert results["a"].missing == results["b"].missing == (str(host_c.peer_id),)
    x = torch.randn(3, 8)
    assert torch.allclose(outputs(a, x), outputs(b, x), atol=1e-5)  # a and b averaged each other
    assert (a.updates, b.updates) == (2, 3)


_doomed_syncs: dict = {}


def _stash_of(host):
    return _doomed_syncs[host.peer_id]._stash.values()


async def _doomed(network, backend, config, killed, task_status=trio.TASK_STATUS_IGNORED):
    async with volunteer(network, backend, config) as (host, sync):
        _doomed_syncs[host.peer_id] = sync
        task_status.started(host)
        await killed.wait()  # leaving the block closes the host and its connections


async def test_a_silent_replica_is_left_out_at_the_deadline(autojump_clock):
    network = MemoryNetwork()
    a, b = replica(1, 2), replica(2, 3)
    own = outputs(a, torch.ones(1, 8))
    async with volunteer(network, a, ReplicasConfig(sync_timeout=10)) as (host_a, sync_a), volunteer(network, b) as (host_b, _):
        # b is connected and takes a's parameters but never opens a round of its own
        start = trio.current_time()
        outcome = await sync_a.average(UID, [host_b.full_addrs()[0]])
        assert trio.current_time() - start >= 10  # virtual time: it waited for the deadline
    assert outcome.contributors == () and outcome.missing == (str(host_b.peer_id),)
    assert torch.equal(outputs(a, torch.ones(1, 8)), own) and a.updates == 2  # its own values
    # nothing merged: its state is as far from b's as before, so it declares no fresh sync age
    # (an audit would compare it with b at a tolerance its drift may exceed)
    assert UID not in sync_a.last_sync and sync_a.rounds == 1


async def test_a_round_whose_contributions_were_all_refused_leaves_the_sync_age_alone():
    network = MemoryNetwork()
    a, b = replica(1, 2), replica(2, 3)
    with torch.no_grad():
        for p in b.module.parameters():
            p.fill_(float("nan"))  # b's contribution is refused as non-finite
    async with volunteer(network, a) as (host_a, sync_a), volunteer(network, b) as (host_b, sync_b):
        sync_a.aligned(UID)
        synced = sync_a.last_sync[UID]
        await trio.sleep(0.01)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sync_b.average, UID, [host_a.full_addrs()[0]])
            outcome = await sync_a.average(UID, [host_b.full_addrs()[0]])
    assert outcome.refused and outcome.refused[0][0] == str(host_b.peer_id)
    assert sync_a.last_sync[UID] == synced  # the age still counts from the last real alignment
    assert UID in sync_a.guard._experts  # the guard remembers the round (its drift, b's deviation)
    sync_a.forget(UID)
    assert UID not in sync_a.last_sync and UID not in sync_a.guard._experts


async def test_a_peer_that_does_not_host_the_expert_is_not_waited_for():
    network = MemoryNetwork()
    a = replica(1, 2)
    other = make_backend("expert.5.5", "ffn", 8, config=EXPERTS)
    config = ReplicasConfig(sync_timeout=10_000)
    async with volunteer(network, a, config) as (host_a, sync_a):
        sync_b = ReplicaSync(SWARM, BackendStore({"expert.5.5": other}), config)
        async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET, services=[sync_b]) as host_b:
            outcome = await sync_a.average(UID, [host_b.full_addrs()[0]])
            assert sync_b.refused == 1
    assert outcome.missing == (str(host_b.peer_id),)


async def test_one_round_per_expert_at_a_time():
    network = MemoryNetwork()
    a = replica(1, 2)
    async with volunteer(network, a, ReplicasConfig(sync_timeout=10_000)) as (host_a, sync_a), volunteer(network, replica(2, 1)) as (host_b, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sync_a.average, UID, [host_b.full_addrs()[0]])
            while UID not in sync_a._rounds:
                await trio.sleep(0.01)
            with pytest.raises(SyncError, match="already running"):
                await sync_a.average(UID, [host_b.full_addrs()[0]])
            nursery.cancel_scope.cancel()


async def test_an_expert_dropped_during_its_round_ends_the_round_with_a_sync_error(autojump_clock):
    # a re-check moved the expert away while its round waited for a silent peer: the merge finds
    # no backend, and the caller must see a SyncError (it crashed the node as an exception group)
    network = MemoryNetwork()
    a = replica(1, 2)
    async with volunteer(network, a, ReplicasConfig(sync_timeout=10)) as (host_a, sync_a), \
            volunteer(network, replica(2, 1)) as (host_b, _):
        async with trio.open_nursery() as nursery:
            async def drop_meanwhile():
                while UID not in sync_a._rounds:
                    await trio.sleep(0.01)
                sync_a.store.remove(UID)
            nursery.start_soon(drop_meanwhile)
            with pytest.raises(SyncError, match="dropped during its sync round"):
                await sync_a.average(UID, [host_b.full_addrs()[0]])
    assert sync_a.rounds == 0


async def test_a_crowd_of_fresh_identities_does_not_push_our_lineage_out_of_the_group():
    """A group holds max_group members: a fresh identity listed first (the DHT's order is anyone's
    to shape) must not take the place of the replica we loaded our state from."""
    network = MemoryNetwork()
    config = ReplicasConfig(max_group=2, sync_timeout=10_000)  # room for one partner
    a, source, stranger = replica(1, 2), replica(2, 3), replica(3, 4)
    async with AsyncExitStack() as stack:
        host_a, sync_a = await stack.enter_async_context(volunteer(network, a, config))
        host_s, sync_s = await stack.enter_async_context(volunteer(network, source, config))
        host_x, _ = await stack.enter_async_context(volunteer(network, stranger, config))
        sync_a.guard.vouch(UID, str(host_s.peer_id))  # a caught up from the source
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sync_s.average, UID, [host_a.full_addrs()[0]])
            outcome = await sync_a.average(UID, [host_x.full_addrs()[0], host_s.full_addrs()[0]])
    assert outcome.contributors == (str(host_s.peer_id),) and outcome.missing == ()


class _DroppedWhileQueued:
    """A runtime whose expert a re-check drops while the round's merge waits in its queue."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.backends = runtime.backends

    async def run_sync(self, fn, *args):
        return await self.runtime.run_sync(fn, *args)

    async def run_on(self, uid, fn, *args, kind):
        self.runtime.remove_backend(uid)
        return await self.runtime.run_on(uid, fn, *args, kind=kind)

    def add_backend(self, backend) -> None:
        self.runtime.add_backend(backend)

    def remove_backend(self, uid):
        return self.runtime.remove_backend(uid)

    def suspect(self, uid) -> bool:
        return self.runtime.suspect(uid)


async def test_an_expert_dropped_while_its_merge_waits_on_the_runtime_ends_the_round_with_a_sync_error():
    # the runtime, not the store, found the expert gone: its error escaped the round's nursery as
    # an exception group and took the node's replicas down (two donors undoing duplicate picks)
    network = MemoryNetwork()
    a, b = replica(1, 2), replica(2, 1)
    async with open_runtime([a], EXPERTS) as runtime:
        store = BackendStore(runtime.backends, runtime=_DroppedWhileQueued(runtime))
        sync_a = ReplicaSync(SWARM, store, ReplicasConfig(sync_timeout=10), aggregate=mean)
        async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET,
                              services=[sync_a]), volunteer(network, b) as (host_b, sync_b):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sync_b.average, UID, [sync_a.host.full_addrs()[0]])
                with pytest.raises(SyncError, match="dropped during its sync round"):
                    await sync_a.average(UID, [host_b.full_addrs()[0]])
    assert sync_a.rounds == 0
