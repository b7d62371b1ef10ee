"""Non-finite tensors in either direction, over loopback: a volunteer refuses NaN output gradients
from a trainer (its expert does not step), and a trainer refuses a volunteer's NaN outputs or input
gradients (nothing reaches autograd; the host is excluded; a mixture trains on without it)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from volunteer import RemoteExpert, RemoteMixtureOfExperts, Swarm
from volunteer.errors import ExpertExcludedError, NonFiniteReplyError, RemoteExpertError
from volunteer.experts.client import call_expert

from tests.training import SumTask

from .volunteer_fixture import DHT_CONFIG, SWARM, Volunteer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from lying_volunteer import Lie, lie_in_backward  # noqa: E402


def lie_in_backward_only(module: torch.nn.Module) -> None:
    lie_in_backward(module, float("nan"))


def test_a_volunteer_refuses_non_finite_gradients_and_takes_no_step():
    volunteer = Volunteer(["expert.0.0"], hidden=8)
    swarm = Swarm.join(volunteer.spec(), dht_config=DHT_CONFIG)
    try:
        backend = volunteer.runtime.backends["expert.0.0"]
        x = torch.randn(4, 8)

        async def forward_then_nan_backward():
            await call_expert(swarm.host, volunteer.host.peer_id, "expert.0.0", "forward", [x], swarm_id=SWARM,
                              timeout=5, backward_follows=True)
            bad = torch.randn(4, 8)
            bad[1, 3] = float("inf")
            await call_expert(swarm.host, volunteer.host.peer_id, "expert.0.0", "backward", [x, bad], swarm_id=SWARM,
                              n_inputs=1, timeout=5)

        before = backend.updates
        with pytest.raises(RemoteExpertError, match="gradient 0 holds NaN or inf") as refused:
            swarm.loop.run(forward_then_nan_backward)
        assert refused.value.error_type == "volunteer.errors.ExpertInputError"  # the caller's fault, typed
        assert backend.updates == before
        assert all(bool(torch.isfinite(p).all()) for p in backend.module.parameters())
    finally:
        swarm.close()
        volunteer.stop()


def test_a_remote_experts_nan_output_never_reaches_autograd_and_its_host_is_excluded():
    volunteer = Volunteer(["expert.0.0"], hidden=8)
    swarm = Swarm.join(volunteer.spec(), dht_config=DHT_CONFIG)
    try:
        expert = RemoteExpert("expert.0.0", volunteer.addr, swarm, guard=swarm.guard, forward_timeout=5)
        x = torch.randn(4, 8, requires_grad=True)
        assert bool(torch.isfinite(expert(x)).all())
        volunteer.lie(Lie("nan"))
        with pytest.raises(NonFiniteReplyError, match="non-finite outputs"):
            expert(x)
        with pytest.raises(ExpertExcludedError, match="excluded"):  # not even sent any more
            expert(x)
        report = swarm.trust_report()[volunteer.peer]
        assert report["standing"] == "excluded" and report["excluded_after_replies"] == 2
        assert x.grad is None
    finally:
        swarm.close()
        volunteer.stop()


def backward_liar(honest_uids: list[str], liar_uids: list[str]):
    """An honest volunteer, one whose experts return NaN input gradients (forwards honest), and
    a trainer's swarm."""
    honest = Volunteer(honest_uids, hidden=8)
    liar = Volunteer(liar_uids, hidden=8, bootstrap=[honest.addr])

    async def corrupt():
        await liar.runtime.run_sync(lambda: [lie_in_backward_only(b.module) for b in liar.runtime.backends.values()])

    liar.loop.run(corrupt)
    return honest, liar, Swarm.join(honest.spec(), dht_config=DHT_CONFIG)


def test_nan_input_gradients_are_dropped_and_their_host_excluded_while_the_mixture_trains_on():
    honest, liar, swarm = backward_liar(["expert.0.0", "expert.0.1"], ["expert.1.0", "expert.1.1"])
    try:
        moe = RemoteMixtureOfExperts(swarm, in_features=8, grid_size=(2, 2), uid_prefix="expert", k_best=4, k_min=1,
                                     forward_timeout=5, backward_timeout=5, timeout_after_k_min=1.0, refresh_period=60)
        assert len(moe.live_experts(refresh=True)) == 4
        torch.manual_seed(0)
        task = SumTask(moe, 8, batch=16, lr=1e-2)
        losses = task.fit(12)
        assert all(math.isfinite(loss) for loss in losses)
        assert all(bool(torch.isfinite(p).all()) for p in [*moe.parameters(), *task.head.parameters()])
        report = swarm.trust_report()
        assert report[liar.peer]["standing"] == "excluded"
        assert "non-finite input gradients" in report[liar.peer]["excluded_because"]
        assert report[honest.peer]["standing"] != "excluded"
        assert moe.stats["rejected"] >= 1 and moe.stats["exclusions"] >= 1
        chosen = {uid for uid, hosts in moe.live_experts().items() if moe._pick_host(uid, hosts) is not None}
        assert chosen == {"expert.0.0", "expert.0.1"}  # the liar's experts are no longer called
    finally:
        swarm.close()
        honest.stop()
        liar.stop()


def test_a_rejected_backward_is_answered_by_another_replica_and_its_step_is_not_lost():
    honest, liar, swarm = backward_liar(["expert.0.0", "expert.0.1"], ["expert.0.0", "expert.0.1"])
    try:
        moe = RemoteMixtureOfExperts(swarm, in_features=8, grid_size=(1, 2), uid_prefix="expert", k_best=2, k_min=1,
                                     forward_timeout=5, backward_timeout=5, timeout_after_k_min=1.0, refresh_period=60,
                                     audits=False)
        assert {uid: len(hosts) for uid, hosts in moe.live_experts(refresh=True).items()} == {
            "expert.0.0": 2, "expert.0.1": 2}
        torch.manual_seed(0)
        task = SumTask(moe, 8, batch=16, lr=1e-2)
        losses = task.fit(8)
        assert all(math.isfinite(loss) for loss in losses)
        stats = moe.stats
        # every backward the liar lost (its NaN gradients, or sent to it after it was excluded)
        # was sent again, to the honest replica
        assert stats["rejected"] >= 1 and stats["backward_retried"] >= stats["rejected"], stats
        steps = sum(b.updates for b in honest.runtime.backends.values())
        assert steps == 2 * len(losses)  # both experts stepped on every batch, liar or not
    finally:
        swarm.close()
        honest.stop()
        liar.stop()
