"""The ``[[grid]]`` model: parsing a swarm file's tables, validation, uid enumeration."""

from __future__ import annotations

import tomllib

import pytest

from volunteer.replicas.errors import GridSpecError
from volunteer.replicas.grid import GridSpec, grid_of, parse_grid, parse_grids

SWARM = """
[[grid]]
prefix = "expert"
size = [4, 8]
expert = "ffn"
hidden_dim = 1024
replicas = 2

[[grid]]
prefix = "attn"
size = [3]
expert = "transformer"
hidden_dim = 64
sync_period = 5
"""


def test_parses_the_issue_example_with_defaults():
    grids = parse_grids(tomllib.loads(SWARM)["grid"])
    assert grids[0] == GridSpec("expert", (4, 8), "ffn", 1024, replicas=2, sync_period=30.0)
    assert grids[1].replicas == 1 and grids[1].sync_period == 5.0 and grids[1].size == (3,)


def test_uids_enumerate_the_grid_in_index_order():
    grid = GridSpec("expert", (2, 3), "ffn", 8)
    assert list(grid.uids()) == ["expert.0.0", "expert.0.1", "expert.0.2", "expert.1.0", "expert.1.1", "expert.1.2"]
    assert grid.count == 6


def test_contains_and_grid_of():
    grids = [GridSpec("expert", (2, 3), "ffn", 8), GridSpec("attn", (4,), "ffn", 8)]
    assert grid_of("expert.1.2", grids) is grids[0]
    assert grid_of("attn.3", grids) is grids[1]
    for outside in ("expert.2.0", "expert.1", "expert.1.2.0", "attn.4", "other.0", "not a uid"):
        assert grid_of(outside, grids) is None


def test_a_single_integer_size_is_one_dimension():
    assert parse_grid({"prefix": "e", "size": 5, "expert": "ffn", "hidden_dim": 4}).size == (5,)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"prefix": "bad.prefix"}, "prefix"),
        ({"prefix": ""}, "prefix"),
        ({"size": []}, "dimensions"),
        ({"size": [4, 0]}, "size"),
        ({"size": [4, True]}, "size"),
        ({"size": "4x8"}, "size"),
        ({"size": [1 << 10, 1 << 10]}, "limit"),
        ({"expert": "f f n"}, "class"),
        ({"hidden_dim": 0}, "hidden_dim"),
        ({"hidden_dim": 1.5}, "hidden_dim"),
        ({"replicas": 0}, "replicas"),
        ({"replicas": True}, "replicas"),
        ({"sync_period": 0}, "sync_period"),
        ({"sync_period": "30"}, "sync_period"),
        ({"sync_period": float("inf")}, "sync_period"),
        ({"colour": "red"}, "unknown key 'colour'"),
    ],
)
def test_bad_tables_name_the_problem(change, words):
    table = {"prefix": "expert", "size": [4, 8], "expert": "ffn", "hidden_dim": 16} | change
    with pytest.raises(GridSpecError, match=words) as info:
        parse_grid(table, "swarm.toml [[grid]] #1")
    assert "swarm.toml [[grid]] #1" in str(info.value)


def test_missing_keys_and_non_tables():
    with pytest.raises(GridSpecError, match="missing 'hidden_dim'"):
        parse_grid({"prefix": "e", "size": [2], "expert": "ffn"})
    with pytest.raises(GridSpecError, match="table"):
        parse_grid(["not", "a", "table"])
    with pytest.raises(GridSpecError, match="array of tables"):
        parse_grids({"prefix": "e"})


def test_duplicate_prefixes_are_refused():
    table = {"prefix": "e", "size": [2], "expert": "ffn", "hidden_dim": 4}
    with pytest.raises(GridSpecError, match="share the prefix"):
        parse_grids([table, dict(table, size=[3])])
