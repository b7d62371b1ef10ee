"""Replicated expert state: the swarm's grid, automatic placement, state transfer, replica sync
and hand-off on leave (issue 13). Sits above ``volunteer.experts`` and ``volunteer.dht``.

Every piece is a pure core (no trio, ``now`` passed in) plus, for the protocols, a thin trio
driver that runs as a Host service."""

from .config import DEFAULT_CONFIG, ReplicasConfig
from .errors import (
    GridSpecError,
    ReplicaConfigError,
    ReplicaError,
    StateMismatchError,
    StateProtocolError,
    StateRefusedError,
    SyncError,
)
from .grid import GridSpec, grid_of, parse_grid, parse_grids
from .placement import Placement, capacity, catch_up_source, place

__all__ = [
    "DEFAULT_CONFIG",
    "GridSpec",
    "GridSpecError",
    "Placement",
    "ReplicaConfigError",
    "ReplicaError",
    "ReplicasConfig",
    "StateMismatchError",
    "StateProtocolError",
    "StateRefusedError",
    "SyncError",
    "capacity",
    "catch_up_source",
    "grid_of",
    "parse_grid",
    "parse_grids",
    "place",
]
