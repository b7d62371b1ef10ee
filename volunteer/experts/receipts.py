"""Signed reply receipts: what a host commits to when it answers a forward or a backward.

Every forward and backward reply of our expert server carries a ``Receipt`` in its header (field
``"r"``), signed with the host's identity key: the expert's uid and class, the call (``f`` or
``b``), the state that computed it (``version``, and ``state``: the id of the host's snapshot of
it, ``snapshots.py``), digests of the inputs the host computed from (``inputs``: the decoded
tensors, inputs then output gradients for a backward) and of the reply as it went on the wire
(``outputs``: the tensors header and payload bytes), and what an exact recompute needs: the rows
computed together (``batch``), the inputs' dtype, the device kind, the torch threads, the reply's
encoding.

The trainer checks per call only what is cheap and local (``Receipt.from_wire`` parses it, and
``check_reply`` compares the uid, the call and the reply's digest with what arrived: one hash of
the bytes it read); a reply without one that passes is a failed call. The signature is checked
where a receipt becomes evidence (an exact audit, a published proof: ``Receipt.verify``), because
over an authenticated stream the bytes can only come from the host, and a signature is what lets
another peer believe it too.

A receipt names its state by an id, not by a digest of it: a digest of the module per state
version (one per optimizer step while the expert trains) sat on the reply's path and cost more
than the call (a 32 MB expert: 60 ms of sha256). The host copies the state once per version and
digests it only when an auditor fetches it, then signs a ``StateBinding`` (this id is that digest)
with the snapshot. Both are signed, so a host that served two states under one id has signed two
bindings that contradict each other; and whatever state it serves, a reply it does not reproduce is
a proof. Pure: no trio, no clock.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import msgpack
import torch

from ..errors import ExpertProtocolError
from ..net.identity import KeyPair, PeerID, signed_by
from ..net.multiaddr import Multiaddr
from ..wire import unpack_bounded

DIGEST = 32  # bytes of every digest (sha256)
SIGNED = b"volunteer/receipt/1\n"  # domain of the signature: no other signed message reads as a receipt
BOUND = b"volunteer/state-binding/1\n"  # domain of a snapshot's binding of its id to its digest
MAX_RECEIPT = 2048  # bytes of a receipt on the wire (msgpack), signature included
FORWARD, BACKWARD = "f", "b"
_MAX_TEXT = 256


def tensor_digest(tensors: Sequence[torch.Tensor]) -> bytes:
    """A digest of tensors' dtypes, shapes and values (exact bytes; CPU tensors)."""
    digest = hashlib.sha256()
    for tensor in tensors:
        tensor = tensor.detach()
        digest.update(f"{str(tensor.dtype)}{tuple(tensor.shape)};".encode())
        if tensor.numel():
            flat = tensor.contiguous().reshape(-1).view(torch.uint8)
            digest.update(flat.numpy().data)
    return digest.digest()


class PayloadDigest:
    """The digest of a reply as it travels: its tensors header, then its payload bytes in any
    chunking (the server hashes what it sends, the trainer what it reads)."""

    def __init__(self, header: dict) -> None:
        self._hash = hashlib.sha256(msgpack.packb(header, use_bin_type=True))

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        self._hash.update(chunk)

    def digest(self) -> bytes:
        return self._hash.digest()


def payload_digest(header: dict, chunks: Iterable[bytes | bytearray | memoryview]) -> bytes:
    """``PayloadDigest`` of a whole reply."""
    found = PayloadDigest(header)
    for chunk in chunks:
        found.update(chunk)
    return found.digest()


@dataclass(frozen=True)
class Receipt:
    """One reply's signed commitment (see the module docstring)."""

    peer: bytes  # the signer's PeerID bytes (its public key is inlined in it)
    uid: str
    op: str  # FORWARD or BACKWARD
    expert_class: str
    hidden_dim: int | None
    version: int
    state: bytes  # the id of the host's snapshot of the state that computed the reply (snapshots.py)
    inputs: bytes  # tensor_digest of the inputs (a backward: inputs, then output gradients)
    outputs: bytes  # payload_digest of the reply
    batch: int  # rows computed together (this call's and others' batched with it)
    dtype: str
    device: str
    threads: int
    compression: str  # the reply's encoding
    signature: bytes = b""

    def signed_part(self) -> bytes:
        """The bytes the signature covers."""
        return SIGNED + msgpack.packb(self._fields(), use_bin_type=True)

    def _fields(self) -> list:
        return [self.peer, self.uid, self.op, self.expert_class, self.hidden_dim, self.version, self.state,
                self.inputs, self.outputs, self.batch, self.dtype, self.device, self.threads, self.compression]

    def sign(self, keypair: KeyPair) -> "Receipt":
        """This receipt signed with ``keypair`` (whose PeerID it must name)."""
        signature = keypair.sign(self.signed_part())  # on a reply's path: no dataclasses.replace()
        return Receipt(self.peer, self.uid, self.op, self.expert_class, self.hidden_dim, self.version, self.state,
                       self.inputs, self.outputs, self.batch, self.dtype, self.device, self.threads, self.compression,
                       signature)

    @property
    def signer(self) -> PeerID:
        return PeerID.from_bytes(self.peer)

    def verify(self, peer: object | None = None) -> bool:
        """Whether the signature is the named signer's (and the signer is ``peer``, if given)."""
        return _signed_by_named(self.peer, self.signed_part(), self.signature, peer)

    def to_wire(self) -> list:
        """The msgpack array in a reply header."""
        return [*self._fields(), self.signature]

    def encode(self) -> bytes:
        return msgpack.packb(self.to_wire(), use_bin_type=True)

    @classmethod
    def from_wire(cls, item: object) -> "Receipt":
        """Parse an untrusted receipt; ExpertProtocolError on anything malformed."""
        if not isinstance(item, (list, tuple)) or len(item) != 15:
            raise ExpertProtocolError("reply receipt must be a list of 15 fields")
        (peer, uid, op, expert_class, hidden_dim, version, state, inputs, outputs, batch, dtype, device, threads,
         compression, signature) = item
        for value, what in ((peer, "peer"), (signature, "signature")):
            if not isinstance(value, bytes) or not 0 < len(value) <= 128:
                raise ExpertProtocolError(f"reply receipt's {what} is malformed")
        for value, what in ((state, "state digest"), (inputs, "inputs digest"), (outputs, "outputs digest")):
            if not isinstance(value, bytes) or len(value) != DIGEST:
                raise ExpertProtocolError(f"reply receipt's {what} is malformed")
        for value, what in ((uid, "uid"), (expert_class, "class"), (dtype, "dtype"), (device, "device"),
                            (compression, "compression")):
            if not isinstance(value, str) or len(value) > _MAX_TEXT:
                raise ExpertProtocolError(f"reply receipt's {what} is malformed")
        if op not in (FORWARD, BACKWARD):
            raise ExpertProtocolError("reply receipt's call is neither forward nor backward")
        for value, what in ((version, "version"), (batch, "batch"), (threads, "threads")):
            if type(value) is not int or not 0 <= value < 2**63:
                raise ExpertProtocolError(f"reply receipt's {what} is malformed")
        if hidden_dim is not None and (type(hidden_dim) is not int or not 0 < hidden_dim < 2**31):
            raise ExpertProtocolError("reply receipt's hidden_dim is malformed")
        return cls(peer, uid, op, expert_class, hidden_dim, version, state, inputs, outputs, batch, dtype, device,
                   threads, compression, signature)

    @classmethod
    def decode(cls, data: bytes) -> "Receipt":
        """Parse an untrusted receipt from its own bytes; ExpertProtocolError on anything malformed."""
        item = unpack_bounded(data, MAX_RECEIPT, "receipt", ExpertProtocolError, list)
        return cls.from_wire(item)


@dataclass(frozen=True)
class StateBinding:
    """A host's signed word, sent with a snapshot it serves: the snapshot with id ``state`` (which
    its receipts name) holds module tensors whose ``snapshots.state_digest`` is ``digest``."""

    peer: bytes  # the signer's PeerID bytes
    uid: str
    state: bytes  # the snapshot's id, as receipts name it
    version: int
    digest: bytes  # snapshots.state_digest of its tensors
    signature: bytes = b""

    def signed_part(self) -> bytes:
        return BOUND + msgpack.packb([self.peer, self.uid, self.state, self.version, self.digest], use_bin_type=True)

    def sign(self, keypair: KeyPair) -> "StateBinding":
        return replace(self, signature=keypair.sign(self.signed_part()))

    def verify(self, peer: object | None = None) -> bool:
        """Whether the signature is the named signer's (and the signer is ``peer``, if given)."""
        return _signed_by_named(self.peer, self.signed_part(), self.signature, peer)

    def to_wire(self) -> list:
        return [self.peer, self.uid, self.state, self.version, self.digest, self.signature]

    @classmethod
    def from_wire(cls, item: object) -> "StateBinding":
        """Parse an untrusted binding; ExpertProtocolError on anything malformed."""
        if not isinstance(item, (list, tuple)) or len(item) != 6:
            raise ExpertProtocolError("a snapshot's binding must be a list of 6 fields")
        peer, uid, state, version, digest, signature = item
        for value, what in ((peer, "peer"), (signature, "signature")):
            if not isinstance(value, bytes) or not 0 < len(value) <= 128:
                raise ExpertProtocolError(f"a snapshot's binding's {what} is malformed")
        for value, what in ((state, "id"), (digest, "digest")):
            if not isinstance(value, bytes) or len(value) != DIGEST:
                raise ExpertProtocolError(f"a snapshot's binding's {what} is malformed")
        if not isinstance(uid, str) or len(uid) > _MAX_TEXT:
            raise ExpertProtocolError("a snapshot's binding's uid is malformed")
        if type(version) is not int or not 0 <= version < 2**63:
            raise ExpertProtocolError("a snapshot's binding's version is malformed")
        return cls(peer, uid, state, version, digest, signature)


def _signed_by_named(signer: bytes, message: bytes, signature: bytes, peer: object | None) -> bool:
    """``signature`` over ``message`` is by ``signer`` (PeerID bytes), and ``signer`` is ``peer`` if given."""
    if peer is not None and _peer_bytes(peer) != signer:
        return False
    return signed_by(signer, message, signature)


def check_reply(receipt: Receipt | None, *, uid: str, op: str, outputs: bytes, peer: object) -> Receipt:
    """The per-call check of a reply's receipt (no signature: see the module docstring): it is
    there, names this call and this host, and its outputs digest is that of what arrived.
    ExpertProtocolError otherwise: the call failed."""
    if receipt is None:
        raise ExpertProtocolError(f"{peer} sent a reply to {uid!r} without a receipt")
    wanted = FORWARD if op == "forward" else BACKWARD
    if receipt.uid != uid or receipt.op != wanted:
        raise ExpertProtocolError(f"{peer}'s receipt names {receipt.uid!r}/{receipt.op}, not this call to {uid!r}")
    expected = _peer_bytes(peer) if peer is not None else None
    if expected is not None and receipt.peer != expected:
        raise ExpertProtocolError(f"{peer}'s receipt is signed for another host")
    if receipt.outputs != outputs:
        raise ExpertProtocolError(f"{peer}'s receipt does not match the reply it sent for {uid!r}")
    return receipt


def _peer_bytes(peer: object) -> bytes | None:
    """The PeerID bytes a host is named by (a PeerID, its string, or a multiaddr ending in it)."""
    if isinstance(peer, Multiaddr):
        peer = peer.peer_id
    if isinstance(peer, PeerID):
        return peer.to_bytes()
    try:
        return PeerID.from_string(str(peer)).to_bytes()
    except Exception:  # noqa: BLE001 - a name that is no PeerID (a test's) names nobody
        return None


def binds(binding: StateBinding, receipt: Receipt) -> bool:
    """Whether ``binding`` is signed by the receipt's signer for the state the receipt names (its
    id, uid and version): the word a digest of that state is checked against."""
    return (binding.peer == receipt.peer and binding.uid == receipt.uid and binding.state == receipt.state
            and binding.version == receipt.version and binding.verify())


__all__ = [
    "BACKWARD", "DIGEST", "FORWARD", "MAX_RECEIPT", "PayloadDigest", "Receipt", "StateBinding", "binds", "check_reply",
    "payload_digest", "tensor_digest",
]
