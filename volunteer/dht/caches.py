"""What a DHT node remembers between lookups, and where one ``store_many`` sends its records (pure).

``RecentValues``: a key's last lookup result, for ``get_many(max_age=...)`` (a trainer's beam search
asks for the same grid prefixes every step). ``ClosestPeers``: a key's closest peers from its last
lookup, so heartbeats re-declare to the same peers without a lookup each time. ``StorePlan``: the
fan-out of one ``store_many``: the closest peers known now, then the closer ones a lookup finds,
each record sent to each peer at most once, all records bound for a peer in one STORE.

No clocks: every call takes ``now``; the driver (``node.py``) reads it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Mapping, Sequence

from ..net.identity import PeerID
from .records import Record
from .routing import Contact

MAX_RECENT_VALUES = 4096  # keys whose last lookup result is kept for get_many(max_age=...)
PEER_CACHE_AGE = 30.0  # declarations reuse the closest peers of a key this long
MAX_PEER_CACHE_KEYS = 10_000  # keys whose closest peers are remembered


class RecentValues:
    """The live records each key's last lookup returned, oldest lookups forgotten first.

    ``generation`` counts ``forget`` calls: a lookup notes it when it starts and passes it to
    ``put``, which keeps nothing if anything was forgotten meanwhile (a tombstone that arrived
    while the lookup was out must not be papered over by the older answer it brings back)."""

    def __init__(self, max_keys: int = MAX_RECENT_VALUES) -> None:
        self.max_keys = max_keys
        self.generation = 0
        self._entries: OrderedDict[bytes, tuple[float, dict[bytes, Record]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, now: float, max_age: float) -> dict[bytes, Record] | None:
        """Records of ``key`` if it was looked up at most ``max_age`` seconds ago (those still
        unexpired at ``now``), else None."""
        entry = self._entries.get(key)
        if entry is None or now - entry[0] > max_age:
            return None
        return {sub: rec for sub, rec in entry[1].items() if rec.expiration > now}

    def put(self, key: bytes, records: Mapping[bytes, Record], now: float, *, since: int | None = None) -> None:
        """Remember a lookup result of ``key`` made at ``now``; ``since``: the ``generation`` when
        the lookup started (nothing is kept if a key was forgotten after that)."""
        if since is not None and since != self.generation:
            return
        self._entries.pop(key, None)  # re-inserted last: the oldest go first when full
        self._entries[key] = (now, dict(records))
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)

    def forget(self, key: bytes) -> None:
        """Drop ``key`` (our own write to it, or a tombstone that reached us, must show at once)."""
        self._entries.pop(key, None)
        self.generation += 1


class ClosestPeers:
    """Each key's closest peers from a lookup, reused for ``max_age`` seconds."""

    def __init__(self, max_age: float = PEER_CACHE_AGE, max_keys: int = MAX_PEER_CACHE_KEYS) -> None:
        self.max_age = max_age
        self.max_keys = max_keys
        self._entries: OrderedDict[bytes, tuple[float, list[Contact]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, now: float) -> list[Contact] | None:
        """The peers found for ``key`` less than ``max_age`` before ``now``, else None."""
        entry = self._entries.get(key)
        if entry is None or now - entry[0] >= self.max_age:
            return None
        return list(entry[1])

    def put(self, key: bytes, contacts: Sequence[Contact], now: float) -> None:
        """Remember the closest peers of ``key`` as of ``now``."""
        self._entries.pop(key, None)
        self._entries[key] = (now, list(contacts))
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)

    def forget(self, key: bytes) -> None:
        """A STORE to one of them failed: look again next time."""
        self._entries.pop(key, None)


class StorePlan:
    """Which peers get which records of one ``store_many``, and how many copies were accepted.

    Optimistic: the records go to the closest peers we already know while the lookup runs
    (``deliver(table's closest)``), then to whatever closer peers it finds (``deliver(found)``);
    where our table is right (small swarms, heartbeats to a stable swarm) a store costs one round
    trip instead of lookup + store. A peer is sent each record at most once.
    """

    def __init__(self, records: Sequence[Record]) -> None:
        self.records = list(records)
        self.accepted = [0] * len(self.records)
        self._sent: dict[PeerID, set[int]] = {}

    @property
    def keys(self) -> list[bytes]:
        """The distinct keys, in first-seen order."""
        return list(dict.fromkeys(r.key for r in self.records))

    def deliver(self, targets: Mapping[bytes, Iterable[Contact]]) -> list[tuple[Contact, list[int]]]:
        """STOREs to send now for ``targets`` (key -> peers): one ``(contact, record indices)`` per
        peer, with every record bound for it that it has not been sent yet."""
        per_peer: dict[PeerID, tuple[Contact, list[int]]] = {}
        for i, record in enumerate(self.records):
            for contact in targets.get(record.key, ()):
                sent = self._sent.setdefault(contact.peer, set())
                if i not in sent:
                    sent.add(i)
                    per_peer.setdefault(contact.peer, (contact, []))[1].append(i)
        return list(per_peer.values())

    def on_accepted(self, indices: Iterable[int]) -> None:
        """One more copy of each of these records was kept (by a peer, or by ourselves)."""
        for i in indices:
            self.accepted[i] += 1


def chunks(indices: Sequence[int], size: int) -> list[list[int]]:
    """``indices`` in STORE-sized pieces (``max_records_per_request``)."""
    return [list(indices[start : start + size]) for start in range(0, len(indices), size)]


__all__ = ["ClosestPeers", "RecentValues", "StorePlan", "chunks"]
