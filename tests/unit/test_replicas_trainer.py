"""Trainers and replicas: a mixture reads its grid from the swarm file's [[grid]], and spreads an
expert's calls over its replicas by load and latency, never to one that is backed off."""

from __future__ import annotations

import random
from collections import Counter

from volunteer.dht.grid import Declaration
from volunteer.experts.moe import RemoteMixtureOfExperts
from volunteer.net.identity import KeyPair
from volunteer.swarmfile import GridSpec


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

    class Answered:
        uid, peer = "expert.0.0", a.peer

    for _ in range(5):
        moe._answered(Answered(), 1.0)  # a is far: 1 s per call
    moe._latency[str(b.peer)] = 0.01
    picks = Counter(str(moe._pick_host("expert.0.0", [a, b]).peer) for _ in range(600))
    assert picks[str(b.peer)] > 10 * picks[str(a.peer)]


def test_a_backed_off_replica_is_never_picked():
    moe = mixture()
    a, b = (Declaration(KeyPair.generate().peer_id, (), 0.0, 1.0) for _ in range(2))
    moe._failed_now.add(("expert.0.0", str(a.peer)))
    assert {moe._pick_host("expert.0.0", [a, b]).peer for _ in range(50)} == {b.peer}
    moe._failed_now.add(("expert.0.0", str(b.peer)))
    assert moe._pick_host("expert.0.0", [a, b]) is None
