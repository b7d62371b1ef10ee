"""The runtime judges trainers' gradients: a trainer whose gradients keep going past an expert's
bound is refused and what it did undone, exactly; in a batch of several trainers only the
culprit is struck; a replica that took clipped gradients is no reference for the others (it sits
out sync and serves no catch-up), so sync never carries a hostile trainer's damage to the other
replica."""

from __future__ import annotations

import copy

import pytest
import torch
import trio
import trio.testing

from volunteer.errors import ExpertBackwardRefusedError, TrainerRefusedError
from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.runtime import open_runtime
from volunteer.experts.comparison import compare
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport
from volunteer.replicas.aggregate import mean
from volunteer.replicas.config import ReplicasConfig
from volunteer.replicas.errors import StateRefusedError, SyncError
from volunteer.replicas.messages import FetchRequest
from volunteer.replicas.state import module_layout
from volunteer.replicas.store import BackendStore
from volunteer.replicas.syncdriver import ReplicaSync

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
UID = "expert.0.0"
HIDDEN = 8


def expert(config: ExpertsConfig, seed: int = 0):
    torch.manual_seed(seed)
    return make_backend(UID, "ffn", HIDDEN, config=config)


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(4, HIDDEN, generator=generator), torch.randn(4, HIDDEN, generator=generator) * 0.01


async def honest_steps(runtime, steps: int, trainer: str = "honest", offset: int = 0) -> None:
    for step in range(steps):
        x, g = batch(offset + step)
        await runtime.backward(UID, [x], [g], trainer=trainer)
    await runtime.settled()


def state_of(backend) -> dict:
    return copy.deepcopy(backend.module.state_dict())


def same_state(backend, state: dict) -> bool:
    return all(torch.equal(value, state[key]) for key, value in backend.module.state_dict().items())


async def test_a_new_identitys_gradients_past_the_bound_are_never_applied():
    """Fresh identities cost nothing: a clip is for trainers this volunteer knows."""
    config = ExpertsConfig(device="cpu")
    backend = expert(config)
    with trio.fail_after(60):
        async with open_runtime([backend], config) as runtime:
            await honest_steps(runtime, 20)
            before = state_of(backend)
            x, g = batch(99)
            for _ in range(2):
                with pytest.raises(TrainerRefusedError, match="not applied"):
                    await runtime.backward(UID, [x], [g * 50], trainer="sybil")
            with pytest.raises(TrainerRefusedError):
                await runtime.backward(UID, [x], [g * 50], trainer="sybil")
            await runtime.settled()
            assert same_state(backend, before) and not runtime.suspect(UID)
            assert runtime.trainer_report()["trainers"]["sybil"]["causes"] == 1


async def test_three_clipped_gradients_refuse_the_trainer_and_undo_it_exactly():
    config = ExpertsConfig(device="cpu")
    backend = expert(config)
    with trio.fail_after(60):
        async with open_runtime([backend], config) as runtime:
            await honest_steps(runtime, 12)
            await honest_steps(runtime, 16, trainer="pusher", offset=100)  # a trainer it knows, turning
            before = state_of(backend)
            x, g = batch(99)
            for strike in range(2):  # x50: clipped to the bound (not gross), a strike each
                await runtime.backward(UID, [x], [g * 50], trainer="pusher")
                await runtime.settled()
                assert runtime.suspect(UID)
            assert not same_state(backend, before)
            with pytest.raises(TrainerRefusedError, match="undone"):
                await runtime.backward(UID, [x], [g * 50], trainer="pusher")
            await runtime.settled()
            assert same_state(backend, before) and not runtime.suspect(UID)
            with pytest.raises(TrainerRefusedError, match="refused for"):
                await runtime.backward(UID, [x], [g], trainer="pusher")  # refused for a while, even honest-looking
            await honest_steps(runtime, 3, offset=40)  # others are served
            report = runtime.trainer_report()
            assert report["trainers"]["pusher"]["clipped"] == 3 and report["trainers"]["pusher"]["causes"] == 1
            assert report["trainers"]["honest"]["refused"] == 0 and report["rollbacks"] == 1


async def test_in_a_batch_of_two_trainers_only_the_culprit_is_struck():
    # the worker batches what arrives while it is held: one honest request and one x50
    config = ExpertsConfig(device="cpu", inline_compute_limit=0.0)
    backend = expert(config)
    gate = trio.Event()
    with trio.fail_after(60):
        async with open_runtime([backend], config) as runtime:
            await honest_steps(runtime, 12)
            await honest_steps(runtime, 16, trainer="pusher", offset=100)
            token = trio.lowlevel.current_trio_token()
            results = {}

            async def call(trainer: str, scale: float) -> None:
                x, g = batch(7)
                results[trainer] = await runtime.backward(UID, [x], [g * scale], trainer=trainer)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(runtime.run_sync, lambda: trio.from_thread.run(gate.wait, trio_token=token))
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(call, "honest", 1.0)
                nursery.start_soon(call, "pusher", 50.0)
                await trio.testing.wait_all_tasks_blocked()
                gate.set()
            report = runtime.trainer_report()["trainers"]
            assert report["pusher"]["clipped"] == 1 and report["honest"]["clipped"] == 0
            assert set(results) == {"honest", "pusher"}


async def test_a_gross_gradient_changes_nothing_and_a_suspect_replica_serves_no_state():
    config = ExpertsConfig(device="cpu")
    backend = expert(config)
    with trio.fail_after(60):
        async with open_runtime([backend], config) as runtime:
            await honest_steps(runtime, 12)
            before, updates = state_of(backend), backend.updates
            x, g = batch(5)
            with pytest.raises(ExpertBackwardRefusedError):
                await runtime.backward(UID, [x], [g * 1e6], trainer="attacker")
            await runtime.settled()
            assert same_state(backend, before) and backend.updates == updates
            store = BackendStore(runtime.backends, runtime=runtime)
            await honest_steps(runtime, 16, trainer="pusher", offset=100)
            await runtime.backward(UID, [x], [g * 50], trainer="pusher")  # one clipped: a strike
            await runtime.settled()
            assert store.suspect(UID)
            request = FetchRequest(UID, "ffn", HIDDEN, module_layout(backend))
            with pytest.raises(StateRefusedError, match="ask another replica"):
                await store.export(request)


@pytest.mark.parametrize("attack", ["gross", "steady"])
async def test_sync_does_not_carry_a_hostile_trainers_damage_to_the_other_replica(attack):
    """Two replicas of one expert, trained alike; a hostile trainer attacks the first (a hundred
    x1e6 gradients, or x50 ones that clip), then the pair syncs. The second stays where honest
    training left it."""
    config = ExpertsConfig(device="cpu")
    first, second = expert(config, seed=3), expert(config, seed=3)
    network = MemoryNetwork()
    probe = torch.randn(32, HIDDEN, generator=torch.Generator().manual_seed(1))
    replicas = ReplicasConfig(sync_timeout=2.0)
    with trio.fail_after(120):
        async with open_runtime([first], config) as runtime_a, open_runtime([second], config) as runtime_b:
            for runtime in (runtime_a, runtime_b):
                await honest_steps(runtime, 12)
            await honest_steps(runtime_a, 16, trainer="attacker", offset=100)  # known to the first, then it turns
            await honest_steps(runtime_b, 16, offset=100)  # the second trained alike
            reference = second.forward([probe])
            sync_a = ReplicaSync("sy", BackendStore(runtime_a.backends, runtime=runtime_a), replicas, aggregate=mean)
            sync_b = ReplicaSync("sy", BackendStore(runtime_b.backends, runtime=runtime_b), replicas, aggregate=mean)
            async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET,
                                  services=[sync_a]) as host_a, \
                    open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET,
                               services=[sync_b]) as host_b:
                x, g = batch(50)
                if attack == "gross":
                    for _ in range(100):
                        with pytest.raises(ExpertBackwardRefusedError):
                            await runtime_a.backward(UID, [x], [g * 1e6], trainer="attacker")
                else:  # two clipped ones: the replica is suspect until the third refuses and undoes them
                    for _ in range(2):
                        await runtime_a.backward(UID, [x], [g * 50], trainer="attacker")
                await runtime_a.settled()

                async def round_of(sync, peer, outcomes):
                    try:
                        outcomes.append(await sync.average(UID, [peer]))
                    except SyncError as exc:
                        outcomes.append(exc)

                outcomes_a, outcomes_b = [], []
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(round_of, sync_a, host_b.full_addrs()[0], outcomes_a)
                    nursery.start_soon(round_of, sync_b, host_a.full_addrs()[0], outcomes_b)
                if attack == "steady":
                    assert isinstance(outcomes_a[0], SyncError)  # it sat out
                gap = compare(reference, second.forward([probe])).direction
                assert gap <= 0.05, gap  # the pair's own drift at most: the attack did not travel


async def test_one_trainers_calls_batched_under_load_are_not_one_huge_gradient():
    """Sixteen identical backwards of one trainer arrive while the worker is busy and run as one
    batch: their gradients add up to sixteen times one, which is no reason to strike anyone
    (the throughput benchmark's sixteen trainer threads share one identity)."""
    config = ExpertsConfig(device="cpu", inline_compute_limit=0.0)
    backend = expert(config)
    gate = trio.Event()
    with trio.fail_after(60):
        async with open_runtime([backend], config) as runtime:
            x, g = batch(3)
            for _ in range(12):
                await runtime.backward(UID, [x], [g], trainer="busy")
            token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(runtime.run_sync, lambda: trio.from_thread.run(gate.wait, trio_token=token))
                await trio.testing.wait_all_tasks_blocked()
                for _ in range(16):
                    nursery.start_soon(runtime.backward, UID, [x], [g])
                    await trio.testing.wait_all_tasks_blocked()
                gate.set()
            # the batch above had no trainer; now with one: the same, named
            async with trio.open_nursery() as nursery:
                gate = trio.Event()
                nursery.start_soon(runtime.run_sync, lambda: trio.from_thread.run(gate.wait, trio_token=token))
                await trio.testing.wait_all_tasks_blocked()
                for _ in range(16):
                    nursery.start_soon(lambda: runtime.backward(UID, [x], [g], trainer="busy"))
                    await trio.testing.wait_all_tasks_blocked()
                gate.set()
            report = runtime.trainer_report()["trainers"]["busy"]
            assert report["clipped"] == 0 and report["causes"] == 0 and report["applied"] == 28
            stats = runtime.stats()[UID]
            assert stats.backward == 44 and stats.batches < 40  # they did run batched
