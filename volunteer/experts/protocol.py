"""The experts wire protocol ``/volunteer/<swarm-id>/experts/1.0.0``: one call per stream.

Request: a uvarint-length-prefixed msgpack header, then the tensors' payload bytes::

    {"op": "info" | "forward" | "backward" | "snapshot", "uid": "expert.3.5",
     "c": compression wanted for the reply,            # see tensors.COMPRESSIONS
     "t": tensors header (tensors.serialize),          # forward: inputs; backward: inputs + grads
     "ni": number of inputs among the tensors,         # backward only
     "g": true,                                        # forward only, optional: a backward of
                                                       # these inputs will follow (keep the graph)
     "k": key,                                         # backward only, optional: the inputs are
                                                       # the ones the forward's reply said it kept
                                                       # under this key ("ni" is then 0: only
                                                       # the gradients travel)
     "cr": bytes}                                      # optional: the caller's trainer
                                                       # certificate (trainers.TrainerCertificate),
                                                       # for swarms whose organiser admits trainers
     "d": bytes}                                       # snapshot only: the state id a receipt
                                                       # named (snapshots.py)

Reply: the same framing::

    {"ok": true, "t": tensors header,                  # forward / backward, then the payload
     "st": seconds the call spent on the volunteer,    # optional: queued and computing
     "k": key,                                         # forward with "g", optional: the inputs
                                                       # are kept for the backward under this key
     "r": receipt}                                     # forward / backward: the signed receipt
                                                       # (receipts.Receipt.to_wire); a trainer
                                                       # takes no reply without a valid one
    {"ok": true, "t": tensors header,                  # snapshot: the module tensors, then their
     "sn": {"u": uid, "v": version, "n": [names],      # payload; "b": the host's signed binding of
            "b": binding}}                             # the id to their digest (receipts.StateBinding)
    {"ok": true, "info": {...}}                        # info
    {"ok": false, "e": failure dict}                   # failures.to_failure

A backward whose key the server no longer holds fails with kind ``forgotten``; the caller sends
it again with the inputs. Peers that do not know "k" and "st" ignore them: an old server keeps
nothing and says no key, an old caller sends the inputs.

The lazy multistream-select of the Host sends the protocol name, the header and the first payload
bytes in one write: a call costs one round trip. Headers are bounded by ``MAX_HEADER``, payloads
by ``ExpertsConfig.max_payload_bytes``; everything is checked before a byte is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import msgpack

from ..errors import ExpertProtocolError
from ..net.varint import encode_uvarint
from .tensors import COMPRESSIONS

MAX_HEADER = 64 * 1024
MAX_UID = 256  # characters of an expert uid in a request
MAX_KEY = 2**63 - 1  # kept-inputs keys are non-negative int64s
OPS = ("info", "forward", "backward", "snapshot")
MAX_SNAPSHOT_NAMES = 1024  # tensors named in a snapshot reply
MAX_CREDENTIAL = 1024  # bytes of a trainer certificate in a header (trainers.MAX_CERT_BYTES)


def protocol_id(swarm_id: str) -> str:
    """The experts protocol of a swarm."""
    return f"/volunteer/{swarm_id}/experts/1.0.0"


def pack_map(message: Mapping[str, Any], limit: int, error: type[Exception], what: str) -> bytes:
    """``message`` as a uvarint-framed msgpack map: the framing of the expert protocol's headers
    and of the protocols built on it (replica state and sync); ``error`` beyond ``limit`` bytes."""
    body = msgpack.packb(dict(message), use_bin_type=True)
    if len(body) > limit:
        raise error(f"{what} of {len(body)} bytes exceeds {limit}")
    return encode_uvarint(len(body)) + body


def unpack_map(body: bytes, error: type[Exception], what: str) -> dict:
    """Parse a framed message's body; anything but a msgpack map raises ``error``."""
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True, max_ext_len=0)
    except Exception:  # msgpack raises several unrelated types for bad bytes
        raise error(f"{what} is not valid msgpack") from None
    if not isinstance(message, dict):
        raise error(f"{what} must be a msgpack map")
    return message


def pack(message: dict) -> bytes:
    """A framed msgpack message."""
    return pack_map(message, MAX_HEADER, ExpertProtocolError, "message header")


def unpack(body: bytes) -> dict:
    """Parse a header body; anything but a msgpack map is an ExpertProtocolError."""
    return unpack_map(body, ExpertProtocolError, "header")


def _field(message: dict, name: str, kind: type | tuple, what: str) -> Any:
    value = message.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise ExpertProtocolError(f"request field {name!r} ({what}) is missing or mistyped")
    return value


def announced_payload(message: dict) -> int:
    """Payload bytes a (not yet validated) request header says will follow, so a server that
    refuses the header can still drain what the caller sends; 0 when it says nothing usable."""
    tensors = message.get("t")
    if isinstance(tensors, dict) and type(tensors.get("n")) is int:
        return max(0, tensors["n"])
    return 0


@dataclass(frozen=True)
class Request:
    """One expert call's header. ``tensors`` is the tensors header (``tensors.serialize``) for
    forward (inputs) and backward (inputs then gradients; ``n_inputs`` of them are inputs)."""

    op: str
    uid: str
    compression: str = "none"
    tensors: dict | None = None
    n_inputs: int = 0
    keep_graph: bool = False  # forward: the caller will send the backward of these inputs
    kept: int | None = None  # backward: the inputs are those the server kept under this key
    credential: bytes | None = None  # forward/backward: the caller's trainer certificate
    digest: bytes | None = None  # snapshot: the state id a receipt named

    def with_tensors(self, header: dict) -> "Request":
        """This request carrying the tensors header ``header`` (``dataclasses.replace`` costs a
        dozen Python calls more, on every call's path)."""
        return Request(self.op, self.uid, self.compression, header, self.n_inputs, self.keep_graph, self.kept,
                       self.credential, self.digest)

    @property
    def payload_bytes(self) -> int:
        """Payload bytes that follow the header (0 for info)."""
        return announced_payload({"t": self.tensors}) if self.tensors is not None else 0

    def to_message(self) -> dict:
        """The msgpack map (the one place its keys are spelled, with ``from_message``)."""
        message: dict = {"op": self.op, "uid": self.uid, "c": self.compression}
        if self.op == "snapshot":
            message["d"] = self.digest
            return message
        if self.op != "info":
            message["t"] = self.tensors
        if self.op == "backward":
            message["ni"] = self.n_inputs
        if self.op == "forward" and self.keep_graph:
            message["g"] = True
        if self.op == "backward" and self.kept is not None:
            message["k"] = self.kept
        if self.op != "info" and self.credential:
            message["cr"] = self.credential
        return message

    def encode(self) -> bytes:
        """The framed header (the payload follows it on the stream)."""
        return pack(self.to_message())

    @classmethod
    def from_message(cls, message: dict) -> "Request":
        """Validate an untrusted header map; ExpertProtocolError on anything off."""
        op = _field(message, "op", str, "operation")
        if op not in OPS:
            raise ExpertProtocolError(f"unknown operation {op[:32]!r}; expected one of {', '.join(OPS)}")
        uid = _field(message, "uid", str, "expert uid")
        if not uid or len(uid) > MAX_UID:
            raise ExpertProtocolError(f"expert uid must be 1-{MAX_UID} characters")
        compression = message.get("c", "none")
        if not isinstance(compression, str) or compression not in COMPRESSIONS:
            raise ExpertProtocolError(f"unknown compression {str(compression)[:32]!r}; known: {', '.join(COMPRESSIONS)}")
        if op == "info":
            return cls(op, uid, compression)
        if op == "snapshot":
            digest = message.get("d")
            if not isinstance(digest, bytes) or len(digest) != 32:
                raise ExpertProtocolError("snapshot: 'd' must be a 32-byte state id")
            return cls(op, uid, compression, digest=digest)
        tensors = _field(message, "t", dict, "tensors header")
        count = len(tensors["t"]) if isinstance(tensors.get("t"), (list, tuple)) else 0
        inputs = count
        kept = None
        if op == "backward":
            inputs = _field(message, "ni", int, "number of inputs")
            if "k" in message:
                kept = _key(message["k"])
                if inputs != 0 or count == 0:
                    raise ExpertProtocolError("backward with kept inputs: 'ni' must be 0 and gradients must follow")
            elif not 0 < inputs < count:
                raise ExpertProtocolError(f"backward: {inputs} inputs among {count} tensors leaves no gradients")
        credential = message.get("cr")
        if credential is not None and (not isinstance(credential, bytes) or len(credential) > MAX_CREDENTIAL):
            raise ExpertProtocolError(f"trainer certificate must be at most {MAX_CREDENTIAL} bytes")
        return cls(op, uid, compression, tensors, inputs, op == "forward" and message.get("g") is True, kept, credential)

    @classmethod
    def decode(cls, body: bytes) -> "Request":
        """Parse and validate a header body (without its length prefix)."""
        return cls.from_message(unpack(body))


def _key(value: object) -> int:
    if type(value) is not int or not 0 <= value <= MAX_KEY:
        raise ExpertProtocolError("kept-inputs key must be a non-negative int64")
    return value


@dataclass(frozen=True)
class Reply:
    """One call's reply header: a result (``tensors`` header, payload follows; or ``info``) or a
    ``failure`` dict (``failures.to_failure``; checked by ``failures.check_failure``). A result
    may say how long the call spent on the volunteer (``server_s``) and, for a forward, the key
    under which its inputs are kept for the backward (``kept``)."""

    ok: bool
    tensors: dict | None = None
    info: dict | None = None
    failure: dict | None = None
    server_s: float | None = None
    kept: int | None = None
    receipt: list | None = None  # forward/backward: receipts.Receipt.to_wire (parsed by its reader)
    snapshot: dict | None = None  # snapshot: {"u": uid, "v": version, "n": names}

    @classmethod
    def result(cls, tensors: dict, *, server_s: float | None = None, kept: int | None = None,
               receipt: list | None = None) -> "Reply":
        """A forward/backward result; its payload follows the header."""
        return cls(True, tensors=tensors, server_s=server_s, kept=kept, receipt=receipt)

    @classmethod
    def of_snapshot(cls, tensors: dict, snapshot: dict) -> "Reply":
        """A snapshot's tensors (their payload follows) and what names them."""
        return cls(True, tensors=tensors, snapshot=snapshot)

    @classmethod
    def of_info(cls, info: dict) -> "Reply":
        """An info result."""
        return cls(True, info=info)

    @classmethod
    def error(cls, failure: dict) -> "Reply":
        """An error reply; the server ends the stream after it."""
        return cls(False, failure=failure)

    def encode(self) -> bytes:
        """The framed header."""
        if not self.ok:
            return pack({"ok": False, "e": self.failure})
        if self.info is not None:
            return pack({"ok": True, "info": self.info})
        message: dict = {"ok": True, "t": self.tensors}
        if self.server_s is not None:
            message["st"] = round(self.server_s, 6)
        if self.kept is not None:
            message["k"] = self.kept
        if self.receipt is not None:
            message["r"] = self.receipt
        if self.snapshot is not None:
            message["sn"] = self.snapshot
        return pack(message)

    @classmethod
    def decode(cls, body: bytes, op: str) -> "Reply":
        """Parse a reply header to a call of ``op``; ExpertProtocolError when it is neither a
        result of the right shape nor an error. (The tensors header and the failure dict are
        checked by their own readers: ``TensorReader`` and ``check_failure``.)"""
        message = unpack(body)
        ok = message.get("ok")
        if ok is not True:
            if "e" not in message:
                raise ExpertProtocolError("reply has neither result nor error")
            return cls(False, failure=message["e"])
        if op == "info":
            info = message.get("info")
            if not isinstance(info, dict):
                raise ExpertProtocolError("malformed info reply")
            return cls(True, info=info)
        server_s = message.get("st")
        if server_s is not None and (type(server_s) not in (int, float) or not 0 <= server_s < 1e9):
            raise ExpertProtocolError("reply field 'st' must be a non-negative number of seconds")
        kept = _key(message["k"]) if op == "forward" and "k" in message else None
        receipt = message.get("r") if op in ("forward", "backward") else None
        if receipt is not None and not isinstance(receipt, list):
            raise ExpertProtocolError("reply field 'r' (receipt) must be a list")
        snapshot = None
        if op == "snapshot":
            snapshot = message.get("sn")
            names = snapshot.get("n") if isinstance(snapshot, dict) else None
            if (not isinstance(snapshot, dict) or not isinstance(names, list) or len(names) > MAX_SNAPSHOT_NAMES
                    or not all(isinstance(n, str) and len(n) <= MAX_UID for n in names)
                    or type(snapshot.get("v")) is not int):
                raise ExpertProtocolError("malformed snapshot reply")
        return cls(True, tensors=message.get("t"), server_s=None if server_s is None else float(server_s), kept=kept,
                   receipt=receipt, snapshot=snapshot)


def check_request(message: dict) -> tuple[str, str, str, dict | None, int]:
    """Validate a request header: (op, uid, reply compression, tensors header, inputs count)."""
    request = Request.from_message(message)
    return request.op, request.uid, request.compression, request.tensors, request.n_inputs


__all__ = ["MAX_HEADER", "OPS", "Reply", "Request", "announced_payload", "check_request", "pack", "protocol_id", "unpack"]
