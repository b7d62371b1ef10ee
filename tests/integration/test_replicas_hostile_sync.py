"""Sync poisoning, tried as an attacker would: a liar built from our own sync service (its store
hands out NaN, +inf or ×10⁶ parameters at version 10⁹) joins the rounds of honest replicas that
train between rounds. Through 20 rounds, in a pair and in a trio, the honest replicas stay finite,
within their honest drift, at their own versions, and count the refusals by reason."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import torch
import trio

from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.standing import Standing
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport
from volunteer.replicas.config import ReplicasConfig
from volunteer.replicas.guard import NONFINITE, OUTLIER
from volunteer.replicas.state import sync_parameters
from volunteer.replicas.store import BackendStore
from volunteer.replicas.syncdriver import ReplicaSync

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
EXPERTS = ExpertsConfig(device="cpu")
SWARM = "hs"
UID = "expert.0.0"
ROUNDS = 20
LIE = 10**9


class PoisonedStore(BackendStore):
    """A liar's store: every round it offers its parameters poisoned by ``poison`` at a huge version."""

    def __init__(self, backends, poison):
        super().__init__(backends)
        self.poison = poison

    async def parameters(self, uid):
        _, params = await super().parameters(uid)
        return LIE, [(name, self.poison(t)) for name, t in params]


POISONS = {
    "nan": (lambda t: torch.full_like(t, float("nan")), NONFINITE),
    "inf": (lambda t: torch.full_like(t, float("inf")), NONFINITE),
    "huge": (lambda t: t * 1e6, OUTLIER),
}
# the liar's own parameters may turn non-finite too once ×10⁶ compounds: either refusal will do
REFUSALS = (NONFINITE, OUTLIER)


def train(backend, generator):
    x = torch.randn(4, 8, generator=generator)
    backend.backward([x], [torch.randn(4, 8, generator=generator)])


def flat(backend):
    return torch.cat([t.reshape(-1) for _, t in sync_parameters(backend)]).to(torch.float64)


async def sync_service(stack, network, store):
    sync = ReplicaSync(SWARM, store, ReplicasConfig(sync_timeout=5))
    host = await stack.enter_async_context(
        open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET, services=[sync])
    )
    return host, sync


def lineage(members) -> None:
    """The honest ``members`` (host, sync) caught up from one another: each has standing with the
    others (the only way to it: a fresh identity never gets any)."""
    for host, sync in members:
        for other, _ in members:
            if other is not host:
                sync.guard.vouch(UID, str(other.peer_id))


async def sync_rounds(members, honest, generator, version_limit):
    """ROUNDS rounds of every member's sync with all the others, the honest backends training
    before each; the largest step an honest replica took alone, and every (sync, outcome)."""
    addrs = [host.full_addrs()[0] for host, _ in members]
    honest_drift = 0.0
    outcomes = []

    async def run(sync, peers):
        outcomes.append((sync, await sync.average(UID, peers)))
    for _ in range(ROUNDS):
        before = [flat(b) for b in honest]
        for backend in honest:
            train(backend, generator)
        honest_drift = max(honest_drift, *(float((flat(b) - p).norm()) for b, p in zip(honest, before)))
        async with trio.open_nursery() as nursery:
            for i, (_, sync) in enumerate(members):
                nursery.start_soon(run, sync, [a for j, a in enumerate(addrs) if j != i])
        for backend in honest:
            assert torch.isfinite(flat(backend)).all()
            assert backend.updates < version_limit
    return honest_drift, outcomes


@pytest.mark.slow
@pytest.mark.trio_timeout(120)
@pytest.mark.parametrize("honest_count", [1, 2])
@pytest.mark.parametrize("poison", sorted(POISONS))
async def test_a_poisoning_liar_moves_no_honest_replica(poison, honest_count):
    network = MemoryNetwork()
    generator = torch.Generator().manual_seed(3)
    torch.manual_seed(0)
    origin = make_backend(UID, "ffn", 8, config=EXPERTS)
    honest = [make_backend(UID, "ffn", 8, config=EXPERTS) for _ in range(honest_count)]
    for backend in honest:  # replicas caught up from one another: the same start
        backend.module.load_state_dict(origin.module.state_dict())
    liar_backend = make_backend(UID, "ffn", 8, config=EXPERTS)
    liar_backend.module.load_state_dict(origin.module.state_dict())
    transform, reason = POISONS[poison]  # the first round's refusal
    async with AsyncExitStack() as stack:
        members = [await sync_service(stack, network, BackendStore({UID: b})) for b in honest]
        lineage(members)
        members.append(await sync_service(stack, network, PoisonedStore({UID: liar_backend}, transform)))
        honest_drift, outcomes = await sync_rounds(members, honest, generator, LIE)
        liar = str(members[-1][0].peer_id)
        for _, sync in members[:-1]:
            # every round, every honest replica refused the liar's contribution (and counted it)
            mine = [outcome for who, outcome in outcomes if who is sync]
            assert len(mine) == ROUNDS and all(dict(o.refused).get(liar) in REFUSALS for o in mine)
            assert sum(sync.refusals[r] for r in REFUSALS) == ROUNDS and sync.refusals[reason] >= 1
            assert sync.standings[(UID, liar)] in (Standing.SUSPECT, Standing.EXCLUDED)
            assert all(sync.standings[(UID, str(h.peer_id))] == Standing.PROVEN for h, s in members[:-1] if s is not sync)
    start = flat(origin)
    for backend in honest:
        # what honest training alone moves them: no more than their own steps add up to
        assert float((flat(backend) - start).norm()) <= ROUNDS * honest_drift * 1.01
        assert backend.updates == ROUNDS


class ShiftingStore(BackendStore):
    """A colluder's store: its parameters shifted by -0.5 more every round (finite, plausible in a
    first round, and what a fellow colluder offers too), at a version just above its own."""

    def __init__(self, backends):
        super().__init__(backends)
        self.shift = 0.0

    async def parameters(self, uid):
        version, params = await super().parameters(uid)
        self.shift += 0.5
        return version + 1, [(name, t - self.shift) for name, t in params]


@pytest.mark.slow
@pytest.mark.trio_timeout(120)
@pytest.mark.parametrize("honest_count", [1, 2], ids=["two-of-three", "two-of-four"])
async def test_two_colluding_fresh_identities_move_no_honest_replica(honest_count):
    """Identities are free: two colluders agree with each other, so a majority statistic or a
    vote sides with them when they are half the group or more. Nothing of a fresh identity is
    ever merged (standing comes only from lineage), so they move nobody."""
    network = MemoryNetwork()
    generator = torch.Generator().manual_seed(5)
    torch.manual_seed(0)
    origin = make_backend(UID, "ffn", 8, config=EXPERTS)
    backends = [make_backend(UID, "ffn", 8, config=EXPERTS) for _ in range(honest_count + 2)]
    for backend in backends:  # every member caught up from the same state: nothing tells them apart
        backend.module.load_state_dict(origin.module.state_dict())
    honest, colluding = backends[:honest_count], backends[honest_count:]
    async with AsyncExitStack() as stack:
        members = [await sync_service(stack, network, BackendStore({UID: b})) for b in honest]
        lineage(members)
        members += [await sync_service(stack, network, ShiftingStore({UID: b})) for b in colluding]
        colluders = {str(host.peer_id) for host, _ in members[honest_count:]}
        honest_drift, outcomes = await sync_rounds(members, honest, generator, LIE)
        for _, sync in members[:honest_count]:
            mine = [outcome for who, outcome in outcomes if who is sync]
            assert len(mine) == ROUNDS
            # never merged: left out as outliers (in a first round, within twice the bound, but
            # never weighed: we loaded nothing of theirs)
            assert all(peer in dict(o.refused) for o in mine[1:] for peer in colluders)
            assert all(sync.standings.get((UID, peer)) != Standing.PROVEN for peer in colluders)
    start = flat(origin)
    for backend in honest:
        assert torch.isfinite(flat(backend)).all()
        assert float((flat(backend) - start).norm()) <= ROUNDS * honest_drift * 1.01
        assert backend.updates == ROUNDS


class PatientStore(BackendStore):
    """A patient colluder's store: it offers the honest replica's own current parameters (the
    worst case: it sees them as they are) moved along ``push`` by what its goal of ``rate`` steps
    a round still misses (at most 2.5 steps, inside the distance bound) plus a step of noise, the
    same for every colluder in a round (``shared``), so that its differences wander like an
    honest replica's."""

    def __init__(self, backends, target, origin, push, step, rate, shared):
        super().__init__(backends)
        self.target, self.origin, self.push, self.step, self.rate, self.shared = target, origin, push, step, rate, shared

    async def parameters(self, uid):
        version, _ = await super().parameters(uid)
        params = sync_parameters(self.target)
        rounds = self.target.updates  # the honest replica trains once a round
        along = float((flat(self.target) - self.origin) @ self.push)
        if rounds not in self.shared:
            noise = torch.randn(self.push.shape, generator=torch.Generator().manual_seed(rounds), dtype=torch.float64)
            self.shared[rounds] = noise / noise.norm() * self.step
        offset = min(self.rate * self.step * rounds - along, 2.5 * self.step) * self.push + self.shared[rounds]
        out, start = [], 0
        for name, tensor in params:
            count = tensor.numel()
            out.append((name, tensor + offset[start : start + count].reshape(tensor.shape).to(tensor.dtype)))
            start += count
        return version + 1, out


@pytest.mark.slow
@pytest.mark.trio_timeout(120)
@pytest.mark.parametrize("honest_count", [1, 2], ids=["two-of-three", "two-of-four"])
async def test_two_patient_colluders_leave_honest_replicas_within_their_drift(honest_count):
    """Identities are free and patience is free: two colluders that offer the first honest
    replica's own parameters pushed half a training step further along one direction every
    round, with a step of noise so that no single round looks steady, and wait as long as it
    takes. Standing bought with rounds of looking honest let them in after five rounds and carried
    a lone honest replica about two steps along the push in 20 rounds; standing comes only from
    lineage (whose state we loaded), so they are never weighed and every honest replica, alone or
    with an honest partner it loaded from, ends within one honest step of where its own training
    took it along the push."""
    network = MemoryNetwork()
    generator = torch.Generator().manual_seed(7)
    torch.manual_seed(0)
    honest = [make_backend(UID, "ffn", 8, config=EXPERTS) for _ in range(honest_count)]
    colluding = [make_backend(UID, "ffn", 8, config=EXPERTS) for _ in range(2)]
    for backend in honest[1:] + colluding:
        backend.module.load_state_dict(honest[0].module.state_dict())
    origin = flat(honest[0])
    probe = make_backend(UID, "ffn", 8, config=EXPERTS)  # how far a round's training moves it
    probe.module.load_state_dict(honest[0].module.state_dict())
    train(probe, torch.Generator().manual_seed(99))
    step = float((flat(probe) - origin).norm())
    push = torch.randn(origin.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    push = push / push.norm()
    shared: dict[int, torch.Tensor] = {}
    async with AsyncExitStack() as stack:
        members = [await sync_service(stack, network, BackendStore({UID: b})) for b in honest]
        lineage(members)
        members += [
            await sync_service(stack, network, PatientStore({UID: b}, honest[0], origin, push, step, 0.5, shared))
            for b in colluding
        ]
        colluders = {str(host.peer_id) for host, _ in members[honest_count:]}
        honest_drift, outcomes = await sync_rounds(members, honest, generator, LIE)
    for _, sync in members[:honest_count]:  # never weighed in any round: never proven
        assert len([o for who, o in outcomes if who is sync]) == ROUNDS
        assert all(sync.standings.get((UID, peer)) != Standing.PROVEN for peer in colluders)
    for backend in honest:
        moved = float((flat(backend) - origin) @ push)
        assert torch.isfinite(flat(backend)).all() and backend.updates == ROUNDS
        assert abs(moved) < max(step, honest_drift)  # measured: 0.01-0.02 steps (before: 1.9 among three)
