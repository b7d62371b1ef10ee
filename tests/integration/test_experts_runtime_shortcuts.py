"""The runtime's latency shortcuts keep results what they were with one trainer: the deferred
optimizer step (reply first, step before anything else), kept forward graphs (used only when
nothing changed), and cheap requests computed inline on the event loop."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import trio
import trio.testing

from volunteer.experts import ExpertsConfig, TensorSpec
from volunteer.experts.backend import ExpertBackend, make_backend
from volunteer.experts.runtime import open_runtime


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class GatedSGD(torch.optim.SGD):
    """SGD whose step waits until the test opens the gate, and notes which thread took it."""

    def __init__(self, params) -> None:
        super().__init__(params, lr=0.1)
        self.entered, self.gate = threading.Event(), threading.Event()
        self.threads: list[str] = []

    def step(self, closure=None):
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.gate.wait(10)
        return super().step(closure)


async def test_backward_replies_before_its_step_and_the_next_forward_sees_the_step():
    config = ExpertsConfig(device="cpu", inline_compute_limit=0)
    optimizers: list[GatedSGD] = []

    def gated(params):
        optimizers.append(GatedSGD(params))
        return optimizers[-1]

    backend = make_backend("ffn.0", "ffn", 8, config=config, optimizer=gated)
    reference = make_backend("ffn.0", "ffn", 8, config=config, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    reference.load_state_dict(copy.deepcopy(backend.state_dict()))
    x, g = torch.randn(3, 8), torch.randn(3, 8)
    reference.forward([x])
    (want_dx,) = reference.backward([x], [g])
    (want_y,) = reference.forward([x])
    async with open_runtime([backend], config) as runtime:
        await runtime.forward("ffn.0", [x], keep_graph=True)
        (dx,) = await runtime.backward("ffn.0", [x], [g])  # answered while the step waits at the gate
        assert torch.equal(dx, want_dx)
        assert backend.updates == 1  # counted at once
        while not optimizers[0].entered.is_set():
            await trio.sleep(0.001)
        result: list = []
        settled = trio.Event()

        async def forward_now() -> None:
            result.extend(await runtime.forward("ffn.0", [x], keep_graph=True))

        async def settle() -> None:
            await runtime.settled()
            settled.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(forward_now)
            nursery.start_soon(settle)
            await trio.testing.wait_all_tasks_blocked()
            assert not result  # queued behind the step: it cannot run on the old parameters
            assert not settled.is_set()
            optimizers[0].gate.set()
        assert torch.equal(result[0], want_y)  # the forward after the backward saw the new parameters
        for mine, theirs in zip(backend.module.parameters(), reference.module.parameters()):
            assert torch.equal(mine, theirs)  # read after settled(): the step is in
        assert runtime.stats()["ffn.0"].updates == 1


async def test_a_backward_uses_the_kept_forward_only_when_nothing_changed_in_between():
    config = ExpertsConfig(device="cpu")
    backend = make_backend("ffn.0", "ffn", 8, config=config)
    reference = copy.deepcopy(backend)  # recomputes every backward: the results to match
    x, y, g = torch.randn(3, 8), torch.randn(2, 8), torch.randn(3, 8)
    async with open_runtime([backend], config) as runtime:
        cache = runtime.activations
        # forward then backward of the same inputs: the kept graph is used
        await runtime.forward("ffn.0", [x], keep_graph=True)
        (dx,) = await runtime.backward("ffn.0", [x], [g])
        assert cache.hits == 1 and torch.equal(dx, reference.backward([x], [g])[0])
        # forward x, then another trainer's forward+backward steps the expert, then x's backward:
        # the kept graph of x is stale, so it is recomputed with the new parameters
        await runtime.forward("ffn.0", [x], keep_graph=True)
        await runtime.forward("ffn.0", [y], keep_graph=True)
        await runtime.backward("ffn.0", [y], [g[:2]])
        reference.backward([y], [g[:2]])
        await runtime.run_sync(int)  # the worker applies a step before its next job: it is past it now
        assert cache.hits == 2 and len(cache) == 0  # the step dropped x's graph
        (dx,) = await runtime.backward("ffn.0", [x], [g])
        assert cache.hits == 2 and cache.misses == 1
        assert torch.equal(dx, reference.backward([x], [g])[0])
        # a backward of other inputs than the forward's recomputes too
        await runtime.forward("ffn.0", [x], keep_graph=True)
        (dx,) = await runtime.backward("ffn.0", [x + 1], [g])
        assert cache.misses == 2 and torch.equal(dx, reference.backward([x + 1], [g])[0])
        assert backend.updates == reference.updates == 4
    for mine, theirs in zip(backend.module.parameters(), reference.module.parameters()):
        assert torch.equal(mine, theirs)


async def test_the_runtime_keeps_no_more_graphs_than_its_bound():
    config = ExpertsConfig(device="cpu", activation_cache_entries=3)
    async with open_runtime([make_backend("ffn.0", "ffn", 8, config=config)], config) as runtime:
        for i in range(10):
            await runtime.forward("ffn.0", [torch.full((2, 8), float(i))], keep_graph=True)
            assert len(runtime.activations) <= 3
        assert len(runtime.activations) == 3


async def test_a_forward_without_an_announced_backward_keeps_no_graph():
    config = ExpertsConfig(device="cpu")
    backend = make_backend("ffn.0", "ffn", 8, config=config)
    reference = copy.deepcopy(backend)
    x, g = torch.randn(3, 8), torch.randn(3, 8)
    async with open_runtime([backend], config) as runtime:
        (y,) = await runtime.forward("ffn.0", [x])  # inference: no backward will come
        assert len(runtime.activations) == 0 and torch.equal(y, reference.forward([x])[0])
        (dx,) = await runtime.backward("ffn.0", [x], [g])  # one comes anyway: recomputed
        assert runtime.activations.misses == 1
    assert torch.equal(dx, reference.backward([x], [g])[0])


async def test_graphs_are_off_with_a_zero_bound():
    config = ExpertsConfig(device="cpu", activation_cache_entries=0)
    backend = make_backend("ffn.0", "ffn", 8, config=config)
    reference = copy.deepcopy(backend)
    x, g = torch.randn(3, 8), torch.randn(3, 8)
    async with open_runtime([backend], config) as runtime:
        await runtime.forward("ffn.0", [x], keep_graph=True)
        (dx,) = await runtime.backward("ffn.0", [x], [g])
        assert len(runtime.activations) == 0 and runtime.activations.hits == 0
    assert torch.equal(dx, reference.backward([x], [g])[0])


class ThreadRecorder(torch.nn.Module):
    """A linear map that notes which thread computed each call."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.threads: list[str] = []

    def forward(self, x):
        self.threads.append(threading.current_thread().name)
        return self.linear(x)


@pytest.mark.parametrize("limit", [10.0, 0.0])
async def test_cheap_lone_requests_run_inline_and_give_the_same_results(limit):
    config = ExpertsConfig(device="cpu", inline_compute_limit=limit)
    module = ThreadRecorder()
    backend = ExpertBackend("rec.0", module, inputs=[TensorSpec((4,))], config=config)
    reference = copy.deepcopy(backend)
    module.threads.clear()
    x, g = torch.randn(2, 4), torch.randn(2, 4)
    here = threading.current_thread().name
    async with open_runtime([backend], config) as runtime:
        for _ in range(3):
            (y,) = await runtime.forward("rec.0", [x])
            assert torch.equal(y, reference.forward([x])[0])
        # the first forward goes to the worker (its cost is unknown until then); the worker is
        # idle again before it wakes us, so later ones are inline unless the limit is 0
        assert module.threads[0] != here
        assert module.threads[1:] == ([here, here] if limit else [module.threads[0]] * 2)
        for _ in range(3):
            # after a backward the worker may still be applying the step: then the next request
            # waits for it on the worker; either way the results are those of one trainer
            (y,) = await runtime.forward("rec.0", [x], keep_graph=True)
            (dx,) = await runtime.backward("rec.0", [x], [g])
            assert torch.equal(y, reference.forward([x])[0])
            assert torch.equal(dx, reference.backward([x], [g])[0])
        stats = runtime.stats()["rec.0"]
        assert (stats.forward, stats.backward, stats.batches, stats.updates) == (6, 3, 9, 3)
    for mine, theirs in zip(backend.module.parameters(), reference.module.parameters()):
        assert torch.equal(mine, theirs)


async def test_a_server_applies_a_cheap_owed_step_itself_once_its_reply_is_out():
    # what ExpertServer does: backward(settle_later=True), write the reply, apply_owed_steps()
    config = ExpertsConfig(device="cpu", inline_compute_limit=10.0)
    optimizers: list[GatedSGD] = []

    def recording(params):
        optimizers.append(GatedSGD(params))
        optimizers[-1].gate.set()  # open: only the threads are of interest here
        return optimizers[-1]

    module = ThreadRecorder()
    backend = ExpertBackend("rec.0", module, inputs=[TensorSpec((4,))], config=config, optimizer=recording)
    reference = copy.deepcopy(backend)
    reference.optimizer = torch.optim.SGD(reference.module.parameters(), lr=0.1)  # same steps, no notes
    module.threads.clear()
    x, g = torch.randn(2, 4), torch.randn(2, 4)
    here = threading.current_thread().name
    async with open_runtime([backend], config) as runtime:
        # a first round on the worker: the costs of forward, backward and step are unknown until then
        await runtime.forward("rec.0", [x], keep_graph=True)
        await runtime.backward("rec.0", [x], [g], settle_later=True)
        await runtime.settled()
        reference.forward([x])
        reference.backward([x], [g])
        for _ in range(3):
            (y,) = await runtime.forward("rec.0", [x], keep_graph=True)
            (dx,) = await runtime.backward("rec.0", [x], [g], settle_later=True)
            assert backend.step_owed  # nothing takes it before the caller says its reply is out
            runtime.apply_owed_steps()
            assert not backend.step_owed  # cheap: taken right here
            assert torch.equal(y, reference.forward([x])[0])
            assert torch.equal(dx, reference.backward([x], [g])[0])
        # every step after the first ran on the event loop, so every forward after it ran inline
        steps = optimizers[0].threads
        assert steps[0] != here and steps[1:] == [here] * 3
        assert module.threads[-3:] == [here] * 3
        assert runtime.stats()["rec.0"].updates == 4
    for mine, theirs in zip(backend.module.parameters(), reference.module.parameters()):
        assert torch.equal(mine, theirs)


async def test_a_step_owed_to_a_caller_that_never_applies_it_runs_before_the_next_request():
    config = ExpertsConfig(device="cpu", inline_compute_limit=10.0)
    backend = ExpertBackend("rec.0", ThreadRecorder(), inputs=[TensorSpec((4,))], config=config)
    reference = copy.deepcopy(backend)
    x, g = torch.randn(2, 4), torch.randn(2, 4)
    async with open_runtime([backend], config) as runtime:
        for _ in range(3):
            (y,) = await runtime.forward("rec.0", [x], keep_graph=True)
            await runtime.backward("rec.0", [x], [g], settle_later=True)  # apply_owed_steps never called
            assert torch.equal(y, reference.forward([x])[0])
            reference.backward([x], [g])
        await runtime.settled()
        assert not backend.step_owed
    for mine, theirs in zip(backend.module.parameters(), reference.module.parameters()):
        assert torch.equal(mine, theirs)



@pytest.fixture
def slow_snapshot_copies(monkeypatch):
    """Snapshot copies that take 20 ms: a write the runtime did not hold back until the copy
    ended would land mid-copy (a torn snapshot, dropped and counted: an audit would find nothing)."""
    import time

    import volunteer.experts.snapshots as snapshots

    copy_state = snapshots._copied

    def slow_copy(state, spare):
        time.sleep(0.02)
        return copy_state(state, spare)

    monkeypatch.setattr(snapshots, "_copied", slow_copy)


async def test_every_state_a_receipt_names_is_the_one_that_computed_it_while_snapshots_copy_in_the_background(
        slow_snapshot_copies):
    from volunteer.experts.snapshots import state_digest

    config = ExpertsConfig(device="cpu", receipts=True)
    backend = make_backend("ffn.0", "ffn", 16, config=config)
    x = torch.randn(4, 16)
    named: list[tuple[bytes, bytes | None]] = []  # (state id a reply named, digest of the state that computed it)

    def nudge() -> None:  # a replica's average, written the moment a step's copy has started
        with torch.no_grad():
            for parameter in backend.module.parameters():
                parameter.mul_(0.999)

    async def train(settle_later: bool, digest: bytes | None) -> None:
        stamps: list = []
        await runtime.forward("ffn.0", [x], keep_graph=True, stamps=stamps)
        named.append((stamps[0][0].state, digest))
        stamps = []
        await runtime.backward("ffn.0", [x], [torch.randn(4, 16)], settle_later=settle_later, stamps=stamps)
        named.append((stamps[0][0].state, digest))  # the state before the step it owes

    with trio.fail_after(60):
        async with open_runtime([backend], config) as runtime:
            for _ in range(3):  # the server's way: each step owed until the next batch settles it, mid-copy
                await train(settle_later=True, digest=None)
            for _ in range(3):  # a step on the worker, then a job that writes while its copy runs
                await runtime.settled()
                await runtime.run_on("ffn.0", nudge)
                await train(settle_later=False, digest=state_digest(list(backend.module.state_dict().items())))
            await runtime.settled()
            for state, digest in named:
                snapshot = runtime.snapshots.get(state)
                assert snapshot is not None and (digest is None or snapshot.digest() == digest)
            assert runtime.snapshots.report()["torn"] == 0


async def test_a_forward_that_writes_buffers_waits_for_the_copy_of_the_state_it_computes_from(slow_snapshot_copies):
    from volunteer.experts.snapshots import state_digest

    config = ExpertsConfig(device="cpu", receipts=True)
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))  # running statistics: buffers
    backend = ExpertBackend("bn.0", module, inputs=[TensorSpec((4,))], config=config)
    with trio.fail_after(60):
        async with open_runtime([backend], config) as runtime:
            for _ in range(3):
                digest = state_digest(list(backend.module.state_dict().items()))
                stamps: list = []
                await runtime.forward("bn.0", [torch.randn(8, 4)], stamps=stamps)
                snapshot = runtime.snapshots.get(stamps[0][0].state)
                assert snapshot is not None and snapshot.digest() == digest
            assert runtime.snapshots.report()["torn"] == 0


async def test_a_roll_back_waits_for_the_copy_of_the_state_it_overwrites(slow_snapshot_copies):
    # the step before the refused backward started a copy; the judge's roll-back must not write
    # the state mid-copy (that copy would be torn: the reply it names could never be audited)
    from volunteer.errors import TrainerRefusedError

    config = ExpertsConfig(device="cpu", receipts=True)
    torch.manual_seed(0)
    backend = make_backend("ffn.0", "ffn", 8, config=config)

    def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(4, 8, generator=generator), torch.randn(4, 8, generator=generator) * 0.01

    with trio.fail_after(60):
        async with open_runtime([backend], config) as runtime:
            for step in range(28):  # the bound warms up; "pusher" becomes a trainer it knows
                x, g = batch(step)
                await runtime.backward("ffn.0", [x], [g], trainer="honest" if step < 12 else "pusher")
            await runtime.settled()
            before = copy.deepcopy(backend.module.state_dict())
            x, g = batch(99)
            for _ in range(2):  # clipped, a strike each; the step's copy starts as it is applied, and
                # nothing settles it before the next backward (``settled`` would: a job waits for copies)
                await runtime.backward("ffn.0", [x], [g * 50], trainer="pusher")
            with pytest.raises(TrainerRefusedError, match="undone"):
                await runtime.backward("ffn.0", [x], [g * 50], trainer="pusher")
            await runtime.settled()
            assert all(torch.equal(v, before[k]) for k, v in backend.module.state_dict().items())
            assert runtime.trainer_report()["rollbacks"] == 1
            assert runtime.snapshots.report()["torn"] == 0
