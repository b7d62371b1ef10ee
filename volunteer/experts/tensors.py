"""Wire format of tensors: a msgpack-able header plus raw little-endian bytes, streamable.

A call's tensors travel as one header and a payload. The header (a plain dict; the protocol
layer msgpacks it into its own message) is::

    {"t": [{"d": dtype, "s": [shape...], "c": compression, "n": payload bytes}, ...],
     "n": total payload bytes}

and the payload is every tensor's bytes, in order, with no padding. The protocol layer may cut
the payload anywhere: ``serialize`` yields memoryview chunks of at most ``chunk_size`` bytes
(zero-copy views of the tensors), ``TensorReader`` accepts chunks of any size and checks every
bound before it keeps a byte, so a peer can never make us hold more than the header allowed.

Compressions (chosen per call by the sender; ``"c"`` says what was used per tensor, since only
floating-point tensors are ever compressed and integers/bools always go raw):

- ``none``: the tensor's own bytes.
- ``float16``: float32/float64 sent as IEEE half (2 bytes per value; others go raw). A tensor
  half cannot hold faithfully goes another way, said in its ``"c"``: beyond half's range
  (absmax > 65504) raw; so small that half's fixed subnormal step would be coarser than 8-bit
  blockwise (absmax < 2^-17, tiny gradients) as ``blockwise8_64``, whose scale follows the values.
- ``blockwise8_64`` / ``blockwise8_256``: 8-bit linear quantization per block of 64/256 values:
  the float32 absmax/127 scale of each block, then one int8 code per value. The error per value
  is at most half a step, absmax(block)/254. NaN or inf in a block spoils that block.

Decoding restores the original dtype and shape. Anything inconsistent raises TensorFormatError.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence  # abc's, not typing's: isinstance in C

import torch  # Tensor.numpy() (zero-copy byte views) also needs numpy installed

from ..errors import LocalProtocolError, TensorFormatError
from .config import DEFAULT_CONFIG, ExpertsConfig

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}

NONE = "none"
FLOAT16 = "float16"
BLOCKWISE8_64 = "blockwise8_64"
BLOCKWISE8_256 = "blockwise8_256"
COMPRESSIONS = (NONE, FLOAT16, BLOCKWISE8_64, BLOCKWISE8_256)
_BLOCK = {BLOCKWISE8_64: 64, BLOCKWISE8_256: 256}
_FLOATS = frozenset({"float32", "float64", "float16", "bfloat16"})
_HALVABLE = frozenset({"float32", "float64"})  # float16 would gain nothing on bf16/f16 and overflow bf16
_TENSOR_KEYS = frozenset("dscn")
FLOAT16_MAX = 65504.0
# Below this absmax every value of a tensor sits in half's subnormal range, whose fixed step
# (2^-24) errs more than 8-bit blockwise's absmax/254 would.
FLOAT16_FLOOR = 2.0 ** -17
_BIG_ENDIAN = sys.byteorder == "big"


def pick_compression(wish: object) -> str:
    """The compression to answer with, given what the peer asked for: its wish if we know it,
    else ``none`` (so an old server still answers a newer client)."""
    return wish if isinstance(wish, str) and wish in COMPRESSIONS else NONE


def effective_compression(dtype_name: str, compression: str) -> str:
    """What ``compression`` becomes for a tensor of this dtype (integers and bools go raw)."""
    if compression == FLOAT16:
        return FLOAT16 if dtype_name in _HALVABLE else NONE
    if compression in _BLOCK:
        return compression if dtype_name in _FLOATS else NONE
    return NONE


def payload_size(dtype_name: str, shape: Sequence[int], compression: str) -> int:
    """Bytes a tensor takes on the wire; ``compression`` must already be effective."""
    numel = math.prod(shape)
    if compression == NONE:
        return numel * DTYPES[dtype_name].itemsize
    if compression == FLOAT16:
        return numel * 2
    blocks = -(-numel // _BLOCK[compression])
    return blocks * 4 + numel


# --- 8-bit blockwise quantization -------------------------------------------------------


def quantize_blockwise(tensor: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 scales, one per block; int8 codes, one per value) for a floating-point tensor."""
    flat = tensor.detach().reshape(-1).to(torch.float32)
    numel = flat.numel()
    blocks = -(-numel // block)
    if blocks * block != numel:
        flat = torch.nn.functional.pad(flat, (0, blocks * block - numel))
    grid = flat.view(blocks, block)
    absmax = grid.abs().amax(dim=1) if blocks else torch.zeros(0)
    scales = absmax / 127.0
    # An all-zero block has scale 0; multiplying by 0 instead of dividing keeps it NaN-free.
    inverse = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
    codes = (grid * inverse[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return scales, codes.reshape(-1)[:numel]


def dequantize_blockwise(scales: torch.Tensor, codes: torch.Tensor, block: int) -> torch.Tensor:
    """Float32 values from ``quantize_blockwise``'s output (flat, ``codes.numel()`` long)."""
    numel = codes.numel()
    blocks = scales.numel()
    values = codes.to(torch.float32)
    if blocks * block != numel:
        values = torch.nn.functional.pad(values, (0, blocks * block - numel))
    return (values.view(blocks, block) * scales[:, None]).reshape(-1)[:numel]


# --- encoding ------------------------------------------------------------------------------


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    """A zero-copy little-endian byte view of a contiguous CPU tensor."""
    flat = tensor.reshape(-1)
    if _BIG_ENDIAN and flat.element_size() > 1:
        flat = flat.view(torch.uint8).view(-1, flat.element_size()).flip(1).contiguous()
    return flat.view(torch.uint8).numpy().data.cast("B")


def _encode(tensor: torch.Tensor, compression: str) -> tuple[dict, list[memoryview]]:
    if not isinstance(tensor, torch.Tensor):
        raise LocalProtocolError(f"can only serialize torch tensors, got {type(tensor).__name__}")
    name = DTYPE_NAMES.get(tensor.dtype)
    if name is None:
        raise LocalProtocolError(f"dtype {tensor.dtype} has no wire encoding")
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    used = effective_compression(name, compression)
    if used == FLOAT16:
        used = _half_or_else(tensor)
    if used == NONE:
        parts = [_as_bytes(tensor)]
    elif used == FLOAT16:
        parts = [_as_bytes(tensor.to(torch.float16))]
    else:
        scales, codes = quantize_blockwise(tensor, _BLOCK[used])
        parts = [_as_bytes(scales), _as_bytes(codes)]
    meta = {"d": name, "s": list(tensor.shape), "c": used, "n": sum([p.nbytes for p in parts])}
    return meta, parts


def _half_or_else(tensor: torch.Tensor) -> str:
    """``float16``, unless the values need another encoding (see the module docstring)."""
    if tensor.numel() == 0:
        return FLOAT16
    absmax = float(tensor.abs().max())
    if absmax > FLOAT16_MAX and math.isfinite(absmax):
        return NONE
    if absmax < FLOAT16_FLOOR:
        return BLOCKWISE8_64
    return FLOAT16


def serialize(
    tensors: Sequence[torch.Tensor], compression: str = NONE, *, config: ExpertsConfig = DEFAULT_CONFIG
) -> tuple[dict, Iterator[memoryview]]:
    """Encode ``tensors``: (header, chunks). Compression happens here, eagerly; the chunks are
    zero-copy views of at most ``config.chunk_size`` bytes. Raises LocalProtocolError for an
    unknown compression, an unsupported dtype, or a call beyond the configured bounds."""
    if compression not in COMPRESSIONS:
        raise LocalProtocolError(f"unknown compression {compression!r}; known: {', '.join(COMPRESSIONS)}")
    if len(tensors) > config.max_tensors:
        raise LocalProtocolError(f"{len(tensors)} tensors in one call; the limit is {config.max_tensors}")
    metas: list[dict] = []
    parts: list[memoryview] = []
    for tensor in tensors:
        if tensor.dim() > config.max_ndim:
            raise LocalProtocolError(f"tensor of {tensor.dim()} dimensions; the limit is {config.max_ndim}")
        meta, tensor_parts = _encode(tensor, compression)
        metas.append(meta)
        parts.extend(tensor_parts)
    total = sum([meta["n"] for meta in metas])
    if total > config.max_payload_bytes:
        raise LocalProtocolError(f"{total} payload bytes in one call; the limit is {config.max_payload_bytes}")
    return {"t": metas, "n": total}, _chunks(parts, config.chunk_size)


def _chunks(parts: list[memoryview], size: int) -> Iterator[memoryview]:
    for part in parts:
        for start in range(0, part.nbytes, size):
            yield part[start : start + size]


# A call whose header and payload together are at most this big goes out in one write: one yamux
# frame, one Noise frame, one TCP segment train, so the receiver wakes once instead of twice or
# more. Joining costs one copy of at most this many bytes (tens of microseconds); a wake-up of
# the peer's event loop costs more.
COALESCE_LIMIT = 1024 * 1024


def writes(head: bytes, chunks: Iterable[memoryview], limit: int = COALESCE_LIMIT) -> Iterator[bytes | memoryview]:
    """What to ``send_all`` for a header followed by payload chunks: all in one buffer when the
    whole call is at most ``limit`` bytes, else the header and then each chunk as it is."""
    chunks = list(chunks)
    if len(head) + sum([chunk.nbytes for chunk in chunks]) <= limit:
        yield b"".join([head, *chunks])
        return
    yield head
    yield from chunks


def encode(
    tensors: Sequence[torch.Tensor], compression: str = NONE, *, config: ExpertsConfig = DEFAULT_CONFIG
) -> tuple[dict, bytes]:
    """``serialize`` with the payload joined into one bytes object (for small calls and tests)."""
    header, chunks = serialize(tensors, compression, config=config)
    return header, b"".join(chunks)


# --- decoding -------------------------------------------------------------------------------


def _check_header(header: object, config: ExpertsConfig) -> list[tuple[str, tuple[int, ...], str, int]]:
    """Validate an untrusted header; returns (dtype, shape, compression, nbytes) per tensor."""
    if not isinstance(header, Mapping) or set(header) != {"t", "n"}:
        raise TensorFormatError("tensor header must be a map with exactly the keys 't' and 'n'")
    metas, total = header["t"], header["n"]
    if not isinstance(metas, (list, tuple)) or type(total) is not int:
        raise TensorFormatError("tensor header: 't' must be a list and 'n' an integer")
    if len(metas) > config.max_tensors:
        raise TensorFormatError(f"{len(metas)} tensors in one call; the limit is {config.max_tensors}")
    specs = []
    wire = decoded = 0
    for index, meta in enumerate(metas):
        if not isinstance(meta, Mapping) or set(meta) != _TENSOR_KEYS:
            raise TensorFormatError(f"tensor {index}: header must be a map with exactly the keys d, s, c, n")
        dtype, shape, compression, nbytes = meta["d"], meta["s"], meta["c"], meta["n"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise TensorFormatError(f"tensor {index}: unknown dtype {dtype!r}")
        if not isinstance(compression, str) or compression not in COMPRESSIONS:
            raise TensorFormatError(f"tensor {index}: unknown compression {compression!r}")
        if effective_compression(dtype, compression) != compression:
            raise TensorFormatError(f"tensor {index}: compression {compression} does not apply to {dtype}")
        if not isinstance(shape, (list, tuple)) or len(shape) > config.max_ndim:
            raise TensorFormatError(f"tensor {index}: shape must be a list of at most {config.max_ndim} sizes")
        if not all([type(size) is int and 0 <= size <= config.max_payload_bytes for size in shape]):
            raise TensorFormatError(f"tensor {index}: bad shape {shape!r}")
        shape = tuple(shape)
        decoded += math.prod(shape) * DTYPES[dtype].itemsize
        if decoded > config.max_payload_bytes:
            raise TensorFormatError(f"tensors decode to more than {config.max_payload_bytes} bytes")
        expected = payload_size(dtype, shape, compression)
        if type(nbytes) is not int or nbytes != expected:
            raise TensorFormatError(f"tensor {index}: {nbytes!r} payload bytes, expected {expected} for {dtype}{list(shape)} {compression}")
        wire += nbytes
        specs.append((dtype, shape, compression, nbytes))
    if total != wire:
        raise TensorFormatError(f"tensor header: total {total} does not match the tensors' {wire} bytes")
    return specs


def _frombuffer(buffer: bytearray, dtype: torch.dtype, count: int, offset: int = 0) -> torch.Tensor:
    if count == 0:
        return torch.empty(0, dtype=dtype)
    flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=offset)
    if _BIG_ENDIAN and flat.element_size() > 1:
        flat = flat.view(torch.uint8).view(-1, flat.element_size()).flip(1).contiguous().view(dtype).reshape(-1)
    return flat


def _decode(buffer: bytearray, dtype_name: str, shape: tuple[int, ...], compression: str) -> torch.Tensor:
    dtype = DTYPES[dtype_name]
    numel = math.prod(shape)
    if compression == NONE:
        if dtype is torch.bool:
            # Bytes other than 0/1 are not valid torch bools: normalise them instead of trusting them.
            return _frombuffer(buffer, torch.uint8, numel).ne(0).reshape(shape)
        return _frombuffer(buffer, dtype, numel).reshape(shape)
    if compression == FLOAT16:
        return _frombuffer(buffer, torch.float16, numel).to(dtype).reshape(shape)
    block = _BLOCK[compression]
    blocks = -(-numel // block)
    scales = _frombuffer(buffer, torch.float32, blocks)
    codes = _frombuffer(buffer, torch.int8, numel, offset=blocks * 4)
    return dequantize_blockwise(scales, codes, block).to(dtype).reshape(shape)


class TensorReader:
    """Incremental decoder for one call's tensors: validate the header, ``feed`` payload chunks
    as they arrive, then ``finish``. Raises TensorFormatError on a bad header, on bytes beyond
    the announced total, and on ``finish`` before every byte arrived. Memory held grows only with
    bytes actually received (never beyond the validated total)."""

    def __init__(self, header: object, *, config: ExpertsConfig = DEFAULT_CONFIG) -> None:
        self._specs = _check_header(header, config)
        self.expected = sum([spec[3] for spec in self._specs])  # total payload bytes announced (lists, not generators, on a call's path)
        self.received = 0
        # Buffers grow as bytes arrive (bytearray's amortised growth: at most ~1/8 over what was
        # received), never to the announced size up front: a peer that announces 256 MiB and
        # sends one byte makes us hold one byte, not 256 MiB.
        self._buffers: list[bytearray] = [bytearray() for _ in self._specs]
        self._index = 0  # tensor being filled
        self._filled = 0  # bytes of it received
        self._skip_empty()

    @property
    def remaining(self) -> int:
        """Payload bytes still to come."""
        return self.expected - self.received

    @property
    def held(self) -> int:
        """Payload bytes kept so far (equal to ``received``: nothing is allocated ahead)."""
        return sum(len(buffer) for buffer in self._buffers)

    @property
    def done(self) -> bool:
        """Whether every announced byte has arrived."""
        return self.received == self.expected

    def _skip_empty(self) -> None:
        while self._index < len(self._specs) and self._filled == self._specs[self._index][3]:
            self._index += 1
            self._filled = 0

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Take the next payload bytes (any chunking). Too many bytes raise TensorFormatError."""
        view = memoryview(chunk).cast("B")
        if view.nbytes > self.remaining:
            raise TensorFormatError(f"payload longer than the {self.expected} bytes its header announced")
        self.received += view.nbytes
        while view.nbytes:
            need = self._specs[self._index][3]
            take = min(need - self._filled, view.nbytes)
            self._buffers[self._index] += view[:take]
            self._filled += take
            view = view[take:]
            self._skip_empty()

    def finish(self) -> list[torch.Tensor]:
        """The decoded tensors (CPU, original dtypes and shapes). Truncated → TensorFormatError."""
        if not self.done:
            raise TensorFormatError(f"payload truncated: {self.received} of {self.expected} bytes")
        tensors = [
            _decode(buffer, dtype, shape, compression)
            for buffer, (dtype, shape, compression, _) in zip(self._buffers, self._specs)
        ]
        self._buffers = []
        return tensors


def deserialize(header: object, payload: bytes | bytearray | memoryview, *, config: ExpertsConfig = DEFAULT_CONFIG) -> list[torch.Tensor]:
    """Decode a whole payload at once (``TensorReader`` for streams)."""
    reader = TensorReader(header, config=config)
    reader.feed(payload)
    return reader.finish()
