"""Our trainer on a hivemind swarm: ``Swarm.join`` of a ``kind = "hivemind"`` spec, and
``RemoteExpert`` / ``RemoteMixtureOfExperts`` calling experts hosted the hivemind way (here by
volunteer nodes on that swarm; tests/interop meets ``hivemind.moe.Server``). The mixture trains,
reaches a host known by peer id only through kad, and routes around a host that dies, with our
error types."""

from __future__ import annotations

import pytest
import torch
import trio

from volunteer import RemoteExpert, RemoteMixtureOfExperts, Swarm
from volunteer.errors import ExpertUnavailableError, RemoteExpertError
from volunteer.experts import ExpertsConfig
from volunteer.experts.loop import BackgroundLoop
from volunteer.hivemind.trainer import grid_uids
from volunteer.net.host import HostConfig
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.swarmfile import SwarmSpec

QUIET = HostConfig(enable_hole_punching=False, enable_relay_client=False, enable_perf=False)
HIDDEN = 8


class HivemindVolunteer:
    """``open_volunteer`` on a hivemind swarm, in its own background loop, until ``stop``."""

    def __init__(self, uids, bootstrap=()) -> None:
        self.options = VolunteerOptions(
            listen=["/ip4/127.0.0.1/tcp/0"], host_config=QUIET, nat=False, mdns=False, expert_class="ffn",
            uids=list(uids), hidden_dim=HIDDEN, experts_config=ExpertsConfig(device="cpu"),
        )
        self.spec = SwarmSpec("hm", "hm", bootstrap=list(bootstrap), kind="hivemind")
        self.loop = BackgroundLoop().start()
        self.loop.run(self._start, timeout=30)

    async def _start(self) -> None:
        self._ready, self._stop, self._done = trio.Event(), trio.Event(), trio.Event()
        trio.lowlevel.spawn_system_task(self._main)
        await self._ready.wait()

    async def _main(self) -> None:
        try:
            async with open_volunteer(self.spec, self.options) as node:
                self.node = node
                await node.hivemind.experts.declare()
                self._ready.set()
                await self._stop.wait()
        finally:
            self._ready.set()
            self._done.set()

    @property
    def addr(self):
        return self.node.host.full_addrs()[0]

    def stop(self) -> None:
        async def stop() -> None:
            self._stop.set()
            await self._done.wait()

        if self.loop.running:
            self.loop.run(stop, timeout=30)
            self.loop.stop()


def test_grid_uids_enumerate_hivemind_uids():
    assert grid_uids("ffn", (3,)) == ["ffn.0", "ffn.1", "ffn.2"]
    assert grid_uids("ffn.", (2, 2)) == ["ffn.0.0", "ffn.0.1", "ffn.1.0", "ffn.1.1"]


def test_our_mixture_trains_on_a_hivemind_swarm_and_routes_around_a_dead_host():
    torch.manual_seed(0)
    first = HivemindVolunteer(["ffn.0", "ffn.1"])
    second = HivemindVolunteer(["ffn.2", "ffn.3"], bootstrap=[first.addr])
    swarm = Swarm.join(SwarmSpec("hm", "hm", bootstrap=[first.addr], kind="hivemind"))
    try:
        moe = RemoteMixtureOfExperts(swarm, in_features=HIDDEN, grid_size=(4,), uid_prefix="ffn", k_best=2,
                                     forward_timeout=5, backward_timeout=5, timeout_after_k_min=0.5, refresh_period=0.2)
        assert sorted(moe.live_experts(refresh=True)) == ["ffn.0", "ffn.1", "ffn.2", "ffn.3"]
        head = torch.nn.Linear(HIDDEN, 1)
        optimizer = torch.optim.Adam([*moe.parameters(), *head.parameters()], lr=5e-2)
        x = torch.randn(32, HIDDEN)
        target = x.sum(-1, keepdim=True)
        losses = []
        for _ in range(15):
            loss = torch.nn.functional.mse_loss(head(moe(x)), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
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
            RemoteExpert("ffn.2", dead, swarm, forward_timeout=5)(x)
        failures = moe.failures
        for _ in range(5):  # its records outlive it (hivemind has no tombstones): calls fail, then are avoided
            loss = torch.nn.functional.mse_loss(head(moe(x)), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        assert moe.failures > failures and torch.isfinite(loss)
    finally:
        swarm.close()
        first.stop()
        second.stop()
