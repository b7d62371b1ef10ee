"""Which experts a hivemind swarm has, for ``volunteer experts`` on a ``kind = "hivemind"`` swarm.

hivemind keeps no record of a whole grid. ``declare_experts`` stores each uid as a key
(``ffn.1.2.3`` → peer id) and, for every prefix of it but the first, a dictionary whose sub-key is
the next coordinate and whose value is one uid below it with its host: ``ffn.1.2.`` gets
``{3: ("ffn.1.2.3", peer)}`` and ``ffn.1.`` gets ``{2: ("ffn.1.2.3", peer)}`` (the last declarer
of a coordinate wins, so a prefix names one uid per child). A one-dimensional uid ``ffn.3`` gets
the prefix ``ffn.3.`` with hivemind's flat-expert coordinate -1.

So the listing walks the grid level by level. The first level is not stored anywhere
(``ffn.`` holds nothing): it is probed, ``ffn.i`` and ``ffn.i.`` for ``i`` in batches of
``BATCH``, until a batch where nothing answered (``MAX_INDEX`` indices at most). Below it every
prefix record names its children: a child whose sample uid is the child itself is a row; one
whose sample uid lies deeper is a prefix to read next. Bounded in count (``MAX_PREFIXES`` prefix
records below the first level, uids of ``MAX_DEPTH`` coordinates) and in time (``timeout``): a walk cut short
returns what it found, and says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import trio

from ..errors import PeerIDError
from ..net.identity import PeerID
from .dht import HivemindDHT
from .serializer import DictionaryValue, ValueWithExpiration

BATCH = 32
MAX_INDEX = 1024
MAX_PREFIXES = 4096
MAX_DEPTH = 8
FLAT_EXPERT = -1
DELIMITER = "."


def _peer(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        return str(PeerID.from_string(value))
    except (PeerIDError, ValueError):
        return None


def row(uid: str, peer: str, expiration: float, now: float) -> dict:
    """One row of ``volunteer experts`` for a hivemind expert: what hivemind does not declare
    (addresses, load, heartbeat) is None, shown "–"."""
    return {
        "uid": uid, "peer_id": peer, "reached": None, "addrs": None, "load": None, "heartbeat_age_s": None,
        "expires_in_s": round(expiration - now, 1),
    }


@dataclass
class Expansion:
    """What one record says: expert rows, and the prefixes one level down to read next."""

    rows: list[dict] = field(default_factory=list)
    children: list[str] = field(default_factory=list)


def expand(key: str, found: ValueWithExpiration, now: float) -> Expansion:
    """Read one record of a hivemind grid (sans-I/O). ``key`` is a uid (its value: a peer id) or a
    prefix ending in "." (its value: ``{coordinate: (uid, peer id)}``). Entries that do not fit the
    prefix they are under (a uid elsewhere, a non-integer coordinate) are ignored."""
    out = Expansion()
    value = found.value
    if not isinstance(value, DictionaryValue):
        peer = _peer(value)
        if peer is not None and not key.endswith(DELIMITER):
            out.rows.append(row(key, peer, found.expiration_time, now))
        return out
    if not key.endswith(DELIMITER):
        return out
    for coordinate, item in value.items.items():
        entry = item.value
        if not isinstance(coordinate, int) or isinstance(coordinate, bool):
            continue
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str)):
            continue
        uid, peer = entry[0], _peer(entry[1])
        if peer is None:
            continue
        if coordinate == FLAT_EXPERT:
            if uid == key[:-1]:
                out.rows.append(row(uid, peer, item.expiration_time, now))
            continue
        child = f"{key}{coordinate}"
        if uid == child:
            out.rows.append(row(uid, peer, item.expiration_time, now))
        elif uid.startswith(child + DELIMITER):
            # a sample of the subgrid below ``child``: a true row, and a prefix to read for the rest
            out.rows.append(row(uid, peer, item.expiration_time, now))
            out.children.append(child + DELIMITER)
    return out


@dataclass
class Listing:
    """A walk's rows (sorted by uid, one per (uid, host)) and, when it was cut short, why."""

    rows: list[dict]
    cut: str | None = None


class _Walk:
    def __init__(self, dht: HivemindDHT, stem: str, max_prefixes: int, max_depth: int) -> None:
        self.dht = dht
        self.stem = stem
        self.max_prefixes = max_prefixes
        self.max_depth = max_depth
        self.rows: dict[tuple[str, str], dict] = {}
        self.seen: set[str] = set()
        self.cut: str | None = None

    async def read(self, key: str, children: list[str]) -> int:
        """Fetch ``key``; keep its rows, queue its child prefixes; how many rows it gave."""
        found = await self.dht.get(key)
        if found is None:
            return 0
        expansion = expand(key, found, self.dht.clock())
        for entry in expansion.rows:
            self.rows[entry["uid"], entry["peer_id"]] = entry
        children.extend(expansion.children)
        return len(expansion.rows)

    async def first_level(self, children: list[str]) -> None:
        for start in range(0, MAX_INDEX, BATCH):
            hits = 0

            async def probe(key: str) -> None:
                nonlocal hits
                hits += await self.read(key, children)

            async with trio.open_nursery() as nursery:
                for index in range(start, start + BATCH):
                    for key in (f"{self.stem}{index}", f"{self.stem}{index}{DELIMITER}"):
                        self.seen.add(key)
                        nursery.start_soon(probe, key)
            if not hits:
                return
        self.cut = f"first level probed up to index {MAX_INDEX}"

    async def deeper(self, level: list[str]) -> None:
        depth = 2  # the first level's prefix records name uids' second coordinates
        fetched = 0
        while level:
            depth += 1
            if depth > self.max_depth:
                self.cut = f"grid deeper than {self.max_depth} coordinates"
                return
            fresh = sorted({prefix for prefix in level if prefix not in self.seen})
            if fetched + len(fresh) > self.max_prefixes:
                fresh = fresh[: self.max_prefixes - fetched]
                self.cut = f"more than {self.max_prefixes} prefix records"
            next_level: list[str] = []
            for start in range(0, len(fresh), BATCH):
                async with trio.open_nursery() as nursery:
                    for prefix in fresh[start : start + BATCH]:
                        self.seen.add(prefix)
                        nursery.start_soon(self.read, prefix, next_level)
            fetched += len(fresh)
            if self.cut is not None:
                return
            level = next_level


async def walk_hivemind_grid(
    dht: HivemindDHT,
    prefix: str,
    *,
    timeout: float = math.inf,
    max_prefixes: int = MAX_PREFIXES,
    max_depth: int = MAX_DEPTH,
) -> Listing:
    """Every live expert under ``prefix`` (``ffn.``), walked level by level (see the module
    docstring); past ``timeout`` seconds or a count bound, what was found so far and why it stopped."""
    stem = prefix if prefix.endswith(DELIMITER) else prefix + DELIMITER
    walk = _Walk(dht, stem, max_prefixes, max_depth)
    with trio.move_on_after(timeout) as scope:
        children: list[str] = []
        await walk.first_level(children)
        if walk.cut is None:
            await walk.deeper(children)
    if scope.cancelled_caught:
        walk.cut = f"listing took over {timeout:g} s"
    return Listing([walk.rows[key] for key in sorted(walk.rows)], walk.cut)


async def list_hivemind_experts(dht: HivemindDHT, prefix: str, *, timeout: float = math.inf) -> list[dict]:
    """Rows of the live experts under ``prefix`` (``ffn.``), sorted by uid, one per (uid, host)."""
    return (await walk_hivemind_grid(dht, prefix, timeout=timeout)).rows


__all__ = [
    "BATCH", "Expansion", "Listing", "MAX_DEPTH", "MAX_INDEX", "MAX_PREFIXES", "expand", "list_hivemind_experts",
    "row", "walk_hivemind_grid",
]
