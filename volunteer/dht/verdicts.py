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
from ..net.identity import KeyPair, PeerID, signed_by
from ..wire import unpack_bounded

PROOFS_KEY = b"volunteer-proofs"  # the index: sub-key accuser + accused PeerID bytes, value the accused's
PROOF_KEY_PREFIX = b"volunteer-proof/"  # + the accused's PeerID bytes: its accusations, sub-key the accuser
SIGNED = b"volunteer/accusation/1\n"  # domain of the signature: no other signed message reads as one
# bytes of an encoded accusation: a DHT value (``DHTConfig.max_value_size``, 8 KiB) less room for
# the record's own fields; the evidence is what is left (``MAX_EVIDENCE``)
MAX_ACCUSATION = 8 * 1024 - 256
MAX_EVIDENCE = MAX_ACCUSATION - 768
_MAX_ID = 128  # bytes of a PeerID
_MAX_TEXT = 256


def proof_key(accused: bytes) -> bytes:
    """The DHT key under which ``accused``'s accusations are stored."""
    return PROOF_KEY_PREFIX + bytes(accused)


@dataclass(frozen=True)
class Accusation:
    """An accuser's signed claim that ``accused`` lied, with the evidence to check it."""

    swarm: str
    accuser: bytes  # the signer's PeerID bytes
    accused: bytes
    uid: str  # the expert the lie was about
    at: float  # when it was signed (the accuser's clock)
    evidence: bytes  # experts.verdicts.Evidence, encoded
    signature: bytes = b""

    def _fields(self) -> list:
        return [self.swarm, self.accuser, self.accused, self.uid, float(self.at), self.evidence]

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
        """What makes two accusations the same proof: the evidence (one recompute per distinct one)."""
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
        if not isinstance(evidence, bytes) or not 0 < len(evidence) <= MAX_EVIDENCE:
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
        if 0 < len(value) <= _MAX_ID and len(subkey) > len(value) and subkey.endswith(value) and _is_peer(value):
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


def _is_peer(data: bytes) -> bool:
    try:
        PeerID.from_bytes(data)
    except Exception:  # noqa: BLE001 - whatever the parser raised, it names nobody
        return False
    return True


__all__ = [
    "MAX_ACCUSATION", "MAX_EVIDENCE", "PROOFS_KEY", "PROOF_KEY_PREFIX", "Accusation", "accusation_items",
    "accusations_of", "accused_in_index", "proof_key",
]
