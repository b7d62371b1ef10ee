"""The trainer's checks ride the expert directory, whatever the swarm's kind: a mixture over a
scripted ``ExpertDirectory`` (no DHT, no wire; what another kind would bring) guards every reply,
audits calls against the directory's other hosts and excludes a liar, with the guard and trust
ledger the ``TrainerSwarm`` carries beside its directory."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import trio
from torch import nn

from volunteer.experts.moe import RemoteMixtureOfExperts
from volunteer.experts.callstats import CallStats
from volunteer.experts.guard import ReplyGuard
from volunteer.experts.loop import BackgroundLoop
from volunteer.experts.trust import Standing, TrustLedger, TrustPolicy
from volunteer.dht.vouches import VouchBook
from volunteer.net.identity import KeyPair

FEATURES = 8
GRID = (2,)
# every call of an untrusted host audited: the liar meets an audit in its first calls
EAGER = TrustPolicy(untrusted_rate=1.0, suspect_rate=1.0, audit_rate=1.0)


@dataclass(frozen=True)
class ScriptedHost:
    """One host as ``find_grid`` lists it (``ExpertHost``): no addresses to remember."""

    peer: object
    addrs: tuple = ()
    load: float = 0.0
    synced_age: float | None = 1.0


class ScriptedDirectory:
    """An ``ExpertDirectory`` whose hosts compute ``tanh(x) * factor`` (1: honest) for every uid
    of a 1-d grid; it counts the forwards each host got."""

    def __init__(self, factors: list[float]) -> None:
        self.hosts = [ScriptedHost(KeyPair.generate().peer_id) for _ in factors]
        self.factor = {str(h.peer): f for h, f in zip(self.hosts, factors)}
        self.forwards = {str(h.peer): 0 for h in self.hosts}

    async def find_grid(self, uid_prefix, grid_size):
        return {f"{uid_prefix}.{i}": list(self.hosts) for i in range(grid_size[0])}

    async def call_expert(self, peer, uid, op, tensors=(), *, n_inputs=None, compression="none", timeout=0.0,
                          faults=None, backward_follows=False, kept=None, report=None):
        # keeps no inputs between calls: a backward always carries them (``kept`` stays unused)
        factor = self.factor[str(peer)]
        if op == "forward":
            self.forwards[str(peer)] += 1
            return [torch.tanh(tensors[0]) * factor]
        inputs, grads = tensors[:n_inputs], tensors[n_inputs:]
        return [grads[0] * (1 - torch.tanh(inputs[0]) ** 2) * factor]


class ScriptedSwarm:
    """A ``TrainerSwarm``: a trio loop, the scripted directory and this trainer's guard."""

    def __init__(self, directory: ScriptedDirectory, policy: TrustPolicy) -> None:
        self.loop = BackgroundLoop().start()
        self.host = _NoConnections()  # no host is dialled: the hosts declare no addresses
        self.directory = directory
        self.swarm_id = "scripted"
        self.faults = None
        self.guard = ReplyGuard(TrustLedger(policy))
        self.calls = CallStats()
        self.vouches = VouchBook(KeyPair.generate(), "scripted", 0.0)

    def publish_proof(self, proof) -> None:
        """Proofs are the scripted hosts' (no receipts here): nothing to publish."""


class _NoConnections:
    """The trainer's Host as the call records see it: no connection to measure a path or RTT on,
    and no address known of any host (the scripted hosts declare none)."""

    def __init__(self) -> None:
        self.peerstore = _NoAddresses()

    def connection_to(self, peer):
        return None


class _NoAddresses:
    def addrs(self, peer):
        return []

    def remember_addrs(self, peer, addrs):
        pass


def train(factors: list[float], steps: int, policy: TrustPolicy = EAGER, until=None):
    """``steps`` training steps (fewer once ``until(moe)`` holds after one)."""
    directory = ScriptedDirectory(factors)
    swarm = ScriptedSwarm(directory, policy)
    try:
        moe = RemoteMixtureOfExperts(swarm, in_features=FEATURES, grid_size=GRID, k_best=2, uid_prefix="ffn")
        head = nn.Linear(FEATURES, 1)
        optimizer = torch.optim.SGD([*moe.parameters(), *head.parameters()], lr=0.05)
        generator = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(steps):
            x = torch.randn(16, FEATURES, generator=generator)
            loss = (head(moe(x)).squeeze(-1) - x.sum(-1).tanh()).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if until is not None and until(moe):
                break
        swarm.loop.run(_settle, moe)
        return directory, moe, losses
    finally:
        swarm.loop.stop()


async def _settle(moe: RemoteMixtureOfExperts) -> None:
    with trio.fail_after(10):
        while moe._auditor.pending:
            await trio.sleep(0.01)


@pytest.mark.slow
def test_a_liar_behind_any_directory_is_audited_outvoted_and_excluded():
    # excluded once outvoted on two of the grid's experts: trained until then, its forwards bounded below
    directory, moe, losses = train([1.0, 1.0, 10.0], steps=200, until=lambda moe: moe.stats["exclusions"] > 0)
    *honest, liar = [str(h.peer) for h in directory.hosts]
    assert moe.trust.peer_standing(liar) is Standing.EXCLUDED, moe.trust.report()
    assert not any(moe.trust.excluded(peer) for peer in honest)
    assert moe.stats["audits"] > 0 and moe.stats["disagreements"] > 0 and moe.stats["exclusions"] == 1
    assert directory.forwards[liar] <= 200
    assert all(math.isfinite(loss) for loss in losses)


@pytest.mark.slow
def test_a_nan_reply_from_any_directory_never_reaches_autograd():
    directory, moe, losses = train([1.0, float("nan")], steps=10, policy=TrustPolicy())
    liar = str(directory.hosts[1].peer)
    # caught by the guard on a reply of its own or as an audit's second replica: excluded either way
    assert moe.trust.excluded(liar) and moe.stats["exclusions"] == 1, (moe.stats, moe.trust.report())
    assert "non-finite" in (moe.trust.exclusion_reason(liar) or ""), moe.trust.exclusion_reason(liar)
    assert all(math.isfinite(loss) for loss in losses), losses
    assert all(bool(torch.isfinite(p).all()) for p in moe.parameters())
