"""hivemind's expert RPCs, sans-I/O: ``ConnectionHandler.rpc_*`` requests and answers, the info
record hivemind's ``RemoteExpert`` reads, streamed tensors split and joined, and the DHT records
that declare an expert. Pure functions on bytes and numpy arrays; every count and size bounded by
``limits.ExpertLimits``.

What hivemind 1.1 puts on the wire (``hivemind/moe/server/connection_handler.py``,
``hivemind/moe/client/expert.py``, ``hivemind/utils/streaming.py``):
- ``rpc_info``: ``ExpertUID{uid}`` → ``ExpertInfo{serialized_info}``, msgpack of
  ``{"forward_schema": ((descriptor, ...), {}), "outputs_schema": descriptor | (descriptor, ...),
  "keyword_names": ()}`` (descriptors: ext 0x51).
- ``rpc_forward`` / ``rpc_backward`` (unary): ``ExpertRequest{uid, tensors}`` →
  ``ExpertResponse{tensors}``; a backward's tensors are the inputs, then the output gradients.
- ``*_stream``: one ``ExpertRequest{uid, tensors: [part]}`` per frame; a tensor's first part has
  its ``dtype``, ``size``, ``compression`` and ``chunks``, the following parts only ``buffer``.
- declarations: key ``uid`` → peer id (base58), and for each uid prefix a dictionary sub-key
  ``coordinate`` → ``(uid, peer id)`` (``hivemind/moe/server/dht_handler.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..net.pb.decode import parse
from . import tensors
from .errors import HivemindFrameError
from .limits import DEFAULT_EXPERT_LIMITS, ExpertLimits
from .pb.hm_runtime_pb2 import NONE, ExpertInfo, ExpertRequest, ExpertResponse, ExpertUID, Tensor
from .serializer import TensorDescriptor, dumps

SERVICE = "ConnectionHandler"
INFO = f"{SERVICE}.rpc_info"
FORWARD = f"{SERVICE}.rpc_forward"
FORWARD_STREAM = f"{SERVICE}.rpc_forward_stream"
BACKWARD = f"{SERVICE}.rpc_backward"
BACKWARD_STREAM = f"{SERVICE}.rpc_backward_stream"
PROTOCOLS = (INFO, FORWARD, FORWARD_STREAM, BACKWARD, BACKWARD_STREAM)

# hivemind.moe.expert_uid: a name, then one or more numeric coordinates
UID_DELIMITER = "."
FLAT_EXPERT = -1
UID_PATTERN = re.compile(r"^(([^.])+)([.](?:[0]|([1-9]([0-9]*))))+$")
MAX_UID = 256


def is_hivemind_uid(uid: str) -> bool:
    """Whether hivemind's clients can find ``uid`` (``ffn.3``, ``expert.1.2``: a name and numbers)."""
    return len(uid) <= MAX_UID and bool(UID_PATTERN.fullmatch(uid))


# --- requests ---------------------------------------------------------------------------------


def parse_info_request(data: bytes) -> str:
    """The uid an ``rpc_info`` call asks about."""
    return _uid(parse(ExpertUID, data, "hivemind ExpertUID").uid)


def info_request(uid: str) -> bytes:
    """An ``rpc_info`` request (what a hivemind client sends)."""
    return ExpertUID(uid=uid).SerializeToString()


def _uid(uid: str) -> str:
    if not uid or len(uid) > MAX_UID:
        raise HivemindFrameError(f"expert uid must be 1-{MAX_UID} characters")
    return uid


def _check_count(count: int, limits: ExpertLimits) -> None:
    if count > limits.max_tensors:
        raise HivemindFrameError(f"{count} tensors in one request exceed {limits.max_tensors}")


def parse_request(data: bytes, limits: ExpertLimits = DEFAULT_EXPERT_LIMITS) -> tuple[str, list[np.ndarray]]:
    """A unary ``rpc_forward`` / ``rpc_backward`` request: its uid and decoded tensors."""
    request = parse(ExpertRequest, data, "hivemind ExpertRequest")
    _check_count(len(request.tensors), limits)
    return _uid(request.uid), [tensors.decode(t, max_bytes=limits.max_tensor_bytes) for t in request.tensors]


def parse_stream_request(frames: list[bytes], limits: ExpertLimits = DEFAULT_EXPERT_LIMITS) -> tuple[str, list[np.ndarray]]:
    """A ``*_stream`` request (one ExpertRequest per frame): its uid and joined, decoded tensors.
    Every frame must name the same uid, as hivemind's server demands. ``frames`` is emptied as
    it is read, so that a request's bytes are held about once, not once per step."""
    if not frames:
        raise HivemindFrameError("a streamed expert request carried no message")
    if len(frames) > limits.max_parts:
        raise HivemindFrameError(f"{len(frames)} request parts exceed {limits.max_parts}")
    uid: str | None = None

    def parts() -> Iterator[Tensor]:
        nonlocal uid
        frames.reverse()  # popped from the end: each frame is dropped once parsed
        while frames:
            request = parse(ExpertRequest, frames.pop(), "hivemind ExpertRequest")
            if uid is None:
                uid = _uid(request.uid)
            elif request.uid != uid:
                raise HivemindFrameError("expert uids differ within one streamed request")
            yield from request.tensors

    arrays = _decode_joined(parts(), limits)  # sets ``uid`` as it reads the frames
    return uid or "", arrays


def join_parts(parts: Iterable[Tensor], limits: ExpertLimits = DEFAULT_EXPERT_LIMITS) -> list[tuple[Tensor, bytearray]]:
    """Streamed tensor parts joined into whole tensors (``combine_from_streaming``): a part with a
    ``dtype`` starts a tensor, parts without one continue it. Each tensor comes back as its first
    part (its dtype, size, compression; its buffer to be ignored) and its joined bytes."""
    joined: list[tuple[Tensor, bytearray, int]] = []
    for part in parts:
        if part.dtype or not joined:
            if not part.dtype:
                raise HivemindFrameError("a streamed tensor's first part has no dtype")
            _check_count(len(joined) + 1, limits)
            # the head keeps no bytes: a part would keep its whole frame's message alive
            head = Tensor(size=list(part.size), dtype=part.dtype, requires_grad=part.requires_grad, chunks=part.chunks)
            head.compression = part.compression
            joined.append((head, bytearray(), 0))
        head, buffer, count = joined[-1]
        chunk = part.buffer
        if len(buffer) + len(chunk) > limits.max_tensor_bytes:
            raise HivemindFrameError("a streamed tensor exceeds its byte bound")
        buffer += chunk
        joined[-1] = (head, buffer, count + 1)
    for head, _, count in joined:
        if head.chunks > 1 and count != head.chunks:
            raise HivemindFrameError(f"streamed tensor announced {head.chunks} parts, {count} arrived")
    return [(head, buffer) for head, buffer, _ in joined]


def _decode_joined(parts: Iterable[Tensor], limits: ExpertLimits) -> list[np.ndarray]:
    return [tensors.decode(head, max_bytes=limits.max_tensor_bytes, buffer=buffer) for head, buffer in join_parts(parts, limits)]


def request(uid: str, arrays: Sequence[np.ndarray], compressions: Sequence[int] | None = None) -> bytes:
    """A unary ``rpc_forward`` / ``rpc_backward`` request (what a hivemind client sends)."""
    return ExpertRequest(uid=uid, tensors=_encode_all(arrays, compressions)).SerializeToString()


def stream_request(
    uid: str, arrays: Sequence[np.ndarray], compressions: Sequence[int] | None = None,
    limits: ExpertLimits = DEFAULT_EXPERT_LIMITS,
) -> list[bytes]:
    """A ``*_stream`` request, one frame per tensor part."""
    return [
        ExpertRequest(uid=uid, tensors=[part]).SerializeToString()
        for tensor in _encode_all(arrays, compressions)
        for part in split(tensor, limits.stream_part_bytes)
    ]


# --- answers ----------------------------------------------------------------------------------


def _encode_all(arrays: Sequence[np.ndarray], compressions: Sequence[int] | None) -> list[Tensor]:
    wanted = list(compressions or ())
    encoded = []
    for index, array in enumerate(arrays):
        compression = wanted[index] if index < len(wanted) else NONE
        if array.dtype.kind != "f":
            compression = NONE  # hivemind compresses only floating-point tensors
        encoded.append(tensors.encode(array, compression))
    return encoded


def response(arrays: Sequence[np.ndarray], compressions: Sequence[int] | None = None) -> bytes:
    """A unary ``ExpertResponse`` carrying ``arrays``."""
    return ExpertResponse(tensors=_encode_all(arrays, compressions)).SerializeToString()


def stream_response(
    arrays: Sequence[np.ndarray], compressions: Sequence[int] | None = None,
    limits: ExpertLimits = DEFAULT_EXPERT_LIMITS,
) -> list[bytes]:
    """A ``*_stream`` answer: one ExpertResponse frame per tensor part."""
    return [
        ExpertResponse(tensors=[part]).SerializeToString()
        for tensor in _encode_all(arrays, compressions)
        for part in split(tensor, limits.stream_part_bytes)
    ]


def parse_response(data: bytes, limits: ExpertLimits = DEFAULT_EXPERT_LIMITS) -> list[np.ndarray]:
    """The tensors of a unary ``ExpertResponse``."""
    answer = parse(ExpertResponse, data, "hivemind ExpertResponse")
    _check_count(len(answer.tensors), limits)
    return [tensors.decode(t, max_bytes=limits.max_tensor_bytes) for t in answer.tensors]


def parse_stream_response(frames: Sequence[bytes], limits: ExpertLimits = DEFAULT_EXPERT_LIMITS) -> list[np.ndarray]:
    """The tensors of a ``*_stream`` answer (parts joined)."""
    if len(frames) > limits.max_parts:
        raise HivemindFrameError(f"{len(frames)} answer parts exceed {limits.max_parts}")
    parts = (part for frame in frames for part in parse(ExpertResponse, frame, "hivemind ExpertResponse").tensors)
    return _decode_joined(parts, limits)


def split(tensor: Tensor, part_bytes: int) -> list[Tensor]:
    """``tensor`` as streamed parts of at most ``part_bytes`` buffer bytes (``split_for_streaming``)."""
    buffer = tensor.buffer
    count = max(1, -(-len(buffer) // part_bytes))
    head = Tensor(buffer=buffer[:part_bytes], size=list(tensor.size), dtype=tensor.dtype,
                  requires_grad=tensor.requires_grad, chunks=count)
    head.compression = tensor.compression
    return [head] + [Tensor(buffer=buffer[start:start + part_bytes]) for start in range(part_bytes, len(buffer), part_bytes)]


# --- expert info ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """An expert's tensors as hivemind describes them: per input and output, the sizes after the
    batch dimension (None: any), numpy's dtype name and the compression to send it with."""

    inputs: tuple[tuple[tuple[int | None, ...], str, int], ...]
    outputs: tuple[tuple[tuple[int | None, ...], str, int], ...]

    @classmethod
    def from_info(cls, info: dict, compression: int = NONE) -> "Schema":
        """From our backends' ``info()`` (``{"inputs": [{"s": [...], "d": "float32"}], "outputs": ...}``)."""

        def specs(items: list) -> tuple:
            return tuple((tuple(item["s"]), item["d"], compression if item["d"].startswith(("float", "bfloat")) else NONE)
                         for item in items)

        return cls(specs(info["inputs"]), specs(info["outputs"]))

    def descriptors(self, which: str) -> tuple[TensorDescriptor, ...]:
        """hivemind's BatchTensorDescriptors of the ``inputs`` or ``outputs``."""
        return tuple(
            TensorDescriptor(size=(None, *shape), dtype=f"torch.{dtype}", compression=compression)
            for shape, dtype, compression in getattr(self, which)
        )

    def info(self) -> dict[str, Any]:
        """The record ``rpc_info`` sends (what hivemind's ``ModuleBackend.get_info`` returns)."""
        outputs = self.descriptors("outputs")
        return {
            "forward_schema": (self.descriptors("inputs"), {}),
            # a one-output expert is described by its descriptor alone, so clients get a tensor back
            "outputs_schema": outputs[0] if len(outputs) == 1 else outputs,
            "keyword_names": (),
        }

    def output_compressions(self) -> list[int]:
        """Compressions for a forward's answer."""
        return [c for _, _, c in self.outputs]

    def input_compressions(self) -> list[int]:
        """Compressions for a backward's answer (gradients of the inputs)."""
        return [c for _, _, c in self.inputs]


def info_response(schema: Schema) -> bytes:
    """The ``ExpertInfo`` answer to ``rpc_info``."""
    return ExpertInfo(serialized_info=dumps(schema.info())).SerializeToString()


# --- declarations -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Declaration:
    """One DHT record declaring an expert: ``value`` under ``key`` (and ``subkey`` when set)."""

    key: str
    value: Any
    subkey: int | None = None


def declarations(uids: Sequence[str], peer_id_base58: str) -> list[Declaration]:
    """The records hivemind's ``declare_experts`` stores for ``uids`` served by ``peer_id_base58``:
    the uid itself, and each prefix with the next coordinate as sub-key (a one-dimensional uid
    gets hivemind's flat-expert coordinate)."""
    records: dict[tuple[str, int | None], Any] = {}
    for uid in uids:
        records[uid, None] = peer_id_base58
        prefix = uid if uid.count(UID_DELIMITER) > 1 else f"{uid}{UID_DELIMITER}{FLAT_EXPERT}"
        for _ in range(prefix.count(UID_DELIMITER) - 1):
            stripped = prefix.rstrip(UID_DELIMITER)
            pivot = stripped.rindex(UID_DELIMITER) + 1
            prefix, coordinate = stripped[:pivot], int(stripped[pivot:])
            records[prefix, coordinate] = (uid, peer_id_base58)
    return [Declaration(key, value, subkey) for (key, subkey), value in records.items()]


__all__ = [
    "BACKWARD", "BACKWARD_STREAM", "Declaration", "FORWARD", "FORWARD_STREAM", "INFO", "PROTOCOLS", "Schema",
    "declarations", "info_request", "info_response", "is_hivemind_uid", "join_parts", "parse_info_request",
    "parse_request", "parse_response", "parse_stream_request", "parse_stream_response", "request", "response",
    "split", "stream_request", "stream_response",
]
