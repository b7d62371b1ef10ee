"""What a hivemind DHT node keeps, sans-I/O: values with expirations, dictionary values with
sub-keys, and the contacts it knows (node id → peer id). Every method takes ``now`` (DHT time,
seconds since the epoch, as hivemind's ``get_dht_time``); every table is bounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..net.identity import PeerID
from .limits import DEFAULT_DHT_LIMITS, DHTLimits
from .serializer import DictionaryValue, ValueWithExpiration


class Storage:
    """Key id → value (bytes) or DictionaryValue, each with an expiration; the later expiration wins.

    Mirrors hivemind's ``DHTLocalStorage`` rules: a regular store replaces a value that expires
    sooner; a sub-key store turns a regular value that expires sooner into a dictionary, adds to an
    existing dictionary, and is refused when a regular value expires later. Expirations beyond
    ``now + max_expiration_ahead`` are capped there (a peer with a fast clock cannot pin a record).
    """

    def __init__(self, limits: DHTLimits = DEFAULT_DHT_LIMITS) -> None:
        self.limits = limits
        self._data: dict[int, ValueWithExpiration] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def stored_bytes(self) -> int:
        """Bytes of values held (a bound: ``limits.max_stored_bytes``)."""
        return self._bytes

    def _cap(self, expiration: float, now: float) -> float:
        return min(expiration, now + self.limits.max_expiration_ahead)

    @staticmethod
    def _size(value: Any) -> int:
        if isinstance(value, DictionaryValue):
            return sum(len(item.value) for item in value.items.values())
        return len(value)

    def _room_for(self, key: int, extra: int, now: float) -> bool:
        if key not in self._data and len(self._data) >= self.limits.max_stored_keys:
            self.expire(now)
            if len(self._data) >= self.limits.max_stored_keys:
                return False
        if self._bytes + extra > self.limits.max_stored_bytes:
            self.expire(now)
            return self._bytes + extra <= self.limits.max_stored_bytes
        return True

    def _put(self, key: int, item: ValueWithExpiration) -> None:
        old = self._data.get(key)
        if old is not None:
            self._bytes -= self._size(old.value)
        self._data[key] = item
        self._bytes += self._size(item.value)

    def store(self, key: int, value: bytes, expiration: float, now: float) -> bool:
        """Keep a regular value; False when it has expired, loses to a later one, or does not fit."""
        if not math.isfinite(expiration) or expiration < now or len(value) > self.limits.max_value_bytes:
            return False
        expiration = self._cap(expiration, now)
        current = self.get(key, now)
        if current is not None and current.expiration_time >= expiration:
            return False
        if not self._room_for(key, len(value), now):
            return False
        self._put(key, ValueWithExpiration(value, expiration))
        return True

    def store_subkey(self, key: int, subkey: Any, value: bytes, expiration: float, now: float) -> bool:
        """Keep one sub-key of a dictionary value (see the class docstring for the rules)."""
        if not math.isfinite(expiration) or expiration < now or len(value) > self.limits.max_value_bytes:
            return False
        expiration = self._cap(expiration, now)
        current = self.get(key, now)
        if current is None or (not isinstance(current.value, DictionaryValue) and current.expiration_time < expiration):
            if not self._room_for(key, len(value), now):
                return False
            dictionary = DictionaryValue()
            dictionary.store(subkey, value, expiration)
            self._put(key, ValueWithExpiration(dictionary, expiration))
            return True
        if not isinstance(current.value, DictionaryValue):
            return False
        dictionary = current.value
        replaced = dictionary.items.get(subkey)
        if replaced is None and len(dictionary) >= self.limits.max_subkeys:
            return False
        growth = len(value) - (len(replaced.value) if replaced is not None else 0)
        if not self._room_for(key, growth, now):
            return False
        self._bytes -= self._size(dictionary)
        stored = dictionary.store(subkey, value, expiration)
        self._bytes += self._size(dictionary)
        if expiration > current.expiration_time:
            self._data[key] = ValueWithExpiration(dictionary, expiration)
        return stored

    def get(self, key: int, now: float) -> ValueWithExpiration | None:
        """The live value under ``key`` (a dictionary loses its expired sub-keys first), or None."""
        item = self._data.get(key)
        if item is None:
            return None
        if item.expiration_time < now:
            self._drop(key)
            return None
        if isinstance(item.value, DictionaryValue):
            self._bytes -= self._size(item.value)
            item.value.drop_expired(now)
            self._bytes += self._size(item.value)
            if not item.value.items:
                self._drop(key)
                return None
        return item

    def _drop(self, key: int) -> None:
        item = self._data.pop(key)
        self._bytes -= self._size(item.value)

    def expire(self, now: float) -> int:
        """Forget every value that has expired at ``now``; how many went."""
        gone = [key for key, item in self._data.items() if item.expiration_time < now]
        for key in gone:
            self._drop(key)
        return len(gone)


@dataclass(frozen=True)
class Contact:
    """A hivemind DHT peer: its random node id and its libp2p peer id."""

    node_id: int
    peer: PeerID


class Contacts:
    """The peers we know, by node id; nearest-first lookups by XOR distance. Bounded: when full,
    a new peer replaces the one that failed most recently, else it is not kept (the old, proven
    peers stay, as in Kademlia)."""

    def __init__(self, local_id: int, limits: DHTLimits = DEFAULT_DHT_LIMITS) -> None:
        self.local_id = local_id
        self.limits = limits
        self._by_node: dict[int, PeerID] = {}
        self._by_peer: dict[PeerID, int] = {}
        self._failed: list[int] = []

    def __len__(self) -> int:
        return len(self._by_node)

    def __contains__(self, peer: object) -> bool:
        return peer in self._by_peer

    def node_of(self, peer: PeerID) -> int | None:
        """The node id we know for ``peer``."""
        return self._by_peer.get(peer)

    def add(self, node_id: int, peer: PeerID) -> bool:
        """Remember a peer that answered us or called us; False when the table is full."""
        if node_id == self.local_id:
            return False
        old_node = self._by_peer.get(peer)
        if old_node is not None and old_node != node_id:  # the peer restarted with a new node id
            self._forget(old_node)
        if node_id not in self._by_node and len(self._by_node) >= self.limits.max_contacts:
            if not self._failed:
                return False
            self._forget(self._failed.pop())
        self._by_node[node_id] = peer
        self._by_peer[peer] = node_id
        if node_id in self._failed:
            self._failed.remove(node_id)
        return True

    def mark_failed(self, peer: PeerID) -> None:
        """A peer did not answer: the first to go when the table is full; after three misses, gone."""
        node_id = self._by_peer.get(peer)
        if node_id is None:
            return
        self._failed.append(node_id)
        if self._failed.count(node_id) >= 3:
            self._forget(node_id)

    def _forget(self, node_id: int) -> None:
        peer = self._by_node.pop(node_id, None)
        if peer is not None:
            self._by_peer.pop(peer, None)
        self._failed = [n for n in self._failed if n != node_id]

    def remove(self, peer: PeerID) -> None:
        """Forget ``peer``."""
        node_id = self._by_peer.get(peer)
        if node_id is not None:
            self._forget(node_id)

    def nearest(self, target: int, k: int, exclude: int | None = None) -> list[Contact]:
        """Up to ``k`` contacts nearest to ``target`` by XOR distance."""
        ranked = sorted((node ^ target, node) for node in self._by_node if node != exclude)
        return [Contact(node, self._by_node[node]) for _, node in ranked[:k]]

    def all(self) -> list[Contact]:
        """Every contact."""
        return [Contact(node, peer) for node, peer in self._by_node.items()]


__all__ = ["Contact", "Contacts", "Storage"]
