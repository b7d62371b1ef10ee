"""hivemind's ``runtime.proto`` Tensor, sans-I/O, on numpy arrays: compressions NONE, FLOAT16 and
MEANSTD_16BIT (what hivemind's experts use by default), with every size checked before a buffer
is read (a peer's ``size`` field cannot make us allocate more than the bytes it sent).

Formats, as hivemind 1.1 writes them:
- NONE: the raw little-endian buffer; ``dtype`` is numpy's name (``float32``, ``int64``, ...).
- FLOAT16: the values as float16; ``dtype`` is the original dtype to restore.
- MEANSTD_16BIT: per last-axis row, (x - mean) / std as float16, then the float32 means, then the
  float32 stds.
"""

from __future__ import annotations

import math

import numpy as np

from ..net.pb.decode import parse
from .errors import HivemindFrameError, HivemindUnsupported
from .pb.hm_runtime_pb2 import FLOAT16, MEANSTD_16BIT, NONE, Tensor

# dtypes we accept off the wire (bfloat16 has no numpy type: refused clearly, not misread)
DTYPES = {"float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"}
MAX_DIMS = 8
FP16_MAX = float(np.finfo(np.float16).max)
FP32_EPS = float(np.finfo(np.float32).eps)


def encode(array: np.ndarray, compression: int = NONE, *, requires_grad: bool = False) -> Tensor:
    """``array`` as a hivemind Tensor message."""
    array = np.ascontiguousarray(array)
    dtype = array.dtype.name
    if dtype not in DTYPES:
        raise HivemindUnsupported(f"tensors of dtype {dtype} are not supported")
    if compression == NONE:
        buffer = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    elif compression in (FLOAT16, MEANSTD_16BIT):
        if array.dtype.kind != "f":
            raise ValueError(f"{dtype} tensors cannot be compressed to float16")
        values = array.astype(np.float32)
        if compression == FLOAT16:
            buffer = np.clip(values, -FP16_MAX, FP16_MAX).astype("<f2").tobytes()
        else:
            means = values.mean(axis=-1, keepdims=True, dtype=np.float32)
            centered = values - means
            stds = np.linalg.norm(centered, axis=-1, keepdims=True).astype(np.float32) / np.float32(
                math.sqrt(values.shape[-1])
            )
            stds = np.maximum(stds, np.float32(FP32_EPS))
            scaled = np.clip(centered / stds, -FP16_MAX, FP16_MAX).astype("<f2")
            buffer = scaled.tobytes() + means.astype("<f4").tobytes() + stds.astype("<f4").tobytes()
    else:
        raise HivemindUnsupported(f"hivemind compression {compression} is not supported")
    message = Tensor(buffer=buffer, size=list(array.shape), dtype=dtype, requires_grad=requires_grad)
    message.compression = compression  # type: ignore[assignment]  # an enum value as its int
    return message


def _shape(message: Tensor, max_bytes: int) -> tuple[int, ...]:
    shape = tuple(int(dim) for dim in message.size)
    if len(shape) > MAX_DIMS:
        raise HivemindFrameError(f"tensor of {len(shape)} dimensions exceeds {MAX_DIMS}")
    if math.prod(shape) > max_bytes:
        raise HivemindFrameError("tensor size exceeds its bound")
    return shape


def decode(message: Tensor, *, max_bytes: int = 1 << 30, buffer: bytearray | None = None) -> np.ndarray:
    """The array a Tensor message carries (a fresh, writable one); a size that does not match the
    buffer, an unknown dtype or compression raises (HivemindFrameError / HivemindUnsupported).
    ``buffer``: the tensor's bytes, when they were joined from streamed parts (the message's own
    ``buffer`` is then ignored); an uncompressed array is made over it without a copy."""
    if message.dtype not in DTYPES:
        raise HivemindUnsupported(f"tensors of dtype {message.dtype!r} are not supported")
    if message.chunks > 1 and buffer is None:
        raise HivemindFrameError("a chunked tensor must be joined before decoding")
    dtype = np.dtype(message.dtype).newbyteorder("<")
    shape = _shape(message, max_bytes)
    count = math.prod(shape)
    data: bytes | bytearray = message.buffer if buffer is None else buffer
    if message.compression == NONE:
        if len(data) != count * dtype.itemsize:
            raise HivemindFrameError("tensor buffer does not match its size and dtype")
        array = np.frombuffer(data, dtype=dtype).reshape(shape)
        if isinstance(data, bytearray) and dtype.isnative:
            return array  # writable, and ours alone: no copy
        return array.astype(dtype.newbyteorder("="))
    if message.compression not in (FLOAT16, MEANSTD_16BIT):
        raise HivemindUnsupported(f"hivemind compression {message.compression} is not supported")
    if dtype.kind != "f":
        raise HivemindFrameError(f"a float16-compressed tensor cannot restore to {message.dtype}")
    if message.compression == FLOAT16:
        if len(data) != count * 2:
            raise HivemindFrameError("float16 tensor buffer does not match its size")
        return np.frombuffer(data, dtype="<f2").astype(dtype.newbyteorder("=")).reshape(shape)
    if not shape or shape[-1] == 0:
        raise HivemindFrameError("a MEANSTD_16BIT tensor needs a non-empty last dimension")
    rows = count // shape[-1]
    if len(data) != count * 2 + rows * 8:
        raise HivemindFrameError("MEANSTD_16BIT tensor buffer does not match its size")
    scaled = np.frombuffer(data, dtype="<f2", count=count).astype(np.float32).reshape(shape)
    stats_shape = (*shape[:-1], 1)
    means = np.frombuffer(data, dtype="<f4", offset=count * 2, count=rows).reshape(stats_shape)
    stds = np.frombuffer(data, dtype="<f4", offset=count * 2 + rows * 4, count=rows).reshape(stats_shape)
    return (scaled * stds + means).astype(dtype.newbyteorder("="))


def decode_bytes(data: bytes, *, max_bytes: int = 1 << 30) -> np.ndarray:
    """A Tensor message's array from its serialized bytes."""
    return decode(parse(Tensor, data, "hivemind Tensor"), max_bytes=max_bytes)


__all__ = ["DTYPES", "FLOAT16", "MEANSTD_16BIT", "NONE", "decode", "decode_bytes", "encode"]
