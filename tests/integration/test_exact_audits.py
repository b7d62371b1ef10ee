"""Exact audits on real volunteers (in-process, loopback): every reply carries a signed receipt,
the host keeps the states it answered from, and the trainer recomputes audited replies from them.
A liar is excluded on one proof whatever the other replicas say: lies far inside honest drift
(x1.02, a 30 degree turn at the honest norm, input gradients only), two liars of three, and a liar
with a single honest replica beside it; honest hosts are never excluded."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest
import torch

from volunteer import RemoteMixtureOfExperts, Swarm
from volunteer.experts.receipts import Receipt
from volunteer.experts.trust import TrustPolicy

from .test_moe_audits import DHT, HIDDEN, REPLICAS, grid
from .volunteer_fixture import Volunteer
from tests.training import SumTask

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from lying_volunteer import lie_in_backward  # noqa: E402

BUDGET = 500  # replies of a liar by which it must be excluded (the bound)


def times(factor: float):
    return lambda output: output * factor


def turned(degrees: float):
    """Outputs turned ``degrees`` away from the honest ones, at the honest norm."""
    angle = math.radians(degrees)

    def lie(output: torch.Tensor) -> torch.Tensor:
        other = torch.randn(output.shape, generator=torch.Generator().manual_seed(7), dtype=output.dtype)
        other = other - (other * output).sum() / (output * output).sum().clamp_min(1e-12) * output
        return math.cos(angle) * output + math.sin(angle) * output.norm() / other.norm().clamp_min(1e-12) * other

    return lie


class World:
    """``honest`` volunteers hosting the whole grid, then ``len(liars)`` more whose experts lie
    (each a patch of its modules), and a trainer."""

    def __init__(self, honest: int, liars: list, *, trust: TrustPolicy | None = None, hidden: int = HIDDEN) -> None:
        self.hidden = hidden
        spec = grid(honest + len(liars), hidden)
        self.honest: list[Volunteer] = []
        self.liars: list[Volunteer] = []
        self.swarm = None
        try:
            for _ in range(honest):
                bootstrap = [self.honest[0].addr] if self.honest else []
                self.honest.append(Volunteer([], hidden=hidden, grid=spec, bootstrap=bootstrap,
                                             replicas_config=REPLICAS, dht_config=DHT, receipts=True))
            for patch in liars:
                liar = Volunteer([], hidden=hidden, grid=spec, bootstrap=[self.honest[0].addr],
                                 replicas_config=REPLICAS, dht_config=DHT, receipts=True)
                self.liars.append(liar)
                liar.corrupt(patch)
            options = {"trust": trust} if trust is not None else {}
            self.swarm = Swarm.join(self.honest[0].spec(), dht_config=DHT, **options)
            self.moe = RemoteMixtureOfExperts(self.swarm, in_features=hidden, grid=spec, k_best=2, forward_timeout=5,
                                              backward_timeout=5, timeout_after_k_min=1.0, refresh_period=0.5)
            self._wait(honest + len(liars))
        except BaseException:
            self.close()
            raise

    def _wait(self, count: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            live = self.moe.live_experts(refresh=True)
            if len(live) == 4 and all(len(hosts) == count for hosts in live.values()):
                return
            time.sleep(0.2)
        raise AssertionError(f"not every expert has {count} replicas: {self.moe.live_experts()}")

    def train_until(self, done, *, steps: int) -> tuple[SumTask, list[float]]:
        torch.manual_seed(0)
        task = SumTask(self.moe, self.hidden, batch=32, lr=1e-2)
        losses = []
        for _ in range(steps):
            losses.append(task.step())
            if done():
                break
        return task, losses

    def settle(self) -> None:
        deadline = time.monotonic() + 20
        while self.moe._auditor.pending and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        if self.swarm is not None:
            self.swarm.close()
        for volunteer in [*self.honest, *self.liars]:
            volunteer.stop()


def modules(lie):
    """A patch that makes every expert module answer ``lie(honest output)``."""
    from lying_volunteer import lie_in_module

    return lambda module: lie_in_module(module, lie)


def check_excluded_by_proof(world: World, *, kind: str = "outputs") -> dict:
    trust = world.swarm.trust_report()
    for liar in world.liars:
        record = trust[liar.peer]
        assert record["standing"] == "excluded", (record, world.moe.stats)
        assert record["excluded_after_replies"] <= BUDGET, record
        assert f"its {kind} of expert" in record["excluded_because"], record
        assert "contradicted by recompute" in record["excluded_because"] and record["excluded_on_proof"], record
    for volunteer in world.honest:
        assert trust.get(volunteer.peer, {}).get("standing") != "excluded", trust[volunteer.peer]
    proofs = world.moe._auditor.proofs  # the evidence: the liar's signed receipt, our inputs, the recompute
    assert {p["peer"] for p in proofs} == {liar.peer for liar in world.liars}
    assert all(Receipt.decode(p["receipt"]).verify(p["peer"]) and p["recomputed"] for p in proofs)
    assert world.moe.stats["proofs"] >= len(world.liars), world.moe.stats
    return trust


@pytest.mark.slow
@pytest.mark.parametrize("lie", [times(1.02), turned(30.0)], ids=["x1.02", "turned-30deg"])
def test_a_lie_inside_honest_drift_is_excluded_on_one_proof_within_500_replies(lie):
    world = World(2, [modules(lie)])
    try:
        liar = world.liars[0].peer
        world.train_until(lambda: world.moe.trust.excluded(liar), steps=400)
        world.settle()
        check_excluded_by_proof(world)
        assert world.moe.stats["disagreements"] == 0  # no vote was taken
    finally:
        world.close()


@pytest.mark.slow
def test_a_liar_in_input_gradients_only_is_excluded_on_one_proof():
    world = World(2, [lambda module: lie_in_backward(module, 1.02)])
    try:
        liar = world.liars[0].peer
        world.train_until(lambda: world.moe.trust.excluded(liar), steps=400)
        world.settle()
        check_excluded_by_proof(world, kind="input gradients")
    finally:
        world.close()


@pytest.mark.slow
def test_two_liars_of_three_replicas_are_excluded_and_never_get_the_honest_host_excluded():
    world = World(1, [modules(times(-1.0)), modules(times(-1.0))])
    try:
        liars = [liar.peer for liar in world.liars]
        task, losses = world.train_until(lambda: all(world.moe.trust.excluded(p) for p in liars), steps=400)
        world.settle()
        check_excluded_by_proof(world)
        more = [task.step() for _ in range(20)]  # the honest host answers alone from now on
        world.settle()
        trust = world.swarm.trust_report()
        assert trust[world.honest[0].peer]["standing"] == "proven", trust[world.honest[0].peer]
        assert all(math.isfinite(loss) for loss in losses + more)
    finally:
        world.close()


@pytest.mark.slow
def test_with_one_honest_replica_recompute_settles_what_a_vote_could_not():
    world = World(1, [modules(times(3.0))])
    try:
        liar = world.liars[0].peer
        world.train_until(lambda: world.moe.trust.excluded(liar), steps=400)
        world.settle()
        check_excluded_by_proof(world)
    finally:
        world.close()


@pytest.mark.slow
def test_honest_replicas_audited_on_every_call_all_pass_exactly():
    world = World(3, [], trust=TrustPolicy(untrusted_rate=1.0, trust_after=1000))
    try:
        task, losses = world.train_until(lambda: False, steps=40)
        world.settle()
        stats, trust = world.moe.stats, world.swarm.trust_report()
        assert stats["exact_audits"] >= 40 and stats["proofs"] == 0 and stats["exclusions"] == 0, stats
        assert stats["snapshots_missing"] == 0 and stats["false_receipts"] == 0, stats
        assert all(trust[v.peer]["standing"] == "proven" for v in world.honest), (stats, trust)
        assert all(trust[v.peer]["exact_audits_passed"] > 0 for v in world.honest), trust
        assert losses[-1] < losses[0]
        # each host states what it keeps for audits, and served what was asked of it
        kept = [v.server.snapshot()["snapshots"] for v in world.honest]
        assert all(k["budget_bytes"] > 0 and k["bytes"] <= k["budget_bytes"] and k["missed"] == 0 for k in kept), kept
        assert sum(k["served"] for k in kept) > 0, kept
    finally:
        world.close()
