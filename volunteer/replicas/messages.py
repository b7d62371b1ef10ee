"""Wire messages of ``/volunteer/<swarm>/expert-state/1.0.0`` and ``/volunteer/<swarm>/expert-sync/1.0.0``.

Both protocols frame a uvarint-length-prefixed msgpack map (at most ``max_message`` bytes), then,
where the map announces one, a raw payload: every tensor's little-endian bytes in the listed order,
no padding, ``n`` bytes in all, whose sha256 is ``sha``. A tensor is listed as ``[name, shape,
dtype]`` (``TensorMeta``).

State transfer (one exchange per stream)::

    fetch   → {"op": "get", "uid", "class", "hd": hidden_dim, "t": [module tensors I expect]}
            ← {"ok": true, "h": STATE} + payload          or  {"ok": false, "e": {"c": code, "m": text}}
    push    → {"op": "push", "h": STATE}
            ← {"ok": true}  (room and fit: send it)       or  a refusal
            → payload
            ← {"ok": true, "v": version now hosted}       or  a refusal

    STATE = {"uid", "class", "hd", "v": version, "t": [tensors], "s": {name: number}, "n", "sha"}

Replica sync (one contribution per stream, each member sends its own to every other member)::

    → {"uid", "v": version, "t": [float parameters], "n", "sha"} + payload
    ← {"ok": true}  or  a refusal

Every field is checked against ``ReplicasConfig`` bounds before a payload byte is kept.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch

from ..dht.grid import is_valid_uid
from ..errors import LocalProtocolError
from ..experts.protocol import pack_map, unpack_map
from ..experts.tensors import DTYPE_NAMES, DTYPES
from .config import DEFAULT_CONFIG, ReplicasConfig
from .errors import StateMismatchError, StateProtocolError, StateRefusedError

MAX_VERSION = 2**63 - 1
SHA_LEN = 32
REFUSAL_CODES = ("unknown", "mismatch", "full", "busy", "error")
_CLASS = re.compile(r"^[A-Za-z0-9_-]{0,64}$")  # "" for a backend built without a registered class


def state_protocol(swarm_id: str) -> str:
    """The state-transfer protocol of a swarm."""
    return f"/volunteer/{swarm_id}/expert-state/1.0.0"


def sync_protocol(swarm_id: str) -> str:
    """The replica-sync protocol of a swarm."""
    return f"/volunteer/{swarm_id}/expert-sync/1.0.0"


# --- framing ------------------------------------------------------------------------------
def pack(message: Mapping[str, Any], config: ReplicasConfig = DEFAULT_CONFIG) -> bytes:
    """A framed msgpack message; LocalProtocolError beyond ``max_message``."""
    return pack_map(message, config.max_message, LocalProtocolError, "message")


def unpack(body: bytes) -> dict:
    """Parse a message body; anything but a msgpack map is a StateProtocolError."""
    return unpack_map(body, StateProtocolError, "message")


def _get(message: Mapping, key: str, kind: type | tuple, what: str) -> Any:
    value = message.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int, float))):
        raise StateProtocolError(f"field {key!r} ({what}) is missing or mistyped")
    return value


def _uid(message: Mapping) -> str:
    uid = _get(message, "uid", str, "expert uid")
    if not is_valid_uid(uid):
        raise StateProtocolError(f"invalid expert uid {uid[:64]!r}")
    return uid


def _version(message: Mapping) -> int:
    version = _get(message, "v", int, "version")
    if not 0 <= version <= MAX_VERSION:
        raise StateProtocolError(f"version {version} out of range")
    return version


def _class(message: Mapping) -> tuple[str, int | None]:
    expert_class = _get(message, "class", str, "expert class")
    if not _CLASS.match(expert_class):
        raise StateProtocolError(f"invalid expert class {expert_class[:64]!r}")
    hidden = message.get("hd")
    if hidden is not None and (type(hidden) is not int or hidden < 1):
        raise StateProtocolError("field 'hd' (hidden_dim) must be a positive integer or nil")
    return expert_class, hidden


def _sha(message: Mapping) -> bytes:
    sha = _get(message, "sha", bytes, "sha256")
    if len(sha) != SHA_LEN:
        raise StateProtocolError("field 'sha' must be 32 bytes")
    return sha


# --- tensors ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorMeta:
    """One tensor of a payload: its name, full shape and dtype name (``experts.tensors.DTYPES``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Bytes the tensor takes in a payload."""
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> "TensorMeta":
        """The meta of a local tensor."""
        return cls(name, tuple(tensor.shape), DTYPE_NAMES[tensor.dtype])

    def to_wire(self) -> list:
        """``[name, shape, dtype]``."""
        return [self.name, list(self.shape), self.dtype]

    @classmethod
    def from_wire(cls, item: object, config: ReplicasConfig = DEFAULT_CONFIG) -> "TensorMeta":
        """Validate ``[name, shape, dtype]``; StateProtocolError otherwise."""
        if not isinstance(item, list) or len(item) != 3:
            raise StateProtocolError("a tensor must be listed as [name, shape, dtype]")
        name, shape, dtype = item
        if not isinstance(name, str) or not 0 < len(name) <= config.max_name:
            raise StateProtocolError(f"tensor name must be 1-{config.max_name} characters")
        if (
            not isinstance(shape, list)
            or len(shape) > config.max_tensor_ndim
            or not all(type(n) is int and 0 <= n <= config.max_state_bytes for n in shape)
        ):
            raise StateProtocolError(f"tensor {name[:64]!r} has a bad shape")
        if dtype not in DTYPES:
            raise StateProtocolError(f"tensor {name[:64]!r} has an unknown dtype {str(dtype)[:32]!r}")
        return cls(name, tuple(shape), dtype)


def _tensor_list(message: Mapping, config: ReplicasConfig) -> tuple[tuple[TensorMeta, ...], int]:
    items = _get(message, "t", list, "tensor list")
    if len(items) > config.max_state_tensors:
        raise StateProtocolError(f"{len(items)} tensors; the limit is {config.max_state_tensors}")
    metas = tuple(TensorMeta.from_wire(item, config) for item in items)
    if len({m.name for m in metas}) != len(metas):
        raise StateProtocolError("two tensors share a name")
    total = sum(m.nbytes for m in metas)
    if total > config.max_state_bytes:
        raise StateProtocolError(f"state of {total} bytes exceeds the limit of {config.max_state_bytes}")
    return metas, total


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """A copy of a tensor's bytes (CPU, contiguous, little-endian): safe to send after the tensor
    keeps changing."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def split_payload(metas: Sequence[TensorMeta], payload: bytes | bytearray | memoryview) -> dict[str, torch.Tensor]:
    """The tensors of a payload (already length- and hash-checked), by name."""
    view = memoryview(payload)
    tensors: dict[str, torch.Tensor] = {}
    offset = 0
    for meta in metas:
        size = meta.nbytes
        dtype = DTYPES[meta.dtype]
        if size == 0:
            tensors[meta.name] = torch.empty(meta.shape, dtype=dtype)
        else:
            tensors[meta.name] = torch.frombuffer(bytearray(view[offset : offset + size]), dtype=dtype).reshape(meta.shape)
        offset += size
    if offset != len(view):
        raise StateProtocolError(f"payload of {len(view)} bytes, its header lists {offset}")
    return tensors


def encode_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[tuple[TensorMeta, ...], list[bytes], bytes]:
    """(metas, per-tensor bytes, sha256 of the whole payload) of named tensors."""
    metas: list[TensorMeta] = []
    parts: list[bytes] = []
    digest = hashlib.sha256()
    for name, tensor in named:
        metas.append(TensorMeta.of(name, tensor))
        data = tensor_bytes(tensor)
        digest.update(data)
        parts.append(data)
    return tuple(metas), parts, digest.digest()


def chunked(parts: Sequence[bytes], size: int) -> list[memoryview]:
    """Zero-copy views of at most ``size`` bytes over ``parts``, in order."""
    chunks: list[memoryview] = []
    for part in parts:
        view = memoryview(part)
        for start in range(0, len(view), size):
            chunks.append(view[start : start + size])
    return chunks


# --- state transfer -------------------------------------------------------------------------
@dataclass(frozen=True)
class StateHeader:
    """What a state's payload holds: whose, which version, which tensors, and its sha256."""

    uid: str
    expert_class: str
    hidden_dim: int | None
    version: int
    tensors: tuple[TensorMeta, ...]
    scalars: tuple[tuple[str, int | float], ...]
    total: int
    sha256: bytes

    def to_wire(self) -> dict:
        """The ``STATE`` map."""
        return {
            "uid": self.uid, "class": self.expert_class, "hd": self.hidden_dim, "v": self.version,
            "t": [m.to_wire() for m in self.tensors], "s": dict(self.scalars), "n": self.total,
            "sha": self.sha256,
        }

    @classmethod
    def from_wire(cls, message: object, config: ReplicasConfig = DEFAULT_CONFIG) -> "StateHeader":
        """Validate a ``STATE`` map; StateProtocolError otherwise."""
        if not isinstance(message, dict):
            raise StateProtocolError("state header must be a map")
        expert_class, hidden = _class(message)
        tensors, total = _tensor_list(message, config)
        if _get(message, "n", int, "payload size") != total:
            raise StateProtocolError(f"payload size {message['n']} differs from its tensors' {total}")
        scalars = _get(message, "s", dict, "optimizer scalars")
        if len(scalars) > config.max_scalars or not all(
            isinstance(k, str) and len(k) <= config.max_name and isinstance(v, (int, float)) and not isinstance(v, bool)
            for k, v in scalars.items()
        ):
            raise StateProtocolError("optimizer scalars must be at most max_scalars names → numbers")
        return cls(
            _uid(message), expert_class, hidden, _version(message), tensors,
            tuple(sorted(scalars.items())), total, _sha(message),
        )


@dataclass(frozen=True)
class FetchRequest:
    """A request for a uid's state, naming the class and module tensors the requester expects."""

    uid: str
    expert_class: str
    hidden_dim: int | None
    tensors: tuple[TensorMeta, ...]

    def to_wire(self) -> dict:
        """The ``get`` map."""
        return {"op": "get", "uid": self.uid, "class": self.expert_class, "hd": self.hidden_dim,
                "t": [m.to_wire() for m in self.tensors]}


def parse_request(message: dict, config: ReplicasConfig = DEFAULT_CONFIG) -> FetchRequest | StateHeader:
    """A fetch request, or the header of a push offer; StateProtocolError otherwise."""
    op = message.get("op")
    if op == "get":
        expert_class, hidden = _class(message)
        tensors, _ = _tensor_list(message, config)
        return FetchRequest(_uid(message), expert_class, hidden, tensors)
    if op == "push":
        return StateHeader.from_wire(message.get("h"), config)
    raise StateProtocolError(f"unknown operation {str(op)[:32]!r}; expected get or push")


def refusal(code: str, text: str) -> dict:
    """A refusal reply."""
    return {"ok": False, "e": {"c": code if code in REFUSAL_CODES else "error", "m": text[:1024]}}


def check_reply(message: dict) -> dict:
    """The reply itself if it says ok; its refusal raised as StateRefusedError (StateMismatchError
    for ``mismatch``) otherwise."""
    ok = message.get("ok")
    if ok is True:
        return message
    error = message.get("e")
    if ok is not False or not isinstance(error, dict):
        raise StateProtocolError("reply must carry ok: true, or ok: false with an error")
    code = str(error["c"]) if error.get("c") in REFUSAL_CODES else "error"
    text = str(error.get("m", ""))[:1024]
    if code == "mismatch":
        raise StateMismatchError(f"the peer says: {text}")
    raise StateRefusedError(text, code)


# --- replica sync -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Contribution:
    """The header of one member's parameters in a sync round."""

    uid: str
    version: int
    tensors: tuple[TensorMeta, ...]
    total: int
    sha256: bytes

    def to_wire(self) -> dict:
        """The contribution map."""
        return {"uid": self.uid, "v": self.version, "t": [m.to_wire() for m in self.tensors],
                "n": self.total, "sha": self.sha256}

    @classmethod
    def from_wire(cls, message: dict, config: ReplicasConfig = DEFAULT_CONFIG) -> "Contribution":
        """Validate a contribution map; StateProtocolError otherwise."""
        tensors, total = _tensor_list(message, config)
        if _get(message, "n", int, "payload size") != total:
            raise StateProtocolError(f"payload size {message['n']} differs from its tensors' {total}")
        return cls(_uid(message), _version(message), tensors, total, _sha(message))


__all__ = [
    "Contribution",
    "FetchRequest",
    "StateHeader",
    "TensorMeta",
    "check_reply",
    "chunked",
    "encode_tensors",
    "pack",
    "parse_request",
    "refusal",
    "split_payload",
    "state_protocol",
    "sync_protocol",
    "tensor_bytes",
    "unpack",
]
