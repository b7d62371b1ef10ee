"""Pure views of replicated experts: sync-round alignment, grid coverage and its warnings, hosts
from DHT declarations, `volunteer experts`' coverage from its flat rows, and placement capacity."""

from __future__ import annotations

import pytest

from volunteer.kinds.ours import coverage_of
from volunteer.dht.grid import Declaration
from volunteer.net.identity import KeyPair
from volunteer.replicas import ReplicasConfig
from volunteer.replicas.coverage import coverage, grid_coverage, hosts_of, next_round_at
from volunteer.replicas.manager import placement_capacity
from volunteer.swarmfile import GridSpec

GRID = GridSpec("expert", (2, 2), "ffn", 8, replicas=2)


def test_rounds_open_at_the_next_multiple_of_the_period():
    assert next_round_at(0.0, 30.0) == 30.0
    assert next_round_at(29.9, 30.0) == 30.0
    assert next_round_at(30.0, 30.0) == 60.0  # exactly on a boundary: that round has begun
    assert next_round_at(1_700_000_001.5, 30.0) == 1_700_000_010.0
    # two replicas whose clocks differ by a second open the same round
    assert next_round_at(1_000_005.0, 30.0) == next_round_at(1_000_006.0, 30.0)
    with pytest.raises(ValueError):
        next_round_at(1.0, 0.0)


def test_grid_coverage_counts_hosted_under_replicated_and_unhosted():
    hosts = {"expert.0.0": {"a": 3, "b": 3}, "expert.0.1": {"a": 1}, "elsewhere.0": {"c": 0}}
    row = grid_coverage(GRID, hosts)
    assert row == {
        "prefix": "expert", "size": [2, 2], "total": 4, "hosted": 2, "replicas_target": 2,
        "under_replicated": ["expert.0.1"], "unhosted": ["expert.1.0", "expert.1.1"],
    }


def test_coverage_warns_of_unhosted_experts_and_experts_outside_every_grid():
    view = coverage([GRID], {"expert.0.0": {"a": 1}}, mine=["expert.0.0", "other.3"])
    assert len(view["grids"]) == 1
    assert any("3 of 4 experts have no host" in w for w in view["warnings"])
    assert any("outside every declared grid: other.3" in w for w in view["warnings"])
    # a swarm that declares no grid has nothing to be outside of
    assert coverage([], {}, mine=["other.3"]) == {"grids": [], "warnings": []}


def test_hosts_from_declarations_carry_versions():
    a, b = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    found = {
        "expert.0.0": [Declaration(a, (), 0.0, 1.0, version=7), Declaration(b, (), 0.0, 1.0)],
        "expert.0.1": [],
    }
    assert hosts_of(found) == {"expert.0.0": {str(a): 7, str(b): 0}}


def test_declared_versions_round_trip_and_absent_is_zero():
    from volunteer.dht import DHTConfig

    peer = KeyPair.generate().peer_id
    config = DHTConfig()
    assert Declaration.decode(Declaration(peer, (), 0.5, 2.0, version=42).encode(), config).version == 42
    assert Declaration.decode(Declaration(peer, (), 0.5, 2.0).encode(), config).version == 0


def test_volunteer_experts_coverage_from_flat_rows():
    rows = [
        {"uid": "expert.0.0", "peer_id": "a", "version": 2},
        {"uid": "expert.0.0", "peer_id": "b", "version": 2},
        {"uid": "expert.1.1", "peer_id": "a", "version": 0},
    ]
    view = coverage_of([GRID], rows)
    assert view["grids"][0]["hosted"] == 2
    assert view["grids"][0]["under_replicated"] == ["expert.1.1"]
    assert view["grids"][0]["unhosted"] == ["expert.0.1", "expert.1.0"]


def test_placement_capacity_without_a_gpu():
    config = ReplicasConfig(default_capacity=8)
    assert placement_capacity([GRID], None, config=config) == 8
    assert placement_capacity([GRID], None, max_experts=3, config=config) == 3
