"""Kademlia routing table: k-buckets with ping-before-evict, a replacement cache and failure back-off.

Pure: every method that depends on time takes ``now``; nothing here sends or sleeps. The driver
tells the table what happened (``update`` when a peer spoke to us or answered, ``record_failure``
when a request failed, ``on_ping_result`` for ping-before-evict) and does what it is asked (ping the
peers ``update`` returns).

Node IDs are sha256 of the PeerID bytes, so a node cannot choose its place in the key space;
record keys live in the same 256-bit space as sha256 of the key bytes. Distance is XOR.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from ..net.identity import PeerID
from .config import DHTConfig

ID_BITS = 256
RTT_WEIGHT = 1 / 3  # how far one timed request moves a contact's round-trip estimate


@functools.lru_cache(maxsize=16384)  # every contact in every reply asks again
def node_id(peer: PeerID) -> int:
    """A peer's position in the key space: sha256 of its PeerID bytes, as a 256-bit integer."""
    return int.from_bytes(hashlib.sha256(peer.to_bytes()).digest(), "big")


def key_id(key: bytes) -> int:
    """A record key's position in the key space: sha256 of the key bytes."""
    return int.from_bytes(hashlib.sha256(key).digest(), "big")


def id_to_bytes(ident: int) -> bytes:
    """The 32-byte big-endian form of an ID, as FIND_NODE carries it."""
    return ident.to_bytes(32, "big")


def id_from_bytes(data: bytes) -> int:
    """Inverse of :func:`id_to_bytes`."""
    return int.from_bytes(data, "big")


@dataclass(frozen=True, eq=False)
class Contact:
    """A peer as the DHT knows it: PeerID and multiaddrs (binary; direct and relayed)."""

    peer: PeerID
    addrs: tuple[bytes, ...] = ()
    id: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "addrs", tuple(bytes(a) for a in self.addrs))
        object.__setattr__(self, "id", node_id(self.peer))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Contact) and (self.peer, self.addrs) == (other.peer, other.addrs)

    def __hash__(self) -> int:
        return hash((self.peer, self.addrs))


@dataclass(eq=False)  # one per peer: compared by identity, so a bucket's remove() finds it in C
class Entry:
    """A contact in a bucket, with its liveness bookkeeping."""

    contact: Contact
    last_seen: float  # last time it spoke to us or answered
    failures: int = 0  # consecutive failed requests
    backoff_until: float = 0.0  # do not prefer it for queries before this time
    answered: bool = False  # it answered a request of ours (not merely sent us one)
    rtt: float | None = None  # smoothed seconds of our requests' round trips to it (None: not timed)

    def heard_in(self, rtt: float) -> None:
        """One of our requests came back after ``rtt`` seconds: the estimate moves a third of the way
        (the first one is taken as it is)."""
        self.rtt = rtt if self.rtt is None else self.rtt + (rtt - self.rtt) * RTT_WEIGHT

    def backed_off(self, now: float) -> bool:
        """True while a recent failure makes this contact a poor choice to ask."""
        return self.failures > 0 and now < self.backoff_until


@dataclass
class _Pending:
    lru: PeerID  # the least-recently-seen entry we asked the driver to ping
    since: float
    deadline: float


class Bucket:
    """Up to k entries ordered least-recently-seen first, plus a replacement cache."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        # peer -> (contact, last heard); most recent last
        self.replacements: OrderedDict[PeerID, tuple[Contact, float]] = OrderedDict()
        self.pending: _Pending | None = None
        self.last_changed = 0.0

    def find(self, peer: PeerID) -> int | None:
        """Index of ``peer`` in ``entries``, or None."""
        for i, entry in enumerate(self.entries):
            if entry.contact.peer == peer:
                return i
        return None


class RoutingTable:
    """k-buckets around ``local``. Client-mode peers are never inserted."""

    def __init__(self, local: PeerID, config: DHTConfig | None = None) -> None:
        self.local = local
        self.local_id = node_id(local)
        self.config = config or DHTConfig()
        self._buckets: dict[int, Bucket] = {}
        # peer -> its entry (the same object its bucket lists; its bucket is bucket_index of its
        # ID): a value lookup reads the round trips of its 20 seeds, and scanning 512-wide trainer
        # buckets for each cost 3x the seeds
        self._entries: dict[PeerID, Entry] = {}
        # peer -> until when it is routed around: its request ran past a lookup's slot timeout
        # or failed, and it has not spoken since (entries or not: a dead contact from a reply)
        self._silent: OrderedDict[PeerID, float] = OrderedDict()

    # --- queries ---------------------------------------------------------------------------
    def bucket_index(self, ident: int) -> int:
        """Bucket of an ID: the position of the highest bit in which it differs from ours (0..255)."""
        distance = ident ^ self.local_id
        if distance == 0:
            raise ValueError("the local node has no bucket")
        return distance.bit_length() - 1

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, peer: object) -> bool:
        return peer in self._entries

    def get(self, peer: PeerID) -> Entry | None:
        """The entry of ``peer``, or None."""
        return self._entries.get(peer)

    def rtt(self, peer: PeerID) -> float | None:
        """Our requests' smoothed round trip to ``peer`` in seconds, or None (not in the table, or
        never timed)."""
        entry = self.get(peer)
        return None if entry is None else entry.rtt

    def entries(self) -> Iterator[Entry]:
        """Every entry, bucket by bucket."""
        for bucket in self._buckets.values():
            yield from bucket.entries

    def closest(
        self, target: int, count: int, now: float, *, exclude: Iterable[PeerID] = (), responsive_only: bool = False
    ) -> list[Contact]:
        """The ``count`` contacts closest to ``target``; contacts whose last request failed come last.

        Preferring responsive peers keeps lookups (ours, and others' through our replies) from
        spending their alpha slots on peers that just failed; those are still returned when
        nothing better is known, and are redeemed by any message from them or a liveness check.
        ``responsive_only`` leaves them out (replies to others: a requester sorts contacts by
        distance, not by our preference, so a dead contact we hand out is one it will try), and
        gives contacts that never answered a request of ours (they only sent us one) at most
        ``unproven_reply_contacts`` places, or whatever proven contacts leave free: a peer that
        asked us once and crashed is no better than a made-up contact to whoever we hand it to.
        """
        skip = set(exclude)
        # Buckets in order of distance to the target (Kademlia's XOR geometry): with t the highest
        # bit where target and local differ, bucket t holds every contact within 2**t of the
        # target, buckets below t come next (all in [2**t, 2**(t+1))), then t+1, t+2, ... So only
        # the first buckets need sorting: every lookup step and every reply asks, and sorting the
        # whole table each time was the largest cost of a thousand-peer simulation.
        top = (target ^ self.local_id).bit_length() - 1
        groups: list[list[int]] = [[top]] if top >= 0 else []
        groups.append([i for i in self._buckets if i < top] if top >= 0 else list(self._buckets))
        groups.extend([i] for i in sorted(self._buckets) if i > top)
        good: list[tuple[int, Contact]] = []
        failed: list[tuple[int, Contact]] = []
        unproven: list[tuple[int, Contact]] = []
        for group in groups:
            for index in group:
                bucket = self._buckets.get(index)
                if bucket is None:
                    continue
                for entry in bucket.entries:
                    contact = entry.contact
                    if contact.peer in skip:
                        continue
                    if entry.failures > 0:
                        if not responsive_only:
                            failed.append((contact.id ^ target, contact))
                    elif responsive_only and not entry.answered:
                        unproven.append((contact.id ^ target, contact))
                    else:
                        good.append((contact.id ^ target, contact))
            if len(good) >= count:
                break  # later groups are all farther than everything collected
        good.sort(key=lambda t: t[0])
        if responsive_only:
            unproven.sort(key=lambda t: t[0])
            room = max(count - len(good), min(count, self.config.unproven_reply_contacts))
            merged = sorted(good[:count] + unproven[:room], key=lambda t: t[0])
            return [c for _, c in merged[:count]]
        if len(good) >= count:
            return [c for _, c in good[:count]]
        failed.sort(key=lambda t: t[0])
        return [c for _, c in good] + [c for _, c in failed[: count - len(good)]]

    def suspect(self, peer: PeerID, now: float) -> bool:
        """Whether ``peer`` is known unresponsive: a request of ours to it failed or ran past a
        lookup's slot timeout less than ``silent_memory`` ago, and it has not spoken to us or
        answered since. Lookups route around such peers (``query.Lookup``). Only our own
        requests put a peer here, never what others say of it."""
        until = self._silent.get(peer)
        if until is None:
            return False
        if now < until:
            return True
        del self._silent[peer]
        return False

    def mark_silent(self, peer: PeerID, now: float) -> None:
        """A request to ``peer`` ran past a lookup's slot timeout (or failed): route around it
        for ``silent_memory`` unless it is heard from first."""
        if peer == self.local:
            return
        self._silent.pop(peer, None)
        self._silent[peer] = now + self.config.silent_memory
        while len(self._silent) > self.config.max_silent_peers:
            self._silent.popitem(last=False)

    def bucket_for(self, peer: PeerID) -> Bucket | None:
        """The bucket ``peer`` belongs in (existing or not yet created: None)."""
        return self._buckets.get(self.bucket_index(node_id(peer)))

    # --- updates ---------------------------------------------------------------------------
    def update(
        self, contact: Contact, now: float, *, client_mode: bool = False, answered: bool = False, rtt: float | None = None,
    ) -> PeerID | None:
        """``contact`` spoke to us or answered us (``answered``: a request of ours, which proves it
        reachable; ``rtt``: the seconds that request took, for ``rtt``). Returns a peer the driver
        must ping, or None.

        A full bucket does not evict on its own: the least-recently-seen entry is pinged first
        (Kademlia's preference for long-lived nodes) and the newcomer waits in the replacement
        cache; ``on_ping_result`` or ``expire`` settles it.
        """
        peer = contact.peer
        if peer == self.local:
            return None
        self._silent.pop(peer, None)  # it spoke: no longer routed around
        if client_mode:
            # a peer that turned client (lost reachability) must not be handed to others
            self.remove(peer)
            return None
        index = self.bucket_index(contact.id)
        bucket = self._buckets.setdefault(index, Bucket())
        at = bucket.find(peer)
        if at is not None:
            entry = bucket.entries.pop(at)
            if contact.addrs:
                entry.contact = contact
            entry.last_seen = now
            entry.failures = 0
            entry.backoff_until = 0.0
            entry.answered = entry.answered or answered
            if rtt is not None:
                entry.heard_in(rtt)
            bucket.entries.append(entry)
            return None
        if len(bucket.entries) < self.config.bucket_capacity:
            self._entries[peer] = entry = Entry(contact, now, answered=answered, rtt=rtt)
            bucket.entries.append(entry)
            bucket.replacements.pop(peer, None)
            bucket.last_changed = now
            return None
        self._remember(bucket, contact, now)
        if bucket.pending is None:
            lru = bucket.entries[0].contact.peer
            bucket.pending = _Pending(lru, now, now + self.config.ping_timeout)
            return lru
        return None

    def record_success(self, peer: PeerID, now: float) -> None:
        """A request to ``peer`` succeeded (when its contact is not at hand; else use ``update``).
        It is no longer silent, whether or not it is in the table (a stranger, or a member evicted
        while our ping to it was on its way)."""
        self._silent.pop(peer, None)
        entry = self.get(peer)
        if entry is not None:
            self.update(entry.contact, now, answered=True)

    def record_failure(self, peer: PeerID, now: float) -> None:
        """A request to ``peer`` failed or timed out: back off, and evict after ``max_failures``."""
        self.mark_silent(peer, now)
        entry = self._entries.get(peer)
        if entry is None:
            self._forget_replacement(peer)
            return
        index = self.bucket_index(entry.contact.id)
        bucket = self._buckets[index]
        entry.failures += 1
        delay = self.config.failure_backoff * 2 ** min(entry.failures - 1, 32)
        entry.backoff_until = now + min(delay, self.config.max_failure_backoff)
        suspected = bucket.pending is not None and bucket.pending.lru == peer
        if entry.failures >= self.config.max_failures or suspected:
            self._evict(index, peer, now)

    def on_ping_result(self, peer: PeerID, ok: bool, now: float) -> None:
        """Outcome of a ping-before-evict asked for by ``update``."""
        if ok:
            self.record_success(peer, now)
            entry = self._entries.get(peer)
            if entry is not None:
                bucket = self._buckets[self.bucket_index(entry.contact.id)]
                if bucket.pending is not None and bucket.pending.lru == peer:
                    bucket.pending = None
        else:
            self.mark_silent(peer, now)
            entry = self._entries.get(peer)
            if entry is not None:
                self._evict(self.bucket_index(entry.contact.id), peer, now)

    def expire(self, now: float) -> list[PeerID]:
        """Settle ping-before-evict checks past their deadline; returns the peers evicted.

        A driver that lost track of a ping does not wedge the bucket: if the old entry has not
        been heard from since the check began, it goes.
        """
        evicted = []
        for index, bucket in list(self._buckets.items()):
            pending = bucket.pending
            if pending is None or now < pending.deadline:
                continue
            bucket.pending = None
            at = bucket.find(pending.lru)
            if at is not None and bucket.entries[at].last_seen <= pending.since:
                self._evict(index, pending.lru, now)
                evicted.append(pending.lru)
        return evicted

    def remove(self, peer: PeerID) -> None:
        """Forget ``peer`` entirely (without promoting anyone)."""
        entry = self._entries.pop(peer, None)
        if entry is None:
            self._forget_replacement(peer)
            return
        bucket = self._buckets[self.bucket_index(entry.contact.id)]
        bucket.entries.remove(entry)
        if bucket.pending is not None and bucket.pending.lru == peer:
            bucket.pending = None

    def to_check(self, now: float, max_age: float | None = None) -> list[PeerID]:
        """Contacts the driver should ping now: silent for ``max_age`` (default
        ``liveness_check_age``), failed once and out of their back-off, or silent past a
        lookup's slot timeout (``suspect``). Pinging them redeems or evicts them, so tables shed
        dead volunteers between lookups."""
        max_age = self.config.liveness_check_age if max_age is None else max_age
        return [
            e.contact.peer
            for e in self.entries()
            if now - e.last_seen >= max_age
            or (e.failures > 0 and not e.backed_off(now))
            or (e.failures == 0 and self.suspect(e.contact.peer, now))
        ]

    def refresh_targets(self, now: float, max_age: float, rng: random.Random | None = None) -> list[int]:
        """Random IDs in the non-empty buckets unchanged for ``max_age``: look them up to refresh."""
        rng = rng or random.Random()
        targets = []
        for index, bucket in self._buckets.items():
            if bucket.entries and now - bucket.last_changed >= max_age:
                bucket.last_changed = now
                targets.append(self.local_id ^ ((1 << index) | rng.getrandbits(index)))
        return targets

    def join_targets(self, count: int, rng: random.Random | None = None) -> list[int]:
        """Random IDs in the ``count`` farthest buckets (half the key space, a quarter, ...): what a
        joiner looks up after itself, so its table learns of peers all over the space and not only
        of those that answered near its own ID."""
        rng = rng or random.Random()
        return [self.local_id ^ ((1 << index) | rng.getrandbits(index)) for index in range(ID_BITS - 1, ID_BITS - 1 - count, -1)]

    def crawl_targets(self, count: int, rng: random.Random | None = None) -> list[int]:
        """``count`` random IDs, one in each of ``count`` equal slices of the key space (by distance
        from us): what a trainer looks up once it has joined, so that its wide table comes to hold
        most servers, each one that answered it (``DHTConfig.crawl_lookups``)."""
        rng = rng or random.Random()
        width = (1 << ID_BITS) // max(1, count)
        return [self.local_id ^ (slice_ * width + rng.randrange(width)) for slice_ in range(count)]

    # --- internals ---------------------------------------------------------------------------
    def _remember(self, bucket: Bucket, contact: Contact, now: float) -> None:
        bucket.replacements.pop(contact.peer, None)
        bucket.replacements[contact.peer] = (contact, now)
        while len(bucket.replacements) > self.config.replacement_cache_size:
            bucket.replacements.popitem(last=False)

    def _forget_replacement(self, peer: PeerID) -> None:
        bucket = self.bucket_for(peer) if peer != self.local else None
        if bucket is not None:
            bucket.replacements.pop(peer, None)

    def _evict(self, index: int, peer: PeerID, now: float) -> None:
        self.remove(peer)
        bucket = self._buckets[index]
        bucket.last_changed = now
        if bucket.replacements and len(bucket.entries) < self.config.bucket_capacity:
            # the most recently heard replacement is the likeliest to be alive
            new_peer, (contact, seen) = bucket.replacements.popitem(last=True)
            self._entries[new_peer] = entry = Entry(contact, seen)
            bucket.entries.append(entry)
            bucket.entries.sort(key=lambda e: e.last_seen)
