"""The grid declaration model: what a swarm file's ``[[grid]]`` tables say.

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

import itertools
import math
import re
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from ..dht.config import MAX_GRID_DEPTH, MAX_GRID_INDEX, MAX_UID_LENGTH
from ..dht.grid import DELIMITER, parse_uid
from .config import DEFAULT_CONFIG
from .errors import GridSpecError

MAX_GRID_EXPERTS = 1 << 16  # uids in one grid: placement enumerates them every re-check
MAX_REPLICAS = 64
MAX_GRIDS = 64
_PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CLASS = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_KEYS = ("prefix", "size", "expert", "hidden_dim", "replicas", "sync_period")


@dataclass(frozen=True)
class GridSpec:
    """One grid of experts the swarm keeps: ``prefix.i.j`` for every index below ``size``, each of
    class ``expert_class`` and width ``hidden_dim``, held by ``replicas`` volunteers that average
    their parameters every ``sync_period`` seconds."""

    prefix: str
    size: tuple[int, ...]
    expert_class: str
    hidden_dim: int
    replicas: int = 1
    sync_period: float = DEFAULT_CONFIG.sync_period

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", tuple(self.size))
        if not isinstance(self.prefix, str) or not _PREFIX.match(self.prefix):
            raise GridSpecError(f"grid prefix {self.prefix!r}: use 1-64 letters, digits, '_' or '-'")
        if not 1 <= len(self.size) <= MAX_GRID_DEPTH:
            raise GridSpecError(f"grid {self.prefix!r}: size needs 1 to {MAX_GRID_DEPTH} dimensions")
        if not all(type(n) is int and 1 <= n <= MAX_GRID_INDEX for n in self.size):
            raise GridSpecError(f"grid {self.prefix!r}: every size must be an integer in 1..{MAX_GRID_INDEX}")
        if math.prod(self.size) > MAX_GRID_EXPERTS:
            raise GridSpecError(f"grid {self.prefix!r} has {math.prod(self.size)} experts; the limit is {MAX_GRID_EXPERTS}")
        longest = DELIMITER.join([self.prefix, *(str(n - 1) for n in self.size)])
        if len(longest) > MAX_UID_LENGTH:
            raise GridSpecError(f"grid {self.prefix!r}: its uids would exceed {MAX_UID_LENGTH} characters")
        if not isinstance(self.expert_class, str) or not _CLASS.match(self.expert_class):
            raise GridSpecError(f"grid {self.prefix!r}: expert class {self.expert_class!r} is not a class name")
        if type(self.hidden_dim) is not int or self.hidden_dim < 1:
            raise GridSpecError(f"grid {self.prefix!r}: hidden_dim must be a positive integer")
        if type(self.replicas) is not int or not 1 <= self.replicas <= MAX_REPLICAS:
            raise GridSpecError(f"grid {self.prefix!r}: replicas must be an integer in 1..{MAX_REPLICAS}")
        period = self.sync_period
        if isinstance(period, bool) or not isinstance(period, (int, float)) or not 0 < period < math.inf:
            raise GridSpecError(f"grid {self.prefix!r}: sync_period must be a positive number of seconds")
        object.__setattr__(self, "sync_period", float(period))

    @property
    def count(self) -> int:
        """Number of experts in the grid."""
        return math.prod(self.size)

    def uids(self) -> Iterator[str]:
        """Every uid of the grid, in index order: ``expert.0.0``, ``expert.0.1``, …"""
        for coords in itertools.product(*(range(n) for n in self.size)):
            yield DELIMITER.join([self.prefix, *map(str, coords)])

    def contains(self, uid: str) -> bool:
        """Whether ``uid`` is one of this grid's experts."""
        try:
            prefix, coords = parse_uid(uid)
        except ValueError:
            return False
        return prefix == self.prefix and len(coords) == len(self.size) and all(
            c < n for c, n in zip(coords, self.size)
        )


def parse_grid(table: object, where: str = "[[grid]]") -> GridSpec:
    """A GridSpec from one ``[[grid]]`` table as ``tomllib`` returns it; GridSpecError names
    ``where`` (the file and table number) and the offending key."""
    if not isinstance(table, Mapping):
        raise GridSpecError(f"{where} must be a table")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise GridSpecError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
    missing = [key for key in _KEYS[:4] if key not in table]
    if missing:
        raise GridSpecError(f"{where}: missing {missing[0]!r}")
    size = table["size"]
    if isinstance(size, int) and not isinstance(size, bool):
        size = [size]
    if not isinstance(size, (list, tuple)):
        raise GridSpecError(f"{where}: size must be a list of integers, e.g. [4, 8]")
    try:
        return GridSpec(
            prefix=table["prefix"],
            size=tuple(size),
            expert_class=table["expert"],
            hidden_dim=table["hidden_dim"],
            replicas=table.get("replicas", 1),
            sync_period=table.get("sync_period", DEFAULT_CONFIG.sync_period),
        )
    except GridSpecError as exc:
        raise GridSpecError(f"{where}: {exc}") from None


def parse_grids(tables: object, where: str = "swarm file") -> list[GridSpec]:
    """Every ``[[grid]]`` table of a swarm file (the value of its ``grid`` key); prefixes must be
    distinct, since a uid names one expert of one grid."""
    if not isinstance(tables, Sequence) or isinstance(tables, (str, bytes)):
        raise GridSpecError(f"{where}: grid must be an array of tables ([[grid]])")
    if len(tables) > MAX_GRIDS:
        raise GridSpecError(f"{where}: {len(tables)} grids; the limit is {MAX_GRIDS}")
    grids = [parse_grid(table, f"{where} [[grid]] #{n + 1}") for n, table in enumerate(tables)]
    seen: set[str] = set()
    for grid in grids:
        if grid.prefix in seen:
            raise GridSpecError(f"{where}: two grids share the prefix {grid.prefix!r}")
        seen.add(grid.prefix)
    return grids


def grid_of(uid: str, grids: Sequence[GridSpec]) -> GridSpec | None:
    """The grid ``uid`` belongs to, or None (an expert outside every declared grid)."""
    for grid in grids:
        if grid.contains(uid):
            return grid
    return None


__all__ = ["GridSpec", "MAX_GRID_EXPERTS", "grid_of", "parse_grid", "parse_grids"]
