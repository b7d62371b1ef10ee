"""The experts wire protocol ``/volunteer/<swarm-id>/experts/1.0.0``: one call per stream.

Request: a uvarint-length-prefixed msgpack header, then the tensors' payload bytes::

    {"op": "info" | "forward" | "backward", "uid": "expert.3.5",
     "c": compression wanted for the reply,            # see tensors.COMPRESSIONS
     "t": tensors header (tensors.serialize),          # forward: inputs; backward: inputs + grads
     "ni": number of inputs among the tensors}         # backward only

Reply: the same framing::

    {"ok": true, "t": tensors header} + payload        # forward / backward
    {"ok": true, "info": {...}}                        # info
    {"ok": false, "e": failure dict}                   # failures.to_failure

The lazy multistream-select of the Host sends the protocol name, the header and the first payload
bytes in one write: a call costs one round trip. Headers are bounded by ``MAX_HEADER``, payloads
by ``ExpertsConfig.max_payload_bytes``; everything is checked before a byte is kept.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ..errors import ExpertProtocolError
from ..net.varint import encode_uvarint
from .tensors import COMPRESSIONS

MAX_HEADER = 64 * 1024
OPS = ("info", "forward", "backward")


def protocol_id(swarm_id: str) -> str:
    """The experts protocol of a swarm."""
    return f"/volunteer/{swarm_id}/experts/1.0.0"


def pack(message: dict) -> bytes:
    """A framed msgpack message."""
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_HEADER:
        raise ExpertProtocolError(f"message header of {len(body)} bytes exceeds {MAX_HEADER}")
    return encode_uvarint(len(body)) + body


def unpack(body: bytes) -> dict:
    """Parse a header body; anything but a msgpack map is an ExpertProtocolError."""
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True, max_ext_len=0)
    except Exception:  # msgpack raises several unrelated types for bad bytes
        raise ExpertProtocolError("header is not valid msgpack") from None
    if not isinstance(message, dict):
        raise ExpertProtocolError("header must be a msgpack map")
    return message


def _field(message: dict, name: str, kind: type | tuple, what: str) -> Any:
    value = message.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise ExpertProtocolError(f"request field {name!r} ({what}) is missing or mistyped")
    return value


def check_request(message: dict) -> tuple[str, str, str, dict | None, int]:
    """Validate a request header: (op, uid, reply compression, tensors header, inputs count)."""
    op = _field(message, "op", str, "operation")
    if op not in OPS:
        raise ExpertProtocolError(f"unknown operation {op[:32]!r}; expected one of {', '.join(OPS)}")
    uid = _field(message, "uid", str, "expert uid")
    if not uid or len(uid) > 256:
        raise ExpertProtocolError("expert uid must be 1-256 characters")
    compression = message.get("c", "none")
    if not isinstance(compression, str) or compression not in COMPRESSIONS:
        raise ExpertProtocolError(f"unknown compression {str(compression)[:32]!r}; known: {', '.join(COMPRESSIONS)}")
    if op == "info":
        return op, uid, compression, None, 0
    tensors = _field(message, "t", dict, "tensors header")
    count = len(tensors.get("t", ())) if isinstance(tensors.get("t"), (list, tuple)) else 0
    inputs = count
    if op == "backward":
        inputs = _field(message, "ni", int, "number of inputs")
        if not 0 < inputs < count:
            raise ExpertProtocolError(f"backward: {inputs} inputs among {count} tensors leaves no gradients")
    return op, uid, compression, tensors, inputs


__all__ = ["MAX_HEADER", "OPS", "check_request", "pack", "protocol_id", "unpack"]
