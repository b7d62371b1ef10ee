"""What a hivemind DHT node keeps, sans-I/O: values with expirations, dictionary values with
sub-keys, and the contacts it knows (node id → peer id). Every method takes ``now`` (DHT time,
seconds since the epoch, as hivemind's ``get_dht_time``); every table is bounded, and what a peer
stores is counted against its quota (values, sub-keys and their overhead).
"""

from __future__ import annotations

import heapq
import math
import sys
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, fields
from typing import Any

from ..net.identity import PeerID
from .limits import DEFAULT_DHT_LIMITS, DHTLimits
from .serializer import DictionaryValue, TensorDescriptor, ValueWithExpiration, dumps


# Who stored an entry: the peer whose request carried it, or None for this node's own stores.
Holder = Hashable
# Refusal reasons, as ``Storage.refusals`` and the resource manager count them.
VALUE_SIZE = "value_size"
SUBKEY_SIZE = "subkey_size"
PEER_QUOTA = "peer_quota"
KEY_FULL = "key_full"
STORAGE_FULL = "storage_full"


def footprint(obj: Any) -> int:
    """Bytes of memory a decoded sub-key takes, with the tuples and descriptors it holds and
    their items (what hivemind's msgpack decodes to a hashable value)."""
    size = sys.getsizeof(obj)
    if isinstance(obj, tuple):
        size += sum(footprint(item) for item in obj)
    elif isinstance(obj, TensorDescriptor):
        size += sum(footprint(getattr(obj, f.name)) for f in fields(obj))
    return size


class _Whole:
    """The entry of a regular value (a key's only entry), told apart from every sub-key."""

    def __repr__(self) -> str:
        return "<whole value>"


WHOLE = _Whole()
Entry = tuple[int, Any]  # (key id, sub-key or WHOLE)


class _Held:
    __slots__ = ("holder", "cost", "expiration")

    def __init__(self, holder: Holder, cost: int, expiration: float) -> None:
        self.holder = holder
        self.cost = cost
        self.expiration = expiration


class Storage:
    """Key id → value (bytes) or DictionaryValue, each with an expiration; the later expiration wins.

    Mirrors hivemind's ``DHTLocalStorage`` rules: a regular store replaces a value that expires
    sooner; a sub-key store turns a regular value that expires sooner into a dictionary, adds to an
    existing dictionary, and is refused when a regular value expires later. Expirations beyond
    ``now + max_expiration_ahead`` are capped there (a peer with a fast clock cannot pin a record).

    Accounting: every entry (a regular value, or one sub-key of a dictionary) costs its value's
    bytes, its decoded sub-key's memory (``footprint``) and ``entry_overhead`` (the objects that
    keep it), and is
    charged to the peer that stored it (``holder``; None: this node). A peer holds at most
    ``max_stored_bytes_per_peer``; all together at most ``max_stored_bytes`` and ``max_stored_keys``.
    Fairness as in our own DHT's storage: a full storage makes room at the expense of the largest
    holder first (its oldest entry goes), never of a smaller one; a full key
    (``max_subkeys``) gives up the soonest-expiring sub-key of its largest holder, unless the
    newcomer's holder is (one of) the largest there. Refusals are counted by reason
    (``refusals``) and reported to ``on_refusal``.
    """

    def __init__(self, limits: DHTLimits = DEFAULT_DHT_LIMITS, on_refusal: Callable[[str], None] | None = None) -> None:
        self.limits = limits
        self.on_refusal = on_refusal
        self.refusals: Counter[str] = Counter()
        self.evicted = 0  # entries pushed out to make room for a smaller holder's
        self._data: dict[int, ValueWithExpiration] = {}
        self._entries: dict[Entry, _Held] = {}
        self._by_holder: dict[Holder, dict[Entry, None]] = {}  # in the order stored: oldest first
        self._held: Counter[Holder] = Counter()
        self._bytes = 0
        self._expiry: list[tuple[float, int, int, Any]] = []  # (expiration, seq, key, sub-key or WHOLE)
        self._seq = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def stored_bytes(self) -> int:
        """Bytes counted against ``limits.max_stored_bytes`` (values, sub-keys and overhead)."""
        return self._bytes

    @property
    def entries(self) -> int:
        """Regular values and sub-keys held."""
        return len(self._entries)

    def held_by(self, holder: Holder) -> int:
        """Bytes counted against ``holder``'s quota."""
        return self._held.get(holder, 0)

    # --- storing -------------------------------------------------------------------------------

    def _cap(self, expiration: float, now: float) -> float:
        return min(expiration, now + self.limits.max_expiration_ahead)

    def _refuse(self, reason: str) -> bool:
        self.refusals[reason] += 1
        if self.on_refusal is not None:
            self.on_refusal(reason)
        return False

    def _usable(self, value: bytes, expiration: float, now: float) -> bool:
        if not math.isfinite(expiration) or expiration < now:
            return False
        if len(value) > self.limits.max_value_bytes:
            return self._refuse(VALUE_SIZE)
        return True

    def fits_subkey(self, subkey_bytes: int) -> bool:
        """Whether a sub-key of ``subkey_bytes`` (packed) may be stored; a refusal is counted when
        not (a server checks this before it decodes the sub-key)."""
        return subkey_bytes <= self.limits.max_subkey_bytes or self._refuse(SUBKEY_SIZE)

    def store(self, key: int, value: bytes, expiration: float, now: float, *, holder: Holder = None) -> bool:
        """Keep a regular value; False when it has expired, loses to a later one, or is refused."""
        if not self._usable(value, expiration, now):
            return False
        expiration = self._cap(expiration, now)
        current = self.get(key, now)
        if current is not None and current.expiration_time >= expiration:
            return False
        cost = len(value) + self.limits.entry_overhead
        if not self._make_room(key, holder, cost, now):
            return False
        self._drop_key(key)
        self._data[key] = ValueWithExpiration(value, expiration)
        self._add((key, WHOLE), holder, cost, expiration)
        return True

    def store_subkey(
        self, key: int, subkey: Any, value: bytes, expiration: float, now: float, *,
        holder: Holder = None, subkey_bytes: int | None = None,
    ) -> bool:
        """Keep one sub-key of a dictionary value (see the class docstring for the rules);
        ``subkey_bytes``: the sub-key's packed size (at most ``max_subkey_bytes``), when the
        caller has it already."""
        if not self._usable(value, expiration, now):
            return False
        if subkey_bytes is None:
            subkey_bytes = len(dumps(subkey))
        if not self.fits_subkey(subkey_bytes):
            return False
        expiration = self._cap(expiration, now)
        # what the decoded sub-key takes in memory, not on the wire: a tuple of short strings
        # takes ~20 times its packed bytes
        cost = len(value) + footprint(subkey) + self.limits.entry_overhead
        current = self.get(key, now)
        if current is None or (not isinstance(current.value, DictionaryValue) and current.expiration_time < expiration):
            if not self._make_room(key, holder, cost, now):
                return False
            self._drop_key(key)
            dictionary = DictionaryValue()
            dictionary.store(subkey, value, expiration)
            self._data[key] = ValueWithExpiration(dictionary, expiration)
            self._add((key, subkey), holder, cost, expiration)
            return True
        if not isinstance(current.value, DictionaryValue):
            return False
        dictionary = current.value
        replaced = dictionary.items.get(subkey)
        if replaced is not None and replaced.expiration_time >= expiration:
            return False
        if replaced is None and len(dictionary) >= self.limits.max_subkeys and not self._key_room(key, dictionary, holder):
            return self._refuse(KEY_FULL)
        if not self._make_room(key, holder, cost, now, replacing=(key, subkey)):
            return False
        self._remove((key, subkey))
        dictionary.store(subkey, value, expiration)
        self._add((key, subkey), holder, cost, expiration)
        if expiration > current.expiration_time:
            self._data[key] = ValueWithExpiration(dictionary, expiration)
        return True

    # --- reading -------------------------------------------------------------------------------

    def get(self, key: int, now: float) -> ValueWithExpiration | None:
        """The live value under ``key`` (a dictionary loses its expired sub-keys first), or None."""
        item = self._data.get(key)
        if item is None:
            return None
        if item.expiration_time < now:
            self._drop_key(key)
            return None
        if isinstance(item.value, DictionaryValue):
            for subkey in [k for k, sub in item.value.items.items() if sub.expiration_time < now]:
                self._drop_entry((key, subkey))
            if key not in self._data:
                return None
        return item

    def expire(self, now: float) -> int:
        """Forget every value and sub-key that has expired at ``now``; how many entries went."""
        gone = 0
        while self._expiry and self._expiry[0][0] < now:
            expiration, _, key, subkey = heapq.heappop(self._expiry)
            held = self._entries.get((key, subkey))
            if held is not None and held.expiration == expiration:
                self._drop_entry((key, subkey))
                gone += 1
        return gone

    # --- room ----------------------------------------------------------------------------------

    def _make_room(self, key: int, holder: Holder, cost: int, now: float, replacing: Entry | None = None) -> bool:
        """Whether ``cost`` more bytes for ``holder`` under ``key`` fit, after expired entries go
        and, if need be, entries of larger holders (never of ``key`` itself, which the new entry
        joins or replaces). ``replacing``: the entry the new one replaces (its bytes are freed)."""
        limits = self.limits
        # what the store frees: the entry it replaces, or a regular store's whole key
        freed = [replacing] if replacing is not None else self._entries_of(key)
        freed_bytes = sum(self._entries[e].cost for e in freed if e in self._entries)
        own_freed = sum(self._entries[e].cost for e in freed if e in self._entries and self._entries[e].holder == holder)
        if holder is not None and self.held_by(holder) - own_freed + cost > limits.max_stored_bytes_per_peer:
            self.expire(now)
            if self.held_by(holder) - own_freed + cost > limits.max_stored_bytes_per_peer:
                return self._refuse(PEER_QUOTA)
        new_key = key not in self._data
        expired = False
        while (self._bytes - freed_bytes + cost > limits.max_stored_bytes
               or (new_key and len(self._data) >= limits.max_stored_keys)):
            if not expired:
                expired = True
                if self.expire(now):
                    continue
            victim = self._largest_other(holder, cost, key)
            if victim is None:
                return self._refuse(STORAGE_FULL)
            self._drop_entry(victim)
            self.evicted += 1
        return True

    def _largest_other(self, holder: Holder, cost: int, key: int) -> Entry | None:
        """The oldest entry (outside ``key``) of the holder with the most bytes, if it holds more
        than ``holder`` would with ``cost`` more bytes; else None."""
        mine = self.held_by(holder) + cost
        ranked = sorted(((held, other) for other, held in self._held.items() if other != holder), key=lambda h: h[0], reverse=True)
        for held, other in ranked:
            if held <= mine:
                return None
            for entry in self._by_holder[other]:
                if entry[0] != key:
                    return entry
        return None

    def _key_room(self, key: int, dictionary: DictionaryValue, holder: Holder) -> bool:
        """Make room for one more sub-key under a full ``key``: its largest holder (the newcomer
        counted in its own, with one more) gives up its soonest-expiring sub-key. False when the
        newcomer's holder is (one of) the largest there."""
        counts: Counter[Holder] = Counter(self._entries[(key, sub)].holder for sub in dictionary.items)
        counts[holder] += 1
        top = max(counts.values())
        if counts[holder] == top:
            return False
        victims = [(item.expiration_time, index, sub) for index, (sub, item) in enumerate(dictionary.items.items())
                   if counts[self._entries[(key, sub)].holder] == top]
        _, _, loser = min(victims)
        self._drop_entry((key, loser))
        self.evicted += 1
        return True

    # --- bookkeeping ---------------------------------------------------------------------------

    def _entries_of(self, key: int) -> list[Entry]:
        item = self._data.get(key)
        if item is None:
            return []
        if isinstance(item.value, DictionaryValue):
            return [(key, sub) for sub in item.value.items]
        return [(key, WHOLE)]

    def _add(self, entry: Entry, holder: Holder, cost: int, expiration: float) -> None:
        self._entries[entry] = _Held(holder, cost, expiration)
        self._by_holder.setdefault(holder, {})[entry] = None
        self._held[holder] += cost
        self._bytes += cost
        self._seq += 1
        heapq.heappush(self._expiry, (expiration, self._seq, entry[0], entry[1]))
        if len(self._expiry) > 2 * len(self._entries) + 1024:  # replaced entries left stale ones
            self._expiry = []
            for e, held in self._entries.items():
                self._seq += 1  # unique: ties of expiration never compare keys and sub-keys
                self._expiry.append((held.expiration, self._seq, e[0], e[1]))
            heapq.heapify(self._expiry)

    def _remove(self, entry: Entry) -> None:
        """Forget ``entry``'s accounting (the value itself is the caller's to drop or replace)."""
        held = self._entries.pop(entry, None)
        if held is None:
            return
        entries = self._by_holder[held.holder]
        del entries[entry]
        if not entries:
            del self._by_holder[held.holder]
        self._held[held.holder] -= held.cost
        if self._held[held.holder] <= 0:
            del self._held[held.holder]
        self._bytes -= held.cost

    def _drop_entry(self, entry: Entry) -> None:
        """Forget one entry and its value: a regular value's key, or one sub-key (and its key
        once the dictionary is empty)."""
        key, subkey = entry
        self._remove(entry)
        if subkey is WHOLE:
            self._data.pop(key, None)
            return
        item = self._data.get(key)
        if item is not None and isinstance(item.value, DictionaryValue):
            item.value.items.pop(subkey, None)
            if not item.value.items:
                del self._data[key]

    def _drop_key(self, key: int) -> None:
        for entry in self._entries_of(key):
            self._remove(entry)
        self._data.pop(key, None)


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


__all__ = [
    "Contact",
    "Contacts",
    "Holder",
    "KEY_FULL",
    "PEER_QUOTA",
    "STORAGE_FULL",
    "SUBKEY_SIZE",
    "Storage",
    "VALUE_SIZE",
    "WHOLE",
]
