"""RemoteMixtureOfExperts over two volunteers: it learns, gradients reach the gate and the
experts, a volunteer that dies mid-training is routed around, and with every expert gone the
trainer gets a clear error."""

from __future__ import annotations

import pytest
import torch

from volunteer import RemoteMixtureOfExperts, Swarm
from volunteer.errors import ExpertUnavailableError

from tests.training import SumTask

from .volunteer_fixture import DHT_CONFIG, Volunteer


@pytest.mark.slow
def test_mixture_trains_survives_a_dead_volunteer_and_fails_clearly_when_all_are_gone():
    torch.manual_seed(0)
    first = Volunteer(["expert.0.0", "expert.0.1"], hidden=8)
    second = Volunteer(["expert.1.0", "expert.1.1"], hidden=8, bootstrap=[first.addr])
    swarm = Swarm.join(first.spec(), dht_config=DHT_CONFIG)
    try:
        moe = RemoteMixtureOfExperts(swarm, in_features=8, grid_size=(2, 2), uid_prefix="expert", k_best=2, k_min=1,
                                     forward_timeout=5, backward_timeout=5, timeout_after_k_min=0.5, refresh_period=0.2)
        assert sorted(moe.live_experts(refresh=True)) == ["expert.0.0", "expert.0.1", "expert.1.0", "expert.1.1"]
        task = SumTask(moe, 8, batch=32, lr=5e-2)

        def gate_has_gradients() -> None:
            assert moe.gate.weight.grad is not None and moe.gate.weight.grad.abs().sum() > 0

        losses = task.fit(15, gate_has_gradients)
        assert losses[-1] < losses[0] * 0.8, losses
        updates = sum(b.updates for v in (first, second) for b in v.runtime.backends.values())
        assert updates > 0  # the experts learned too

        second.stop(crash=True)
        task.fit(5)  # still trains: the dead volunteer's experts fail, then are avoided
        assert moe.failures >= 1

        first.stop()
        with pytest.raises(ExpertUnavailableError):
            moe._live_at = float("-inf")
            moe(task.x)
    finally:
        swarm.close()
        first.stop()
        second.stop()


@pytest.mark.slow
def test_a_per_sample_mixture_routes_whole_sequences_to_transformer_experts():
    torch.manual_seed(0)
    volunteer = Volunteer(["seq.0.0", "seq.0.1", "seq.1.0", "seq.1.1"], hidden=8, expert_class="transformer")
    swarm = Swarm.join(volunteer.spec(), dht_config=DHT_CONFIG)
    try:
        moe = RemoteMixtureOfExperts(swarm, in_features=8, grid_size=(2, 2), uid_prefix="seq", k_best=2,
                                     forward_timeout=5, backward_timeout=5, per_sample=True)
        x = torch.randn(6, 5, 8)  # 6 sequences of 5 positions
        target = torch.roll(x, 1, dims=1)  # what a position needs of its neighbour: attention's job
        opt = torch.optim.Adam(moe.parameters(), lr=1e-2)
        losses = []
        for _ in range(12):
            out = moe(x)
            assert out.shape == (6, 5, 8)
            loss = torch.nn.functional.mse_loss(out, target)
            opt.zero_grad()
            loss.backward()
            losses.append(loss.item())
            opt.step()
        assert moe.gate.weight.grad is not None and moe.gate.weight.grad.abs().sum() > 0
        # each call carried whole sequences: a transformer expert refuses a [tokens, hidden] input
        assert moe.stats["calls"] > 0 and moe.failures == 0
        assert sum(b.updates for b in volunteer.runtime.backends.values()) > 0
        assert losses[-1] < losses[0], losses
    finally:
        swarm.close()
        volunteer.stop()
