"""The batching runtime: batching across callers, exact split-back, BUSY, failing alone, stats,
pause, cancellation, checkpoints on exit, and a printed overhead measurement."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
import torch
import trio
import trio.testing

from volunteer.errors import (
    ExpertBusyError,
    ExpertInputError,
    ExpertPausedError,
    ExpertUnavailableError,
    UnknownExpertError,
)
from volunteer.experts import ExpertsConfig, TensorSpec
from volunteer.experts.backend import ExpertBackend, make_backend
from volunteer.experts.runtime import open_runtime


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class Picky(torch.nn.Module):
    """Fails on any batch holding a value above 1000 (finite, so only the module can tell)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        if bool((x > 1000).any()):
            raise ValueError("value above 1000")
        return x * self.scale


class Gate:
    """Holds the worker thread inside a run_sync job until released, so requests pile up."""

    def __init__(self, runtime) -> None:
        self.runtime, self.entered, self.release = runtime, threading.Event(), threading.Event()

    def _block(self) -> None:
        self.entered.set()
        self.release.wait(10)

    async def close(self, nursery) -> None:
        nursery.start_soon(self.runtime.run_sync, self._block)
        while not self.entered.is_set():
            await trio.sleep(0.001)

    def open(self) -> None:
        self.release.set()


async def wait_queued(runtime, uid: str, count: int) -> None:
    while runtime.stats()[uid].queued < count:
        await trio.sleep(0.001)


async def test_concurrent_callers_are_batched_and_split_back_exactly():
    backend = make_backend("ffn.0", "ffn", 32)
    inputs = [torch.randn(n, 32) * (i + 1) + 10 * i for i, n in enumerate([1, 3, 2, 5, 4, 1])]
    results: dict[int, torch.Tensor] = {}
    with trio.fail_after(10):
        async with open_runtime([backend]) as runtime:
            async with trio.open_nursery() as nursery:
                gate = Gate(runtime)
                await gate.close(nursery)

                async def call(i):
                    (results[i],) = await runtime.forward("ffn.0", [inputs[i]])

                for i in range(len(inputs)):  # one at a time: the queue order is the index order
                    nursery.start_soon(call, i)
                    await wait_queued(runtime, "ffn.0", i + 1)
                gate.open()
            stats = runtime.stats()["ffn.0"]
    assert stats.batches == 1 and stats.samples == 16 and stats.mean_batch_size == 16
    assert stats.forward == 6 and stats.requests == 6 and stats.errors == 0
    for i, x in enumerate(inputs):
        (alone,) = backend.forward([x])
        assert results[i].shape == x.shape
        assert torch.allclose(results[i], alone, atol=1e-5, rtol=1e-5)
    # Exact against the very batch the runtime ran (same kernels, same rows):
    (batched,) = backend.forward([torch.cat(inputs)])
    assert torch.equal(torch.cat([results[i] for i in range(len(inputs))]), batched)


async def test_different_free_sizes_are_batched_separately():
    backend = make_backend("transformer.0", "transformer", 16)
    inputs = [torch.randn(2, length, 16) for length in (3, 5, 3, 5, 7)]
    results = {}
    with trio.fail_after(10):
        async with open_runtime([backend]) as runtime:
            async with trio.open_nursery() as nursery:
                gate = Gate(runtime)
                await gate.close(nursery)

                async def call(i):
                    (results[i],) = await runtime.forward("transformer.0", [inputs[i]])

                for i in range(len(inputs)):
                    nursery.start_soon(call, i)
                await wait_queued(runtime, "transformer.0", len(inputs))
                gate.open()
            assert runtime.stats()["transformer.0"].batches == 3
    for i, x in enumerate(inputs):
        assert torch.allclose(results[i], backend.forward([x])[0], atol=1e-5)


async def test_batched_backward_matches_and_takes_one_step():
    backend = make_backend("ffn.0", "ffn", 8)
    reference = make_backend("ffn.ref", "ffn", 8)
    reference.module.load_state_dict(backend.module.state_dict())
    xs = [torch.randn(n, 8) for n in (2, 3, 1)]
    gs = [torch.randn(n, 8) for n in (2, 3, 1)]
    results = {}
    with trio.fail_after(10):
        async with open_runtime([backend]) as runtime:
            async with trio.open_nursery() as nursery:
                gate = Gate(runtime)
                await gate.close(nursery)

                async def call(i):
                    (results[i],) = await runtime.backward("ffn.0", [xs[i]], [gs[i]])

                for i in range(3):
                    nursery.start_soon(call, i)
                    await wait_queued(runtime, "ffn.0", i + 1)
                gate.open()
            assert runtime.stats()["ffn.0"].updates == 1
    (expected,) = reference.backward([torch.cat(xs)], [torch.cat(gs)])
    assert torch.equal(torch.cat([results[i] for i in range(3)]), expected)
    assert all(torch.equal(a, b) for a, b in zip(backend.module.parameters(), reference.module.parameters()))


async def test_full_queue_answers_busy_at_once():
    backend = make_backend("ffn.0", "ffn", 8)
    config = ExpertsConfig(max_queue=2)
    with trio.fail_after(10):
        async with open_runtime([backend], config) as runtime:
            async with trio.open_nursery() as nursery:
                gate = Gate(runtime)
                await gate.close(nursery)
                for _ in range(2):
                    nursery.start_soon(runtime.forward, "ffn.0", [torch.randn(1, 8)])
                await wait_queued(runtime, "ffn.0", 2)
                started = trio.current_time()
                with pytest.raises(ExpertBusyError):
                    await runtime.forward("ffn.0", [torch.randn(1, 8)])
                assert trio.current_time() - started < 0.5
                # Backward has a queue of its own.
                nursery.start_soon(runtime.backward, "ffn.0", [torch.randn(1, 8)], [torch.randn(1, 8)])
                gate.open()
            stats = runtime.stats()["ffn.0"]
    assert stats.busy == 1 and stats.forward == 2 and stats.backward == 1


async def test_queued_bytes_are_bounded():
    backend = make_backend("ffn.0", "ffn", 8)
    config = ExpertsConfig(max_queue_bytes=100)
    with trio.fail_after(10):
        async with open_runtime([backend], config) as runtime:
            async with trio.open_nursery() as nursery:
                gate = Gate(runtime)
                await gate.close(nursery)
                nursery.start_soon(runtime.forward, "ffn.0", [torch.randn(2, 8)])  # 64 bytes
                await wait_queued(runtime, "ffn.0", 1)
                with pytest.raises(ExpertBusyError, match="bytes"):
                    await runtime.forward("ffn.0", [torch.randn(2, 8)])
                gate.open()


async def test_one_bad_request_fails_alone():
    backend = ExpertBackend("picky.0", Picky(), inputs=[TensorSpec((4,))])
    good = [torch.randn(2, 4) for _ in range(3)]
    culprit = torch.full((1, 4), 5000.0)
    nan = torch.full((1, 4), float("nan"))
    outcomes = {}
    with trio.fail_after(10):
        async with open_runtime([backend]) as runtime:
            with pytest.raises(ExpertInputError, match="expected float32"):  # refused before queueing
                await runtime.forward("picky.0", [torch.randn(2, 5)])
            async with trio.open_nursery() as nursery:
                gate = Gate(runtime)
                await gate.close(nursery)

                async def call(name, x):
                    try:
                        outcomes[name] = (await runtime.forward("picky.0", [x]))[0]
                    except Exception as exc:
                        outcomes[name] = exc

                for i, x in enumerate(good[:2]):
                    nursery.start_soon(call, i, x)
                nursery.start_soon(call, "culprit", culprit)
                nursery.start_soon(call, "nan", nan)
                nursery.start_soon(call, 2, good[2])
                await wait_queued(runtime, "picky.0", 5)
                gate.open()
            stats = runtime.stats()["picky.0"]
    assert isinstance(outcomes["culprit"], ValueError) and "above 1000" in str(outcomes["culprit"])
    assert isinstance(outcomes["nan"], ExpertInputError)
    for i, x in enumerate(good):
        assert torch.equal(outcomes[i], x * backend.module.scale.detach().cpu())  # replies come back on the CPU
    assert stats.errors == 2 and stats.last_error_time is not None
    assert "above 1000" in stats.last_error or "NaN" in stats.last_error
    assert stats.batches == 3 and stats.samples == 6  # the batch failed; the good ones ran alone


async def test_unknown_paused_and_stats():
    backend = make_backend("ffn.0", "ffn", 8)
    with trio.fail_after(10):
        async with open_runtime({"ffn.0": backend}) as runtime:
            assert runtime.uids == ["ffn.0"] and runtime.info("ffn.0")["hidden_dim"] == 8
            with pytest.raises(UnknownExpertError):
                await runtime.forward("ffn.9", [torch.randn(1, 8)])
            runtime.pause()
            assert runtime.paused
            with pytest.raises(ExpertPausedError):
                await runtime.forward("ffn.0", [torch.randn(1, 8)])
            runtime.resume()
            for _ in range(5):
                await runtime.forward("ffn.0", [torch.randn(3, 8)])
            await runtime.backward("ffn.0", [torch.randn(3, 8)], [torch.randn(3, 8)])
            stats = runtime.stats()["ffn.0"]
    assert (stats.forward, stats.backward, stats.samples, stats.updates) == (5, 1, 18, 1)
    assert stats.latency_p50 is not None and 0 < stats.latency_p50 <= stats.latency_p95 < 5
    assert stats.queued == 0 and stats.errors == 0 and stats.as_dict()["uid"] == "ffn.0"


async def test_cancelled_callers_leave_the_queue():
    backend = make_backend("ffn.0", "ffn", 8)
    with trio.fail_after(10):
        async with open_runtime([backend]) as runtime:
            async with trio.open_nursery() as nursery:
                gate = Gate(runtime)
                await gate.close(nursery)
                with trio.move_on_after(0.05):
                    await runtime.forward("ffn.0", [torch.randn(1, 8)])
                assert runtime.stats()["ffn.0"].queued == 0
                gate.open()
            assert (await runtime.forward("ffn.0", [torch.randn(1, 8)]))[0].shape == (1, 8)


async def test_run_sync_results_and_errors():
    with trio.fail_after(10):
        async with open_runtime([make_backend("ffn.0", "ffn", 8)]) as runtime:
            assert await runtime.run_sync(threading.current_thread) is not threading.current_thread()
            with pytest.raises(ZeroDivisionError):
                await runtime.run_sync(lambda: 1 / 0)


async def test_run_on_runs_a_job_on_one_expert_inline_once_it_is_known_to_be_cheap():
    from volunteer.errors import LocalProtocolError
    from volunteer.experts.requests import Kind

    config = ExpertsConfig(device="cpu", inline_compute_limit=10.0)
    here = threading.current_thread()
    with trio.fail_after(10):
        async with open_runtime([make_backend("ffn.0", "ffn", 8, config=config)], config) as runtime:
            threads = [await runtime.run_on("ffn.0", threading.current_thread, kind=Kind.AVERAGE) for _ in range(2)]
            assert threads[0] is not here and threads[1] is here  # its cost unknown, then known and cheap
            with pytest.raises(ZeroDivisionError):
                await runtime.run_on("ffn.0", lambda: 1 / 0)
            with pytest.raises(UnknownExpertError):
                await runtime.run_on("ffn.9", int)
            with pytest.raises(LocalProtocolError):
                await runtime.run_on("ffn.0", int, kind=Kind.FORWARD)
            async with trio.open_nursery() as nursery:  # queued behind a job, then its expert leaves
                gate = Gate(runtime)
                await gate.close(nursery)
                outcome = []

                async def queued() -> None:
                    try:
                        await runtime.run_on("ffn.0", int, kind=Kind.AVERAGE)
                    except ExpertUnavailableError as exc:
                        outcome.append(exc)

                nursery.start_soon(queued)
                await trio.testing.wait_all_tasks_blocked()
                runtime.remove_backend("ffn.0")
                gate.open()
            assert len(outcome) == 1 and "no longer hosts" in str(outcome[0])


async def test_exit_fails_queued_requests_and_checkpoints(tmp_path):
    config = ExpertsConfig(checkpoint_every=0)  # on shutdown only
    backend = make_backend("ffn.7", "ffn", 8, config=config, checkpoint_dir=tmp_path)
    outcome = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async with open_runtime([backend], config) as runtime:
                await runtime.backward("ffn.7", [torch.randn(2, 8)], [torch.randn(2, 8)])
                gate = Gate(runtime)
                await gate.close(nursery)

                async def late():
                    try:
                        await runtime.forward("ffn.7", [torch.randn(1, 8)])
                    except ExpertUnavailableError as exc:
                        outcome.append(exc)

                nursery.start_soon(late)
                await wait_queued(runtime, "ffn.7", 1)
                gate.open()
    assert len(outcome) == 1 and "shutting down" in str(outcome[0])
    with pytest.raises(ExpertUnavailableError):
        await runtime.forward("ffn.7", [torch.randn(1, 8)])
    assert make_backend("ffn.7", "ffn", 8, config=config, checkpoint_dir=tmp_path).updates == 1


async def test_min_batch_size_waits_for_the_window():
    config = ExpertsConfig(min_batch_size=4, batch_window=0.2)
    with trio.fail_after(10):
        async with open_runtime([make_backend("ffn.0", "ffn", 8)], config) as runtime:
            started = time.perf_counter()
            await runtime.forward("ffn.0", [torch.randn(1, 8)])  # alone: waits out the window
            assert time.perf_counter() - started >= 0.19
            async with trio.open_nursery() as nursery:
                for _ in range(4):  # together: the batch is full at once
                    nursery.start_soon(runtime.forward, "ffn.0", [torch.randn(1, 8)])
            assert runtime.stats()["ffn.0"].batches == 2


@pytest.mark.slow
async def test_measure_overhead(capsys):
    """Prints (no assertions) what the runtime adds to a forward of ffn hidden 256, batch 16."""
    backend = make_backend("ffn.0", "ffn", 256)
    x = torch.randn(16, 256)
    on_device = x.to(backend.device)  # the module alone, where it runs (the runtime moves x itself)
    direct, handoff, runtime_times = [], [], []
    with trio.fail_after(60):
        async with open_runtime([backend]) as runtime:
            for _ in range(3):
                with torch.no_grad():
                    for _ in range(150):
                        started = time.perf_counter()
                        backend.module(on_device)
                        direct.append(time.perf_counter() - started)
                for _ in range(150):
                    started = time.perf_counter()
                    await runtime.forward("ffn.0", [x])
                    runtime_times.append(time.perf_counter() - started)
                for _ in range(150):
                    started = time.perf_counter()
                    await runtime.run_sync(int)
                    handoff.append(time.perf_counter() - started)
    d, r, h = (statistics.median(v) * 1e6 for v in (direct, runtime_times, handoff))
    with capsys.disabled():
        print(
            f"\n[experts runtime] ffn h=256 b=16 median: module {d:.0f} us, runtime.forward {r:.0f} us, "
            f"overhead {r - d:.0f} us (thread hand-off alone {h:.0f} us)"
        )


async def test_a_crashed_worker_fails_callers_instead_of_hanging(caplog):
    backend = make_backend("ffn.0", "ffn", 8)
    with trio.fail_after(10):
        async with open_runtime([backend]) as runtime:
            def broken(job, backend):
                raise RuntimeError("bug in the runtime")

            runtime._run = broken  # a bug outside the per-request error handling
            with pytest.raises(ExpertUnavailableError, match="crashed"):
                await runtime.forward("ffn.0", [torch.randn(1, 8)])
            with pytest.raises(ExpertUnavailableError, match="crashed"):
                await runtime.forward("ffn.0", [torch.randn(1, 8)])
    assert "worker crashed" in caplog.text


async def test_duplicate_uids_are_refused():
    from volunteer.errors import ExpertConfigError

    with pytest.raises(ExpertConfigError):
        async with open_runtime([make_backend("ffn.0", "ffn", 8), make_backend("ffn.0", "ffn", 8)]):
            pass
