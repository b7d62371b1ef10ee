"""Trainers and replicas: a mixture reads its grid from the swarm file's [[grid]], and spreads an
expert's calls over its replicas by load and latency, never to one that is backed off."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

from volunteer.dht.grid import Declaration
from volunteer.experts import moe as moe_module
from volunteer.experts.moe import LATENCY_MEMORY, RemoteMixtureOfExperts
from volunteer.net.identity import KeyPair
from volunteer.swarmfile import GridSpec


def answered(host: Declaration) -> SimpleNamespace:
    """A call of expert.0.0 that ``host`` answered, as ``_answered`` reads it."""
    return SimpleNamespace(uid="expert.0.0", peer=host.peer)


def mixture() -> RemoteMixtureOfExperts:
    moe = RemoteMixtureOfExperts(None, in_features=4, grid=GridSpec("expert", (3, 5), "ffn", 4, replicas=2))
    moe._random = random.Random(7)
    return moe


def test_the_mixture_takes_its_grid_from_the_swarm_file():
    moe = mixture()
    assert moe.grid_size == (3, 5) and moe.uid_prefix == "expert"
    assert moe.gate.out_features == 8


def test_calls_spread_over_replicas_and_favour_the_idle_and_near():
    moe = mixture()
    a, b, c = (Declaration(KeyPair.generate().peer_id, (), load, 1.0) for load in (0.0, 0.0, 9.0))
    picks = Counter(str(moe._pick_host("expert.0.0", [a, b, c]).peer) for _ in range(600))
    assert picks[str(a.peer)] > picks[str(c.peer)] and picks[str(b.peer)] > picks[str(c.peer)]
    assert picks[str(c.peer)] > 0  # a loaded replica still gets a share

    for _ in range(5):
        moe._answered(answered(a), 1.0)  # a is far: 1 s per call
    moe._answered(answered(b), 0.01)
    picks = Counter(str(moe._pick_host("expert.0.0", [a, b]).peer) for _ in range(600))
    assert picks[str(b.peer)] > 10 * picks[str(a.peer)]


def test_a_replica_measured_slow_is_measured_again_once_its_latency_is_forgotten(monkeypatch):
    # one slow first call (under load) must not starve a replica for good: so picked, it would
    # never be measured again, and a liar measured slow would never be audited again
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(moe_module, "time", SimpleNamespace(monotonic=lambda: clock.now))  # the mixture's clock alone
    moe = mixture()
    a, b = (Declaration(KeyPair.generate().peer_id, (), 0.0, 1.0) for _ in range(2))
    moe._answered(answered(a), 2.0)
    moe._answered(answered(b), 0.002)
    clock.now += LATENCY_MEMORY / 2
    moe._answered(answered(b), 0.002)  # b, called all along, stays measured
    picks = Counter(str(moe._pick_host("expert.0.0", [a, b]).peer) for _ in range(600))
    assert picks[str(a.peer)] <= 3
    clock.now += LATENCY_MEMORY / 2 + 1.0
    picks = Counter(str(moe._pick_host("expert.0.0", [a, b]).peer) for _ in range(600))
    assert picks[str(a.peer)] > 100  # counted as typical: picked as often as b, and measured anew
    moe._answered(answered(a), 0.004)
    assert moe._recent_latency(clock.now)[str(a.peer)] == 0.004  # not averaged with the forgotten 2 s


def test_a_backed_off_replica_is_never_picked():
    moe = mixture()
    a, b = (Declaration(KeyPair.generate().peer_id, (), 0.0, 1.0) for _ in range(2))
    moe._failed_now.add(("expert.0.0", str(a.peer)))
    assert {moe._pick_host("expert.0.0", [a, b]).peer for _ in range(50)} == {b.peer}
    moe._failed_now.add(("expert.0.0", str(b.peer)))
    assert moe._pick_host("expert.0.0", [a, b]) is None
