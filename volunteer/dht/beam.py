"""Grid beam search (after Learning@home / hivemind's MoEBeamSearcher): the ``beam_size`` best
live experts of a grid for a trainer's gating scores.

It walks the grid left to right: the best active first indices (fetched in score order), then
for each further dimension the best ``beam_size`` extensions of the beam among the children the
hosts declared (prefix records, ``grid.Declaration``). ``BeamSearch`` is sans-I/O: ``wanted()``
names the keys to fetch (batch them into FIND_VALUE lookups), ``feed()`` takes what was found;
``find_best_experts`` drives it over a running DHTNode.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from ..errors import ExpertUIDError
from .config import MAX_GRID_DEPTH, DHTConfig
from .grid import BEAM_QUORUM, DELIMITER, GRID_PREFETCH_KEYS, Declaration, Found, expert_key, parse_prefix, parse_uid, select_alive

if TYPE_CHECKING:
    from .node import DHTNode


@dataclass(frozen=True)
class ExpertMatch:
    """A live expert found by beam search: its uid, grid score and hosts (best first)."""

    uid: str
    score: float
    hosts: tuple[Declaration, ...]


@dataclass
class _Entry:
    score: float
    prefix: str  # e.g. "ffn.3." (ends with the delimiter)
    children: dict[int, list[tuple[str, Declaration]]]


class BeamSearch:
    """Find the ``beam_size`` best live experts of a grid, one batch of DHT keys at a time.

    ``grid_scores[d][i]`` scores index ``i`` along dimension ``d`` (higher is better); an expert's
    score is the sum over its indices. Drive it with::

        while keys := search.wanted():
            search.feed({key: records found for key}, now)
        search.result()
    """

    def __init__(
        self,
        prefix: str,
        grid_scores: Sequence[Sequence[float]],
        beam_size: int,
        now: float,
        config: DHTConfig | None = None,
    ) -> None:
        self.name = prefix.rstrip(DELIMITER)
        parse_prefix(self.name + DELIMITER)
        if not 1 <= len(grid_scores) <= MAX_GRID_DEPTH or beam_size < 1:
            raise ExpertUIDError("grid_scores needs 1..MAX_GRID_DEPTH dimensions and beam_size >= 1")
        self.scores = [[float(s) for s in dim] for dim in grid_scores]
        self.depth = len(self.scores)
        self.beam_size = beam_size
        self.config = config or DHTConfig()
        self.now = now
        self.rounds = 0  # batches fed, for tests and metrics
        self._beam: list[_Entry] = []
        self._found: dict[str, tuple[float, list[Declaration]]] = {}
        # dimension 0 candidates, best last so pop() takes the best
        self._untried = sorted(range(len(self.scores[0])), key=lambda i: (self.scores[0][i], -i))
        self._dim = 0  # dimension whose children the pending keys will reveal
        self._pending: list[tuple[float, str]] = []
        self.done = False
        self._plan_initial()

    # --- driver API ------------------------------------------------------------------------------
    def wanted(self) -> list[str]:
        """Keys (uids or grid prefixes) to fetch next; empty when the search is over."""
        return [] if self.done else [key for _, key in self._pending]

    def feed(self, found: Mapping[str, Found], now: float) -> None:
        """Records found for the keys of the last ``wanted()`` (missing keys count as empty)."""
        if self.done:
            return
        self.now = now
        self.rounds += 1
        pending, self._pending = self._pending, []
        if self.depth == 1:
            for score, uid in pending:
                hosts = select_alive(found.get(uid, ()), now, self.config)
                if hosts:
                    self._add_expert(uid, score, hosts)
            if len(self._found) >= self.beam_size or not self._untried:
                self.done = True
            else:
                self._plan_initial()
            return
        beam = []
        for score, prefix in pending:
            children = self._children(prefix, found.get(prefix, ()), now)
            if children:
                beam.append(_Entry(score, prefix, children))
        if self._dim == 1:  # still forming the initial beam from dimension-0 prefixes
            self._beam.extend(beam)
            self._beam.sort(key=lambda e: -e.score)
            del self._beam[self.beam_size :]
            if len(self._beam) < self.beam_size and self._untried:
                self._plan_initial()
                return
        else:
            self._beam = beam
        self._advance()

    def result(self) -> list[ExpertMatch]:
        """The best experts found, best first (at most ``beam_size``)."""
        best = heapq.nlargest(self.beam_size, self._found.items(), key=lambda kv: (kv[1][0], kv[0]))
        return [ExpertMatch(uid, score, tuple(hosts)) for uid, (score, hosts) in best]

    def first_dimension_keys(self) -> list[str]:
        """Every key the search could ask for along the first dimension (``name.i.``, or the uids
        ``name.i`` of a one-dimensional grid): what a driver may prefetch."""
        suffix = "" if self.depth == 1 else DELIMITER
        return [f"{self.name}.{i}{suffix}" for i in range(len(self.scores[0]))]

    # --- steps -------------------------------------------------------------------------------------
    def _plan_initial(self) -> None:
        # next batch of dimension-0 candidates in score order (hivemind's initial beam)
        batch: list[tuple[float, str]] = []
        while self._untried and len(batch) < self.beam_size:
            i = self._untried.pop()
            key = f"{self.name}.{i}" if self.depth == 1 else f"{self.name}.{i}."
            batch.append((self.scores[0][i], key))
        self._pending = batch
        self._dim = 1
        if not batch:
            self.done = True

    def _advance(self) -> None:
        # every child listed in the beam may already name a full uid: score those exactly
        for entry in self._beam:
            for coord, pairs in entry.children.items():
                for uid, decl in pairs:
                    score = self._score(uid)
                    if score is not None:
                        self._add_expert(uid, score, [decl.for_child(coord)])
        if not self._beam or self._dim >= self.depth - 1:
            self.done = True  # the last dimension's children were full uids, now scored
            return
        dim = self.scores[self._dim]
        extensions = (
            (entry.score + dim[c], f"{entry.prefix}{c}{DELIMITER}") for entry in self._beam for c in entry.children
        )
        self._pending = heapq.nlargest(self.beam_size, extensions)
        self._dim += 1
        if not self._pending:
            self.done = True

    def _children(self, prefix: str, found: Found, now: float) -> dict[int, list[tuple[str, Declaration]]]:
        # union of the children every live host lists under this prefix, checked against the grid
        level = prefix.count(DELIMITER) - 1  # indices in the prefix
        width = len(self.scores[level])
        children: dict[int, list[tuple[str, Declaration]]] = {}
        for decl in select_alive(found, now, self.config):
            for coord, uid in decl.children:
                if not 0 <= coord < width or not uid.startswith(f"{prefix}{coord}"):
                    continue
                rest = uid[len(prefix) + len(str(coord)) :]
                if rest and not rest.startswith(DELIMITER):
                    continue  # "ffn.3.50" is not below index 5
                children.setdefault(coord, []).append((uid, decl))
        return children

    def _score(self, uid: str) -> float | None:
        try:
            name, coords = parse_uid(uid)
        except ExpertUIDError:
            return None
        if name != self.name or len(coords) != self.depth:
            return None
        if any(c >= len(dim) for c, dim in zip(coords, self.scores)):
            return None
        return sum(dim[c] for c, dim in zip(coords, self.scores))

    def _add_expert(self, uid: str, score: float, hosts: list[Declaration]) -> None:
        known = self._found.get(uid)
        if known is None:
            self._found[uid] = (score, list(hosts))
            return
        peers = {d.peer for d in known[1]}
        known[1].extend(d for d in hosts if d.peer not in peers)
        stale_before = self.now - self.config.heartbeat_stale
        known[1].sort(key=lambda d: (d.heartbeat < stale_before, d.load, -d.heartbeat))


async def find_best_experts(
    dht: DHTNode,
    prefix: str,
    grid_scores: Sequence[Sequence[float]],
    beam_size: int,
    *,
    max_age: float | None = None,
) -> list[ExpertMatch]:
    """Beam search over a grid of experts (Learning@home): the ``beam_size`` best live experts.

    Grid lookups are reused for ``max_age`` seconds (default ``DHTConfig.expert_cache_age``; 0
    asks the network every time): a trainer searches every step and the grid changes at the
    pace of heartbeats. Staleness is bounded where it matters: a leaver's tombstones are
    forwarded to this node by the holders it read from before its withdrawal returns (the
    cached keys are dropped), a crashed host's declarations expire in the cache as anywhere,
    and a new host shows up within ``max_age``. On a miss along the first dimension, every
    uncached first-dimension key of the grid is fetched in the same round when there are at most
    ``GRID_PREFETCH_KEYS`` of them (one FIND_VALUE per peer): the next searches, whatever their
    scores, are then answered from the cache.
    """
    max_age = dht.config.expert_cache_age if max_age is None else max_age
    search = BeamSearch(prefix, grid_scores, beam_size, dht.clock(), dht.config)
    first = set(search.first_dimension_keys()) if max_age > 0 and len(search.scores[0]) <= GRID_PREFETCH_KEYS else set()
    while keys := search.wanted():
        fetch = [expert_key(k) for k in keys]
        if first and first.issuperset(keys):
            now = dht.clock()
            cold = [key for key in map(expert_key, sorted(first)) if dht.recent_values.get(key, now, max_age) is None]
            if cold:
                fetch = list(dict.fromkeys(fetch + cold))
        found = await dht.get_many(fetch, quorum=BEAM_QUORUM, max_age=max_age)
        search.feed({k: found[expert_key(k)] for k in keys}, dht.clock())
    return search.result()


__all__ = ["BeamSearch", "ExpertMatch", "find_best_experts"]
