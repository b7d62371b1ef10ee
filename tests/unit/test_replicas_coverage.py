"""Pure views of replicated experts: sync-round alignment, grid coverage and its warnings, hosts
from DHT declarations, `volunteer experts`' coverage from its flat rows, and placement capacity."""

from __future__ import annotations

import pytest

from volunteer.cli.expertscmd import experts_table
from volunteer.kinds import ExpertListing
from volunteer.kinds.ours import COLUMNS, coverage_of, mark_claims
from volunteer.dht.grid import Declaration
from volunteer.net.identity import KeyPair
from volunteer.replicas import ReplicasConfig
from volunteer.replicas.coverage import claim_standings, coverage, grid_coverage, hosts_of, next_round_at
from volunteer.replicas.providers import placement_capacity
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


def test_claim_standings_mark_a_version_far_above_the_others_suspect():
    hosts = {
        "expert.0.0": {"honest-a": 40, "honest-b": 42, "liar": 10**9},
        "expert.0.1": {"only": 10**9},
        "expert.1.0": {"a": 7, "b": 9},
    }
    standings = claim_standings(hosts, factor=2.0, margin=1000)
    assert standings["expert.0.0"] == {"honest-a": "plausible", "honest-b": "plausible", "liar": "suspect"}
    assert standings["expert.0.1"] == {"only": "sole"}  # nothing to compare a sole claim with
    assert standings["expert.1.0"] == {"a": "plausible", "b": "plausible"}


def test_volunteer_experts_rows_carry_each_replicas_claim_standing():
    rows = [
        {"uid": "expert.0.0", "peer_id": "a", "version": 5},
        {"uid": "expert.0.0", "peer_id": "b", "version": 6},
        {"uid": "expert.0.0", "peer_id": "liar", "version": 10**9},
        {"uid": "expert.1.1", "peer_id": "a", "version": 0},
    ]
    mark_claims(rows)
    assert [row["claim"] for row in rows] == ["plausible", "plausible", "suspect", "sole"]
    listing = ExpertListing(rows, "swarm 't'", COLUMNS)
    table = experts_table(listing)
    claim_cells = list(table.columns[COLUMNS.index("claim")].cells)
    assert claim_cells == ["plausible", "plausible", "suspect", "sole"]
