"""Signed, expiring DHT records and the bounded storage that keeps them.

A key (bytes) maps to sub-keys (bytes), each holding one record: value bytes (or ``None``, a
tombstone), an expiration time, the signer's PeerID and its signature.

Ownership rule: **every sub-key begins with its signer's PeerID bytes** (optionally followed by a
suffix of the owner's choosing). PeerIDs are self-delimiting multihashes, so a sub-key has at most
one owner, and only that owner's key can write it: there are no open sub-keys to vandalise. A host
declaring experts uses its bare PeerID bytes as the sub-key. Signers must have an identity-multihash
PeerID (Ed25519, what we generate) so the key can be taken from the PeerID itself.

The signature covers the canonical msgpack of ``[DOMAIN, key, sub-key, value, expiration]``
(expiration always a float64), so a record can be forwarded by anyone and checked by everyone.

Conflicts: the newest expiration wins; on a tie a tombstone beats a value, so a stale copy can
never revive a deleted entry. A tombstone therefore carries the expiration of the record it deletes
(not "now": it would lose to that record under newest-wins, and be expired on arrival); it is
dropped when that expiration passes, i.e. when the deleted record would have expired anyway.

Clock skew: an expiration beyond ``now + max_ttl + max_clock_skew`` is refused, not capped. Capping
would change the signed content, so the capped copy could not be forwarded with a valid signature;
a publisher whose clock runs that far ahead is misconfigured (``volunteer doctor`` shows the skew).
Expirations within the allowance are kept as sent: a publisher ``s`` seconds ahead sees its records
live ``s`` seconds longer here, bounded by ``max_clock_skew``.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Iterable, Iterator

import msgpack

from ..errors import DHTRecordError, LocalProtocolError, PeerIDError
from ..net.identity import KeyPair, PeerID
from .config import DHTConfig

DOMAIN = "volunteer/dht/record/1"

# STORE reply codes besides the DHTRecordError codes
OK = "ok"
STALE = "stale"  # an equal or newer record is already held: not an error, nothing changed


@dataclass(frozen=True)
class Record:
    """One signed entry: ``key`` → ``subkey`` → ``value`` (None = tombstone) until ``expiration``."""

    key: bytes
    subkey: bytes
    value: bytes | None
    expiration: float
    signer: PeerID
    signature: bytes

    @property
    def is_tombstone(self) -> bool:
        """True for a deletion marker."""
        return self.value is None

    @property
    def size(self) -> int:
        """Bytes this record costs in storage (what ``max_total_bytes`` counts)."""
        value = len(self.value) if self.value is not None else 0
        return len(self.key) + len(self.subkey) + value + len(self.signer.to_bytes()) + len(self.signature)

    def supersedes(self, other: "Record") -> bool:
        """Whether this record replaces ``other`` (same key and sub-key): newest expiration wins."""
        if self.expiration != other.expiration:
            return self.expiration > other.expiration
        return self.is_tombstone and not other.is_tombstone


def signing_payload(key: bytes, subkey: bytes, value: bytes | None, expiration: float) -> bytes:
    """The canonical bytes a record's signature covers."""
    return msgpack.packb([DOMAIN, bytes(key), bytes(subkey), value, float(expiration)], use_bin_type=True)


def owned_subkey(peer: PeerID, suffix: bytes = b"") -> bytes:
    """A sub-key owned by ``peer``: its PeerID bytes, then ``suffix``."""
    return peer.to_bytes() + bytes(suffix)


def sign(keypair: KeyPair, key: bytes, subkey: bytes, value: bytes | None, expiration: float) -> Record:
    """Sign a record with our identity. The sub-key must be one we own (see ``owned_subkey``)."""
    if not bytes(subkey).startswith(keypair.peer_id.to_bytes()):
        raise LocalProtocolError("a sub-key must begin with the signer's PeerID bytes")
    if value is not None:
        value = bytes(value)
    expiration = float(expiration)
    signature = keypair.sign(signing_payload(key, subkey, value, expiration))
    record = Record(bytes(key), bytes(subkey), value, expiration, keypair.peer_id, signature)
    remember_verified(record)
    return record


def check(record: Record, now: float, config: DHTConfig) -> None:
    """Raise DHTRecordError (with a ``code``) unless ``record`` may be stored or believed at ``now``."""
    if not record.key:
        raise DHTRecordError("empty key", "invalid")
    if len(record.key) > config.max_key_size:
        raise DHTRecordError(f"key of {len(record.key)} bytes exceeds {config.max_key_size}", "too-large")
    if len(record.subkey) > config.max_subkey_size:
        raise DHTRecordError(f"sub-key of {len(record.subkey)} bytes is too large", "too-large")
    if record.value is not None and len(record.value) > config.max_value_size:
        raise DHTRecordError(f"value of {len(record.value)} bytes exceeds {config.max_value_size}", "too-large")
    if len(record.signature) > config.max_signature_size:
        raise DHTRecordError("signature too large", "too-large")
    if not math.isfinite(record.expiration):
        raise DHTRecordError("expiration is not a finite number", "invalid")
    if record.expiration <= now:
        raise DHTRecordError("record already expired", "expired")
    if record.expiration > now + config.max_ttl + config.max_clock_skew:
        raise DHTRecordError(
            f"expiration {record.expiration - now:.0f} s ahead exceeds max_ttl {config.max_ttl:.0f} s "
            f"plus {config.max_clock_skew:.0f} s of clock skew",
            "too-far",
        )
    if not record.subkey.startswith(record.signer.to_bytes()):
        raise DHTRecordError("sub-key is not owned by the signer", "not-owner")
    if _VERIFIED.get(record.signature) == record:
        return  # this exact record (every field equal) was verified before
    try:
        public_key = record.signer.extract_public_key()
    except PeerIDError:
        public_key = None
    if public_key is None:
        raise DHTRecordError("signer's PeerID does not embed its public key", "unverifiable")
    payload = signing_payload(record.key, record.subkey, record.value, record.expiration)
    if not public_key.verify(payload, record.signature):
        raise DHTRecordError("bad signature", "bad-signature")
    remember_verified(record)


# Heartbeats and repeated lookups bring the same records back again and again; verifying an
# Ed25519 signature costs ~60 µs, a dict lookup and a dataclass comparison ~1 µs. Only a record
# equal in every field (value, expiration, signer, signature) to one verified before skips it.
_VERIFIED: dict[bytes, Record] = {}
_VERIFIED_MAX = 65536


def remember_verified(record: Record) -> None:
    """Note a record whose signature is known good (verified, or signed by us)."""
    if len(_VERIFIED) >= _VERIFIED_MAX:
        _VERIFIED.clear()
    _VERIFIED[record.signature] = record


# Where a STORE came from, as the storage counts it (see ``source_of`` in ``state.py``): an IP
# address, a relay, or None for our own records. Any hashable will do.
Source = Hashable


class _KeyShares:
    """Who holds the sub-keys of one key: counts by signer and by source address."""

    __slots__ = ("signers", "sources", "source_of")

    def __init__(self) -> None:
        self.signers: Counter[PeerID] = Counter()
        self.sources: Counter[Source] = Counter()
        self.source_of: dict[bytes, Source] = {}  # sub-key -> the source that stored it

    def add(self, subkey: bytes, signer: PeerID, source: Source) -> None:
        self.signers[signer] += 1
        self.sources[source] += 1
        self.source_of[subkey] = source

    def remove(self, subkey: bytes, signer: PeerID) -> Source:
        source = self.source_of.pop(subkey)
        _decrement(self.signers, signer)
        _decrement(self.sources, source)
        return source


def _decrement(counter: Counter, item: Hashable) -> None:
    counter[item] -= 1
    if counter[item] <= 0:
        del counter[item]


class Storage:
    """Records held by one node, within every cap of the config. Expired records are invisible.

    Caps: value size (``check``), records per signer, sub-keys per signer under one key, sub-keys
    per key, total records and bytes (expired records are collected first).

    Fairness: a full key or a full storage makes room at the expense of **the largest
    holder first**, never of a smaller one. Under a key, holders are grouped by the source address
    that stored their records, then by signer; the newcomer counts in its own groups. The largest
    source loses; within it the largest signer; within that, the soonest-expiring record. Ties are
    settled by the soonest expiration (what a key did before fairness: fresh heartbeats push out
    entries about to expire), the newcomer losing a tie. So one identity holding a key's sub-keys
    (capped anyway at ``max_subkeys_per_signer_per_key``) or many identities from one address
    cannot push out a host from another address holding one sub-key. A full storage evicts the
    oldest-stored record of the source holding the most records, unless that is the newcomer's own.
    """

    def __init__(self, config: DHTConfig | None = None) -> None:
        self.config = config or DHTConfig()
        self._data: dict[bytes, dict[bytes, Record]] = {}
        self._shares: dict[bytes, _KeyShares] = {}  # key -> who holds its sub-keys
        self._per_signer: Counter[PeerID] = Counter()
        # source -> its records (key, sub-key) in the order stored: a full storage evicts the oldest
        self._per_source: dict[Source, dict[tuple[bytes, bytes], None]] = {}
        self._count = 0
        self._bytes = 0
        self.evicted = 0  # records pushed out by fairness (key-full or storage-full) since start
        # (expiration, key, subkey); entries go stale when a record is replaced (checked on pop)
        self._expiry: list[tuple[float, bytes, bytes]] = []

    def __len__(self) -> int:
        return self._count

    @property
    def bytes_used(self) -> int:
        """Bytes counted against ``max_total_bytes``."""
        return self._bytes

    def records_of(self, signer: PeerID) -> int:
        """How many records ``signer`` has in this storage."""
        return self._per_signer[signer]

    def records_from(self, source: Source) -> int:
        """How many records stored from ``source`` this storage holds."""
        return len(self._per_source.get(source, ()))

    def holders(self, key: bytes) -> tuple[Counter[PeerID], Counter[Source]]:
        """Sub-keys of ``key`` by signer and by source (copies; expired records included until collected)."""
        shares = self._shares.get(bytes(key))
        if shares is None:
            return Counter(), Counter()
        return Counter(shares.signers), Counter(shares.sources)

    def store(self, record: Record, now: float, *, checked: bool = False, source: Source = None) -> bool:
        """Keep ``record`` if it is new or supersedes what we hold. Returns False if it was stale.

        ``source`` is where the STORE came from (``None``: ourselves); fairness counts by it.
        Raises DHTRecordError when the record is invalid (skipped if ``checked``) or a cap refuses it.
        """
        if not checked:
            check(record, now, self.config)
        subkeys = self._data.get(record.key)
        old = subkeys.get(record.subkey) if subkeys else None
        if old is not None and old.expiration <= now:
            self._drop(record.key, record.subkey)
            subkeys = self._data.get(record.key)
            old = None
        if old is not None and subkeys is not None:
            if not record.supersedes(old):
                return False
            if self._bytes - old.size + record.size > self.config.max_total_bytes:
                self.collect(now)
                if self._bytes - old.size + record.size > self.config.max_total_bytes:
                    raise DHTRecordError("storage is full", "storage-full")
            self._bytes += record.size - old.size
            subkeys[record.subkey] = record
            self._move_source(record.key, record.subkey, record.signer, source)
            heapq.heappush(self._expiry, (record.expiration, record.key, record.subkey))
            self._compact_heap()
            return True
        self._make_room(record, now, source)
        self._data.setdefault(record.key, {})[record.subkey] = record
        self._shares.setdefault(record.key, _KeyShares()).add(record.subkey, record.signer, source)
        self._per_source.setdefault(source, {})[(record.key, record.subkey)] = None
        self._per_signer[record.signer] += 1
        self._count += 1
        self._bytes += record.size
        heapq.heappush(self._expiry, (record.expiration, record.key, record.subkey))
        self._compact_heap()
        return True

    def store_many(self, records: Iterable[Record], now: float, *, source: Source = None) -> list[str]:
        """Store each record; one code per record: ``ok``, ``stale`` or a DHTRecordError code."""
        codes = []
        for record in records:
            try:
                codes.append(OK if self.store(record, now, source=source) else STALE)
            except DHTRecordError as exc:
                codes.append(exc.code)
        return codes

    def get(self, key: bytes, now: float) -> dict[bytes, Record]:
        """Live records (tombstones included, so requesters can merge them) under ``key``."""
        subkeys = self._data.get(bytes(key))
        if not subkeys:
            return {}
        return {sub: rec for sub, rec in subkeys.items() if rec.expiration > now}

    def records(self, now: float) -> Iterator[Record]:
        """Every live record (for hand-off to new close peers)."""
        for subkeys in self._data.values():
            for rec in subkeys.values():
                if rec.expiration > now:
                    yield rec

    def collect(self, now: float) -> int:
        """Drop every record expired at ``now``; returns how many."""
        dropped = 0
        while self._expiry and self._expiry[0][0] <= now:
            expiration, key, subkey = heapq.heappop(self._expiry)
            rec = self._data.get(key, {}).get(subkey)
            if rec is not None and rec.expiration <= now:
                self._drop(key, subkey)
                dropped += 1
        return dropped

    # --- internals ----------------------------------------------------------------------------
    def _make_room(self, record: Record, now: float, source: Source) -> None:
        config = self.config
        if self._per_signer[record.signer] >= config.max_records_per_signer:
            self.collect(now)
            if self._per_signer[record.signer] >= config.max_records_per_signer:
                raise DHTRecordError("too many records from this signer", "signer-quota")
        shares = self._shares.get(record.key)
        if shares is not None and shares.signers[record.signer] >= config.max_subkeys_per_signer_per_key:
            self.collect(now)
            shares = self._shares.get(record.key)
            if shares is not None and shares.signers[record.signer] >= config.max_subkeys_per_signer_per_key:
                raise DHTRecordError("this signer holds its share of sub-keys under this key", "signer-share")
        subkeys = self._data.get(record.key)
        if subkeys is not None and len(subkeys) >= config.max_subkeys_per_key:
            self.collect(now)
            subkeys = self._data.get(record.key)
            if subkeys is not None and len(subkeys) >= config.max_subkeys_per_key:
                victim = self._key_victim(record, source)
                if victim is None:
                    raise DHTRecordError("too many sub-keys under this key", "key-full")
                self._drop(record.key, victim)
                self.evicted += 1
        while self._count >= config.max_total_records or self._bytes + record.size > config.max_total_bytes:
            if self.collect(now):
                continue
            victim_source = self._largest_other_source(source)
            if victim_source is None:
                raise DHTRecordError("storage is full", "storage-full")
            key, subkey = next(iter(self._per_source[victim_source]))
            self._drop(key, subkey)
            self.evicted += 1

    def _key_victim(self, newcomer: Record, source: Source) -> bytes | None:
        """The sub-key a full key gives up for ``newcomer`` (largest holder first), None to refuse it.

        O(sub-keys of the key), paid only when a key is full: about what checking the newcomer's
        signature costs already."""
        shares = self._shares[newcomer.key]
        subkeys = self._data[newcomer.key]
        sources = Counter(shares.sources)
        sources[source] += 1
        top = max(sources.values())
        entries = [(rec, False) for sub, rec in subkeys.items() if sources[shares.source_of[sub]] == top]
        if sources[source] == top:
            entries.append((newcomer, True))
        signers = Counter(rec.signer for rec, _ in entries)
        top = max(signers.values())
        # soonest expiration loses; on a tie the newcomer loses (``not is_new`` sorts it first)
        loser, is_new = min(
            ((rec, new) for rec, new in entries if signers[rec.signer] == top), key=lambda e: (e[0].expiration, not e[1])
        )
        return None if is_new else loser.subkey

    def _largest_other_source(self, source: Source) -> Source | None:
        """The source holding the most records if it holds more than ``source`` would with one more."""
        mine = len(self._per_source.get(source, ())) + 1
        best, most = None, mine
        for other, held in self._per_source.items():
            if other != source and len(held) > most:
                best, most = other, len(held)
        return best

    def _move_source(self, key: bytes, subkey: bytes, signer: PeerID, source: Source) -> None:
        # a replacement may arrive from another address than the record it replaces
        shares = self._shares[key]
        old = shares.source_of[subkey]
        if old == source:
            return
        shares.remove(subkey, signer)
        shares.add(subkey, signer, source)
        self._unlist_source(old, key, subkey)
        self._per_source.setdefault(source, {})[(key, subkey)] = None

    def _unlist_source(self, source: Source, key: bytes, subkey: bytes) -> None:
        held = self._per_source[source]
        del held[(key, subkey)]
        if not held:
            del self._per_source[source]

    def _drop(self, key: bytes, subkey: bytes) -> None:
        subkeys = self._data[key]
        rec = subkeys.pop(subkey)
        shares = self._shares[key]
        source = shares.remove(subkey, rec.signer)
        if not subkeys:
            del self._data[key]
            del self._shares[key]
        self._unlist_source(source, key, subkey)
        _decrement(self._per_signer, rec.signer)
        self._count -= 1
        self._bytes -= rec.size

    def _compact_heap(self) -> None:
        # replaced records leave stale heap entries; rebuild before they outnumber live ones
        if len(self._expiry) > 2 * self._count + 1024:
            self._expiry = [
                (rec.expiration, key, sub) for key, subs in self._data.items() for sub, rec in subs.items()
            ]
            heapq.heapify(self._expiry)
