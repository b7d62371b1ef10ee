"""The grid declaration model (defined beside the swarm file, ``volunteer.swarmfile``, so that
trainers one floor below read it too): what a swarm file's ``[[grid]]`` tables say.

    [[grid]]
    prefix = "expert"
    size = [4, 8]
    expert = "ffn"
    hidden_dim = 1024
    replicas = 2
    sync_period = 30        # optional, seconds

Trainers and volunteers read the same ``GridSpec``s: trainers to address the grid, volunteers to
place themselves on it (``placement.py``) and to sync replicas every ``sync_period``. The expert
class is checked for its form only: a custom class may be registered after the swarm file is read.
"""

from __future__ import annotations

from ..swarmfile import MAX_GRID_EXPERTS, GridSpec, grid_of, parse_grid, parse_grids

__all__ = ["GridSpec", "MAX_GRID_EXPERTS", "grid_of", "parse_grid", "parse_grids"]
