"""What a trainer's step costs on the wire, over loopback: a backward carries only gradients (the
volunteer kept the forward's inputs; a forgotten key sends them again), a stale grid is
looked up in the background instead of in the forward, and the calls' costs are reported
per expert (``moe.stats``, ``Swarm.expert_stats``)."""

from __future__ import annotations

import threading

import pytest
import torch

from volunteer import RemoteMixtureOfExperts
from volunteer.experts import moe as moe_module
from volunteer.experts.client import RemoteExpert

from .volunteer_fixture import volunteer_and_trainer

GRID = ["expert.0.0", "expert.0.1"]
HIDDEN = 8


@pytest.fixture(scope="module")
def world():
    with volunteer_and_trainer(GRID, hidden=HIDDEN) as pair:
        yield pair


def mixture(swarm, **options) -> RemoteMixtureOfExperts:
    options = {"k_best": 2, "forward_timeout": 5, "backward_timeout": 5, "timeout_after_k_min": 0.5, **options}
    moe = RemoteMixtureOfExperts(swarm, in_features=HIDDEN, grid_size=(1, 2), uid_prefix="expert", **options)
    assert sorted(moe.live_experts(refresh=True)) == GRID
    return moe


def test_a_backward_sends_only_gradients_and_the_volunteer_reports_its_time(world):
    volunteer, swarm = world
    server = volunteer.server
    moe = mixture(swarm, compression="none", refresh_period=60)
    x = torch.randn(16, HIDDEN)
    before = server.bytes_in
    y = moe(x)
    forward_bytes = server.bytes_in - before
    assert forward_bytes == 2 * 16 * HIDDEN * 4  # both experts got every sample (k_best 2), float32
    hits = server.kept_inputs.hits
    y.pow(2).sum().backward()
    assert server.bytes_in - before == 2 * forward_bytes  # the gradients only, as big as the inputs
    assert server.kept_inputs.hits == hits + 2 and len(server.kept_inputs) == 0
    experts = moe.stats["experts"]
    assert sorted(experts) == GRID
    for uid in GRID:
        [row] = experts[uid]
        assert row["calls"] == 2 and row["failures"] == 0
        assert row["peer"] == str(volunteer.host.peer_id) and row["path"] == "direct tcp"
        assert row["bytes_out_per_call"] == 16 * HIDDEN * 4 and row["server_ms_per_call"] > 0
    assert swarm.expert_stats("expert") == experts


def test_a_volunteer_that_forgot_the_inputs_gets_them_again(world):
    volunteer, swarm = world
    server = volunteer.server
    remote = RemoteExpert("expert.0.1", volunteer.addr, swarm, compression="none")
    x = torch.randn(5, HIDDEN, requires_grad=True)
    y = remote(x)
    assert len(server.kept_inputs) == 1

    async def forget() -> None:
        server.kept_inputs.expire(float("inf"))

    volunteer.loop.run(forget)
    local = volunteer.runtime.backends["expert.0.1"].module
    x_local = x.detach().clone().requires_grad_()
    local(x_local).sum().backward()  # before the remote backward steps the expert's optimizer
    misses = server.kept_inputs.misses
    y.sum().backward()
    assert server.kept_inputs.misses == misses + 1  # asked by key, then sent again
    assert torch.allclose(x.grad, x_local.grad, atol=1e-5)


def test_a_stale_grid_is_looked_up_while_the_forward_goes_on(world, monkeypatch):
    _, swarm = world
    moe = mixture(swarm, refresh_period=0.01)
    # a busy machine may take STALE_AFTER periods (0.1 s) per step: then a forward would rightly
    # wait for its own lookup, which this test holds back; here the cache is never that stale
    monkeypatch.setattr(moe_module, "STALE_AFTER", 10**9)
    lookups, started, release, real = [], threading.Event(), threading.Event(), moe._find_grid

    def slow_find_grid():
        lookups.append(threading.current_thread().name)
        started.set()
        assert release.wait(30), "the test never released the lookup"
        return real()

    monkeypatch.setattr(moe, "_find_grid", slow_find_grid)
    looked_up_at = moe._live_at
    x = torch.randn(8, HIDDEN)
    for _ in range(3):  # each step finds the cache stale; one lookup runs, held back until released
        moe(x).sum().backward()
    assert started.wait(10)
    assert lookups == ["grid-refresh"]  # in the background, once, and the steps did not wait for it
    release.set()
    with moe._refreshing:  # held by the background lookup until it is done
        pass
    assert moe._live_at > looked_up_at and sorted(moe.live_experts()) == GRID
