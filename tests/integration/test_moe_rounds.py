"""RemoteMixtureOfExperts with injected faults (volunteer/experts/faults.py), over loopback:
samples whose experts fail go to their next-best experts in a second round of the same forward;
samples still short of k_min get a zero output and are counted; only a step where no expert
answered raises; backward reaches only the experts that answered."""

from __future__ import annotations

import time

import pytest
import torch

from volunteer import RemoteMixtureOfExperts, Swarm
from volunteer.errors import ExpertUnavailableError
from volunteer.experts.faults import FaultInjection

from .volunteer_fixture import DHT_CONFIG, Volunteer, volunteer_and_trainer

GRID = ["expert.0.0", "expert.0.1"]


@pytest.fixture(scope="module")
def world():
    with volunteer_and_trainer(GRID, hidden=8) as pair:
        yield pair


def mixture(swarm, **options) -> RemoteMixtureOfExperts:
    moe = RemoteMixtureOfExperts(swarm, in_features=8, grid_size=(1, 2), uid_prefix="expert", forward_timeout=5,
                                 backward_timeout=5, timeout_after_k_min=0.5, refresh_period=60, **options)
    assert sorted(moe.live_experts(refresh=True)) == GRID
    return moe


def test_samples_of_a_failing_expert_are_rerouted_in_the_same_forward(world):
    volunteer, swarm = world
    torch.manual_seed(1)
    moe = mixture(swarm, k_best=1, k_min=1)
    x = torch.randn(64, 8)
    with torch.no_grad():
        picks = moe.gate(x)[:, 1:].argmax(-1)  # the grid's second dimension decides: expert.0.<pick>
    assert 0 < int((picks == 0).sum()) < 64  # both experts are somebody's first choice
    before = {uid: volunteer.runtime.backends[uid].updates for uid in GRID}
    swarm.faults = FaultInjection(fail_uids={"expert.0.0"})
    try:
        out = moe(x)
        assert moe.stats["rerouted"] == int((picks == 0).sum())
        assert moe.stats["samples_short"] == 0 and moe.stats["failures"] == 1
        assert moe.stats["calls"] == 3  # two in the first round, one in the second
        assert bool((out.abs().sum(-1) > 0).all())
        out.sum().backward()
    finally:
        swarm.faults = None
    assert moe.gate.weight.grad is not None
    # backward went to the expert that answered (once per round it answered in: two calls, two
    # steps), never to the one that failed
    assert volunteer.runtime.backends["expert.0.1"].updates == before["expert.0.1"] + 2
    assert volunteer.runtime.backends["expert.0.0"].updates == before["expert.0.0"]


def test_samples_still_short_get_zero_outputs_and_are_counted(world):
    _, swarm = world
    moe = mixture(swarm, k_best=2, k_min=2)
    x = torch.randn(16, 8)
    swarm.faults = FaultInjection(fail_uids={"expert.0.1"})
    try:
        out = moe(x)  # every sample needs both experts; one fails and there is no third to try
    finally:
        swarm.faults = None
    assert moe.stats["samples_short"] == 16 and moe.stats["rerouted"] == 0
    assert out.shape == (16, 8) and bool((out == 0).all())


def test_a_straggler_dropped_after_k_min_is_not_called_again_in_the_same_forward(world):
    """Every sample has its k_min answer when the slow expert is dropped; its only host is the
    one that straggled, so the fail-over has no other replica to ask and asks nobody (it once
    called the same host again with the same samples: a whole extra exchange on a far link)."""
    _, swarm = world
    moe = mixture(swarm, k_best=2, k_min=1)
    faults = swarm.faults = FaultInjection(slow_uids={"expert.0.1": 3.0})
    try:
        out = moe(torch.randn(16, 8))
    finally:
        swarm.faults = None
    assert faults.calls == 2 and moe.stats["calls"] == 2  # one per expert: no second call to the straggler
    assert moe.stats["failed_over"] == 0 and moe.stats["failures"] == 0 and moe.stats["samples_short"] == 0
    assert bool((out.abs().sum(-1) > 0).all())


def test_a_step_where_no_expert_answers_raises(world):
    _, swarm = world
    moe = mixture(swarm, k_best=1, k_min=1)
    swarm.faults = FaultInjection(fail_uids=set(GRID))
    try:
        with pytest.raises(ExpertUnavailableError, match="injected failure"):
            moe(torch.randn(8, 8))
    finally:
        swarm.faults = None
    assert moe.stats["failures"] == 2


def test_an_expert_whose_host_died_is_served_by_its_other_replica_in_the_same_forward():
    torch.manual_seed(2)
    first = Volunteer(GRID, hidden=8)
    second = Volunteer(GRID, hidden=8, bootstrap=[first.addr])
    swarm = Swarm.join(first.spec(), dht_config=DHT_CONFIG)
    try:
        moe = RemoteMixtureOfExperts(swarm, in_features=8, grid_size=(1, 2), uid_prefix="expert", k_best=2, k_min=2,
                                     forward_timeout=5, backward_timeout=5, timeout_after_k_min=0.5, refresh_period=60)
        live = moe.live_experts(refresh=True)
        assert sorted(live) == GRID and all(len(hosts) == 2 for hosts in live.values())
        now = time.monotonic()  # calls go to first
        moe._latency = {str(first.host.peer_id): (1e-4, now), str(second.host.peer_id): (10.0, now)}
        first.stop(crash=True)  # gone without tombstones: the trainer still sees both replicas
        before = {uid: second.runtime.backends[uid].updates for uid in GRID}
        x = torch.randn(16, 8)
        out = moe(x)  # every sample needs both experts, so each must come from second
        assert moe.stats["failed_over"] == 2 and moe.stats["samples_short"] == 0 and moe.stats["rerouted"] == 0
        assert bool((out.abs().sum(-1) > 0).all())
        out.sum().backward()  # backward goes to the replica that ran the forward
        assert all(second.runtime.backends[uid].updates == before[uid] + 1 for uid in GRID)
    finally:
        swarm.close()
        first.stop()
        second.stop()
