"""Shared verdicts: accusations that carry their evidence, stored in the DHT under the accused's key.

A trainer whose exact audit caught a host (``experts/audit.py``: a recompute contradicted a reply
the host signed) publishes an ``Accusation``: swarm, accuser and accused PeerIDs, the expert, the
time, and the **evidence** (opaque here: the accused's signed receipt, the call's inputs and the
reply as it travelled, encoded by ``experts/verdicts.py``), signed by the accuser. It is stored
twice: under ``proof_key(accused)``, sub-key the accuser (one accusation per accuser and accused,
a newer one replacing the older), where anyone who is about to deal with a host looks; and as a
pointer under ``PROOFS_KEY``, sub-key accuser + accused (a sub-key begins with its signer's
PeerID), so a reader that knows no names (a trainer that never called the accused, the relay's
health page) finds whom to look up. The DHT keeps ``max_subkeys_per_signer_per_key`` (4) sub-keys
of one signer under a key: an accuser points to at most 4 accused at once in the index (its
further proofs are still stored under their accused's keys, where the hosts' co-replicas and the
trainers that deal with them look).

**Chunked evidence.** Evidence of up to ``MAX_EVIDENCE`` bytes (about 7 KiB: some 1,700 float32
values of inputs, gradients and reply) rides inline. Larger evidence (a width-64 forward of 32
rows is ~24 KiB, a width-1024 forward of 64 rows ~0.5 MiB) is split into ``CHUNK_SIZE`` pieces,
each its own DHT record under ``chunk_key(digest, index)`` (the evidence's SHA-256 and the
piece's index: one key per piece, so the DHT's 4 sub-keys per signer and key never bind), sub-key
the accuser; the accusation then carries an ``EvidenceRef`` (digest, size, piece count) in place
of the evidence, and its signature covers that. The pieces need no signature of their own: a
reader (``assemble``) joins the accuser's pieces and keeps the result only if it hashes to the
signed digest. A reader fetches at most ``MAX_CHUNKS`` (128) pieces, ``MAX_CHUNKED_EVIDENCE``
bytes (about 1 MiB: a width-1024 backward of 64 rows fits); an accusation claiming more is
refused unread, and one whose pieces are missing or do not hash to the digest changes nothing.
The pieces count against the accuser's ``max_records_per_signer`` (1,024) on each peer storing
them: a peer publishes a few large proofs at a time, not hundreds.

This module only stores and validates signatures: an accusation counts as *stored by its author*
when its signature is the named accuser's and the DHT record's signer is that accuser. Whether
it is *true* is a recompute (``experts/verdicts.py``): the DHT cannot check it and never imports
the experts. Anyone can accuse anyone; an accusation is worth only the evidence another peer
checks. Pure: no trio, no clock (``now`` is passed in).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Mapping

import msgpack

from ..errors import DHTRecordError
from ..net.identity import KeyPair, names_a_peer, signed_by
from ..wire import unpack_bounded

PROOFS_KEY = b"volunteer-proofs"  # the index: sub-key accuser + accused PeerID bytes, value the accused's
PROOF_KEY_PREFIX = b"volunteer-proof/"  # + the accused's PeerID bytes: its accusations, sub-key the accuser
SIGNED = b"volunteer/accusation/1\n"  # domain of the signature: no other signed message reads as one
# bytes of an encoded accusation: a DHT value (``DHTConfig.max_value_size``, 8 KiB) less room for
# the record's own fields; the evidence is what is left (``MAX_EVIDENCE``)
MAX_ACCUSATION = 8 * 1024 - 256
MAX_EVIDENCE = MAX_ACCUSATION - 768
CHUNK_KEY_PREFIX = b"volunteer-proof-chunk/"  # + the evidence's digest + the piece's index (2 bytes)
CHUNK_SIZE = 8 * 1024 - 256  # bytes of one piece of chunked evidence: a DHT value less its record's room
MAX_CHUNKS = 128  # pieces a reader fetches for one accusation
MAX_CHUNKED_EVIDENCE = MAX_CHUNKS * CHUNK_SIZE  # ~1 MiB: bytes of evidence a reader assembles
_DIGEST = 32  # bytes of a SHA-256
_MAX_ID = 128  # bytes of a PeerID
_MAX_TEXT = 256


def proof_key(accused: bytes) -> bytes:
    """The DHT key under which ``accused``'s accusations are stored."""
    return PROOF_KEY_PREFIX + bytes(accused)


def chunk_key(digest: bytes, index: int) -> bytes:
    """The DHT key of piece ``index`` of the evidence whose SHA-256 is ``digest``."""
    return CHUNK_KEY_PREFIX + bytes(digest) + int(index).to_bytes(2, "big")


@dataclass(frozen=True)
class EvidenceRef:
    """Where chunked evidence is: its SHA-256, its size in bytes and its piece count."""

    digest: bytes
    size: int
    chunks: int

    def to_wire(self) -> list:
        return [self.digest, self.size, self.chunks]

    @classmethod
    def from_wire(cls, item: object) -> "EvidenceRef":
        """Parse an untrusted reference; DHTRecordError past the bounds or inconsistent."""
        if not isinstance(item, list) or len(item) != 3:
            raise _refused("an evidence reference is a list of 3 fields")
        digest, size, chunks = item
        if not isinstance(digest, bytes) or len(digest) != _DIGEST:
            raise _refused("evidence reference's digest is malformed")
        if not isinstance(size, int) or not MAX_EVIDENCE < size <= MAX_CHUNKED_EVIDENCE:
            raise _refused(f"chunked evidence must be over {MAX_EVIDENCE} and at most {MAX_CHUNKED_EVIDENCE} bytes")
        if not isinstance(chunks, int) or chunks != -(-size // CHUNK_SIZE):
            raise _refused("evidence reference's piece count does not match its size")
        return cls(digest, size, chunks)


def split_evidence(evidence: bytes) -> tuple[EvidenceRef, list[bytes]]:
    """``evidence`` (more than ``MAX_EVIDENCE``, at most ``MAX_CHUNKED_EVIDENCE`` bytes) as a
    reference and its pieces; ValueError outside those bounds."""
    if not MAX_EVIDENCE < len(evidence) <= MAX_CHUNKED_EVIDENCE:
        raise ValueError(f"{len(evidence)} bytes of evidence are not chunked (over {MAX_EVIDENCE}, at most {MAX_CHUNKED_EVIDENCE})")
    pieces = [bytes(evidence[i:i + CHUNK_SIZE]) for i in range(0, len(evidence), CHUNK_SIZE)]
    return EvidenceRef(hashlib.sha256(evidence).digest(), len(evidence), len(pieces)), pieces


def chunk_items(ref: EvidenceRef, pieces: list[bytes], accuser: bytes,
                expiration: float) -> list[tuple[bytes, bytes, bytes, float]]:
    """The DHT items of chunked evidence's pieces (key, sub-key the accuser, piece, expiration)."""
    return [(chunk_key(ref.digest, i), bytes(accuser), piece, float(expiration)) for i, piece in enumerate(pieces)]


def assemble(ref: EvidenceRef, accuser: bytes, found: Mapping[bytes, Mapping[bytes, object]], now: float) -> bytes | None:
    """The evidence ``ref`` names, joined from the accuser's live pieces among ``found`` (key →
    sub-key → ``records.Record``); None if a piece is missing or the whole does not hash to the
    digest (nothing then is believed)."""
    pieces = []
    for i in range(ref.chunks):
        record = found.get(chunk_key(ref.digest, i), {}).get(bytes(accuser))
        value = getattr(record, "value", None)
        if not isinstance(value, bytes) or getattr(record, "expiration", 0.0) <= now or len(value) > CHUNK_SIZE:
            return None
        pieces.append(value)
    evidence = b"".join(pieces)
    if len(evidence) != ref.size or hashlib.sha256(evidence).digest() != ref.digest:
        return None
    return evidence


@dataclass(frozen=True)
class Accusation:
    """An accuser's signed claim that ``accused`` lied, with the evidence to check it."""

    swarm: str
    accuser: bytes  # the signer's PeerID bytes
    accused: bytes
    uid: str  # the expert the lie was about
    at: float  # when it was signed (the accuser's clock)
    evidence: bytes | EvidenceRef  # experts.verdicts.Evidence, encoded, or where its pieces are
    signature: bytes = b""

    def _fields(self) -> list:
        evidence = self.evidence.to_wire() if isinstance(self.evidence, EvidenceRef) else self.evidence
        return [self.swarm, self.accuser, self.accused, self.uid, float(self.at), evidence]

    def signed_part(self) -> bytes:
        """The bytes the signature covers."""
        return SIGNED + msgpack.packb(self._fields(), use_bin_type=True)

    def sign(self, keypair: KeyPair) -> "Accusation":
        return replace(self, signature=keypair.sign(self.signed_part()))

    def verify(self) -> bool:
        """Whether the signature is the named accuser's."""
        return signed_by(self.accuser, self.signed_part(), self.signature)

    @property
    def digest(self) -> bytes:
        """What makes two accusations the same proof: the evidence's SHA-256 (one recompute per
        distinct evidence, inline or chunked)."""
        if isinstance(self.evidence, EvidenceRef):
            return self.evidence.digest
        return hashlib.sha256(self.evidence).digest()

    def encode(self) -> bytes:
        return msgpack.packb([*self._fields(), self.signature], use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> "Accusation":
        """Parse an untrusted accusation (signature unchecked: ``verify``); DHTRecordError
        (code ``bad-accusation``) if malformed or past ``MAX_ACCUSATION``."""
        item = unpack_bounded(data, MAX_ACCUSATION, "accusation", _refused, list)
        if len(item) != 7:
            raise _refused("an accusation is a list of 7 fields")
        swarm, accuser, accused, uid, at, evidence, signature = item
        for text in (swarm, uid):
            if not isinstance(text, str) or len(text) > _MAX_TEXT:
                raise _refused("accusation's swarm or expert is malformed")
        for value in (accuser, accused, signature):
            if not isinstance(value, bytes) or not 0 < len(value) <= _MAX_ID:
                raise _refused("accusation's accuser, accused or signature is malformed")
        if not isinstance(at, float) or not math.isfinite(at):
            raise _refused("accusation's time is malformed")
        if isinstance(evidence, list):
            evidence = EvidenceRef.from_wire(evidence)
        elif not isinstance(evidence, bytes) or not 0 < len(evidence) <= MAX_EVIDENCE:
            raise _refused("accusation's evidence is malformed")
        return cls(swarm, accuser, accused, uid, at, evidence, signature)


def accusation_items(accusation: Accusation, expiration: float) -> list[tuple[bytes, bytes, bytes, float]]:
    """The DHT items of ``accusation`` (key, sub-key, value, expiration): the accusation under the
    accused's key, and its pointer in the index."""
    return [
        (proof_key(accusation.accused), accusation.accuser, accusation.encode(), float(expiration)),
        (PROOFS_KEY, accusation.accuser + accusation.accused, accusation.accused, float(expiration)),
    ]


def accused_in_index(records: Mapping[bytes, object], now: float) -> list[bytes]:
    """The accused PeerIDs the index's live ``records`` (sub-key → ``records.Record``) point to,
    each once, in sub-key order. A pointer is only a name to look up: it proves nothing."""
    found: dict[bytes, None] = {}
    for subkey, record in sorted(records.items()):
        value = getattr(record, "value", None)
        if value is None or getattr(record, "expiration", 0.0) <= now or not isinstance(value, bytes):
            continue
        if 0 < len(value) <= _MAX_ID and len(subkey) > len(value) and subkey.endswith(value) and names_a_peer(value):
            found[value] = None
    return list(found)


def accusations_of(accused: bytes, records: Mapping[bytes, object], swarm: str, now: float) -> tuple[list[Accusation], int]:
    """The accusations against ``accused`` among the live ``records`` of its key that were
    stored by their author: well formed, for this swarm, naming ``accused``, signed by the accuser
    named, and the DHT record signed by that same peer. Returns them and how many were refused."""
    found, refused = [], 0
    for record in records.values():
        value = getattr(record, "value", None)
        if value is None or getattr(record, "expiration", 0.0) <= now:
            continue
        try:
            accusation = Accusation.decode(value)
        except DHTRecordError:
            refused += 1
            continue
        signer = getattr(record, "signer", None)
        if (accusation.swarm != swarm or accusation.accused != bytes(accused) or accusation.accuser == accusation.accused
                or signer is None or signer.to_bytes() != accusation.accuser or not accusation.verify()):
            refused += 1
            continue
        found.append(accusation)
    return found, refused


def _refused(message: str) -> DHTRecordError:
    """A malformed accusation is a refused DHT record, as a malformed vouch is."""
    return DHTRecordError(message, "bad-accusation")


__all__ = [
    "CHUNK_KEY_PREFIX", "CHUNK_SIZE", "MAX_ACCUSATION", "MAX_CHUNKED_EVIDENCE", "MAX_CHUNKS", "MAX_EVIDENCE", "PROOFS_KEY",
    "PROOF_KEY_PREFIX", "Accusation", "EvidenceRef", "accusation_items", "accusations_of", "accused_in_index", "assemble",
    "chunk_items", "chunk_key", "proof_key", "split_evidence",
]
