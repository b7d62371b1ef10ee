"""Our trainer on a hivemind swarm: ``Swarm.join`` of a ``kind = "hivemind"`` spec, and
``RemoteExpert`` / ``RemoteMixtureOfExperts`` calling experts hosted the hivemind way (here by
volunteer nodes on that swarm; tests/interop meets ``hivemind.moe.Server``). The mixture trains,
reaches a host known by peer id only through kad, and routes around a host that dies, with our
error types."""

from __future__ import annotations

import math

import pytest
import torch

from volunteer import RemoteExpert, RemoteMixtureOfExperts, Swarm
from volunteer.errors import ExpertUnavailableError, RemoteExpertError
from volunteer.hivemind.trainer import grid_uids

from tests.training import SumTask

from .volunteer_fixture import Volunteer

HIDDEN = 8


def test_grid_uids_enumerate_hivemind_uids():
    assert grid_uids("ffn", (3,)) == ["ffn.0", "ffn.1", "ffn.2"]
    assert grid_uids("ffn.", (2, 2)) == ["ffn.0.0", "ffn.0.1", "ffn.1.0", "ffn.1.1"]


@pytest.mark.slow
def test_our_mixture_trains_on_a_hivemind_swarm_and_routes_around_a_dead_host():
    torch.manual_seed(0)
    first = Volunteer(["ffn.0", "ffn.1"], hidden=HIDDEN, kind="hivemind")
    second = Volunteer(["ffn.2", "ffn.3"], hidden=HIDDEN, bootstrap=[first.addr], kind="hivemind")
    swarm = Swarm.join(first.spec())
    try:
        moe = RemoteMixtureOfExperts(swarm, in_features=HIDDEN, grid_size=(4,), uid_prefix="ffn", k_best=2,
                                     forward_timeout=5, backward_timeout=5, timeout_after_k_min=0.5, refresh_period=0.2)
        assert sorted(moe.live_experts(refresh=True)) == ["ffn.0", "ffn.1", "ffn.2", "ffn.3"]
        task = SumTask(moe, HIDDEN, batch=32, lr=5e-2)
        losses = task.fit(15)
        assert losses[-1] < losses[0] * 0.8, losses
        # second was known to the trainer by peer id only (hivemind records carry no address)
        assert swarm.host.is_connected(second.node.host.peer_id)
        updates = sum(b.updates for v in (first, second) for b in v.node.runtime.backends.values())
        assert updates > 0

        expert = RemoteExpert("ffn.0", first.node.host.peer_id, swarm, forward_timeout=5)
        assert expert.info["outputs_schema"].size == (None, HIDDEN)
        with pytest.raises(RemoteExpertError, match="ExpertInputError"):
            expert(torch.zeros(2, HIDDEN + 1))

        dead = second.node.host.peer_id
        second.stop()
        with pytest.raises(ExpertUnavailableError):
            RemoteExpert("ffn.2", dead, swarm, forward_timeout=5)(task.x)
        failures = moe.failures
        # its records outlive it (hivemind has no tombstones): calls fail, then are avoided
        losses = task.fit(5)
        assert moe.failures > failures and math.isfinite(losses[-1])
    finally:
        swarm.close()
        first.stop()
        second.stop()
