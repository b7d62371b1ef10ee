"""The runtime's hosting changes while it runs (placement adds caught-up experts, drops
over-replicated ones, hand-off receivers take pushed ones): served at once, forgotten at once,
queued requests of a dropped expert fail instead of hanging, and the store goes through them."""

from __future__ import annotations

import pytest
import torch
import trio
import trio.testing

from volunteer.errors import ExpertConfigError, ExpertUnavailableError, UnknownExpertError
from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.runtime import open_runtime
from volunteer.replicas import BackendStore


async def test_a_backend_added_while_running_is_served_and_a_removed_one_is_not():
    async with open_runtime([make_backend("ffn.0", "ffn", 8)], ExpertsConfig(device="cpu")) as runtime:
        late = make_backend("ffn.1", "ffn", 8)
        runtime.add_backend(late)
        x = torch.randn(2, 8)
        out = await runtime.forward("ffn.1", [x])
        assert torch.allclose(out[0], late.forward([x])[0])
        assert set(runtime.stats()) == {"ffn.0", "ffn.1"}
        with pytest.raises(ExpertConfigError):
            runtime.add_backend(make_backend("ffn.1", "ffn", 8))
        assert runtime.remove_backend("ffn.1") is late
        assert set(runtime.stats()) == {"ffn.0"} and runtime.uids == ["ffn.0"]
        with pytest.raises(UnknownExpertError):
            await runtime.forward("ffn.1", [x])
        with pytest.raises(UnknownExpertError):
            runtime.remove_backend("ffn.1")
        await runtime.forward("ffn.0", [x])  # the others are untouched


async def test_requests_queued_for_a_removed_backend_fail_at_once():
    gate = trio.Event()
    async with open_runtime([make_backend("ffn.0", "ffn", 8)], ExpertsConfig(device="cpu")) as runtime:
        # hold the worker in a call so that a forward stays queued
        token = trio.lowlevel.current_trio_token()

        def blocked() -> None:
            trio.from_thread.run(gate.wait, trio_token=token)

        errors = []

        async def queued_forward() -> None:
            try:
                await runtime.forward("ffn.0", [torch.randn(1, 8)])
            except ExpertUnavailableError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime.run_sync, blocked)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(queued_forward)
            await trio.testing.wait_all_tasks_blocked()
            runtime.remove_backend("ffn.0")
            gate.set()
        assert len(errors) == 1 and "no longer hosts" in str(errors[0])


async def test_the_store_adds_and_removes_through_the_runtime():
    async with open_runtime([], ExpertsConfig(device="cpu")) as runtime:
        store = BackendStore(runtime.backends, runtime=runtime, capacity=2)
        store.add(make_backend("ffn.3", "ffn", 8))
        assert runtime.uids == ["ffn.3"] and store.versions() == {"ffn.3": 0} and store.spare == 1
        await runtime.forward("ffn.3", [torch.randn(1, 8)])
        store.remove("ffn.3")
        assert runtime.uids == [] and store.spare == 2
