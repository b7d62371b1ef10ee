"""Replicated expert state: the swarm's grid, automatic placement, state transfer, replica sync
and hand-off on leave. Sits above ``volunteer.experts`` and ``volunteer.dht``.

Every piece is a pure core (no trio, ``now`` passed in) plus, for the protocols, a thin trio
driver that runs as a Host service."""

from .aggregate import Aggregate, mean
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
from .handoff import HandOff, HandOffPlan, HandOffResult, hand_off, plan_handoff
from .messages import StateHeader, sync_protocol, state_protocol
from .placement import Placement, capacity, catch_up_source, place
from .state import ExportedState, export_state, import_state
from .store import BackendStore
from .sync import SyncOutcome, SyncRound
from .syncdriver import ReplicaSync
from .transfer import StateService, catch_up, fetch_state, push_state

__all__ = [
    "Aggregate",
    "BackendStore",
    "DEFAULT_CONFIG",
    "ExportedState",
    "HandOff",
    "HandOffPlan",
    "HandOffResult",
    "ReplicaSync",
    "StateHeader",
    "StateService",
    "SyncOutcome",
    "SyncRound",
    "catch_up",
    "export_state",
    "fetch_state",
    "hand_off",
    "import_state",
    "mean",
    "plan_handoff",
    "push_state",
    "state_protocol",
    "sync_protocol",
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
