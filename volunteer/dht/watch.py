"""Holders tell caching readers about tombstones at once (pure; the driver sends the STOREs).

A reader that caches what it found (``get_many(max_age=...)``: a trainer's beam search every
step) asks with ``watch``; each holder then remembers the reader under every key asked for
``watch_age`` seconds. When a STORE brings a tombstone under a watched key (a host withdrawing
its experts), the holder forwards that signed tombstone to the key's watchers before answering
the STORE, so by the time the leaver's ``withdraw`` returns, every cache that had read the key
from a holder it reached has dropped it (the reader's inbound STORE invalidates its cache).

Heartbeats (new values) are not forwarded: they arrive every few seconds and would empty every
cache; a reader sees them when its cache entry ages out. Bounded: ``max_watched_keys`` keys (the
least recently watched forgotten first), ``max_watchers_per_key`` readers per key (the oldest
dropped: a flood of fake readers costs honest readers their push, never their correctness beyond
``max_age``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from ..net.identity import PeerID
from .config import DHTConfig
from .records import Record
from .routing import Contact


class Watchers:
    """Per key, the readers to forward its tombstones to, each until its watch lapses."""

    def __init__(self, config: DHTConfig) -> None:
        self.age = config.watch_age
        self.max_keys = config.max_watched_keys
        self.max_per_key = config.max_watchers_per_key
        self._keys: OrderedDict[bytes, OrderedDict[PeerID, tuple[Contact, float]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def watch(self, key: bytes, contact: Contact, now: float) -> None:
        """``contact`` read ``key`` at ``now`` and caches it: tell it of tombstones until ``now + watch_age``."""
        readers = self._keys.pop(key, None) or OrderedDict()
        self._keys[key] = readers  # most recently watched last: the stalest keys go first
        readers.pop(contact.peer, None)
        readers[contact.peer] = (contact, now + self.age)
        while len(readers) > self.max_per_key:
            readers.popitem(last=False)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    def watching(self, key: bytes, now: float, exclude: Iterable[PeerID] = ()) -> list[Contact]:
        """Readers of ``key`` whose watch is still on at ``now`` (lapsed ones are forgotten)."""
        readers = self._keys.get(key)
        if not readers:
            return []
        for peer in [p for p, (_, until) in readers.items() if until <= now]:
            del readers[peer]
        if not readers:
            del self._keys[key]
            return []
        skip = set(exclude)
        return [contact for peer, (contact, _) in readers.items() if peer not in skip]


def forwards(
    watchers: Watchers, accepted: Iterable[Record], now: float, exclude: Iterable[PeerID] = ()
) -> list[tuple[Contact, list[Record]]]:
    """The STOREs that tell watchers of the tombstones among ``accepted`` (records just stored,
    new to us): one ``(contact, records)`` per reader."""
    skip = list(exclude)
    per_peer: dict[PeerID, tuple[Contact, list[Record]]] = {}
    for record in accepted:
        if record.value is not None:
            continue
        for contact in watchers.watching(record.key, now, skip):
            per_peer.setdefault(contact.peer, (contact, []))[1].append(record)
    return list(per_peer.values())


__all__ = ["Watchers", "forwards"]
