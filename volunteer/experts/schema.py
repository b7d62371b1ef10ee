"""Input/output schemas of experts: a TensorSpec per tensor (shape after the batch dim, dtype),
and the per-request validation the runtime runs before it batches anything.

Every tensor an expert takes or returns has a leading batch dimension, the same size in all
tensors of one request. A spec's ``shape`` lists the sizes after it; ``None`` means "any size"
(a sequence length, say): requests are batched only with requests of the same sizes there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from ..errors import ExpertInputError, ExpertProtocolError
from .tensors import DTYPE_NAMES, DTYPES


def _dims(shape: Sequence[int | None]) -> str:
    return "[batch" + "".join(f", {'*' if size is None else size}" for size in shape) + "]"


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a schema: its sizes after the batch dimension (``None``: any) and dtype."""

    shape: tuple[int | None, ...]
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if not all(size is None or (type(size) is int and size >= 0) for size in self.shape):
            raise ValueError(f"TensorSpec shape must hold non-negative ints or None, got {self.shape!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"TensorSpec dtype {self.dtype} has no wire encoding")

    def matches(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` (batch dim included) fits this spec."""
        return (
            tensor.dtype == self.dtype
            and tensor.dim() == len(self.shape) + 1
            and all(want is None or want == got for want, got in zip(self.shape, tensor.shape[1:]))
        )

    def describe(self) -> str:
        """``float32[batch, 256]``, for error messages."""
        return DTYPE_NAMES[self.dtype] + _dims(self.shape)

    def zeros(self, batch: int = 1, free_size: int = 1) -> torch.Tensor:
        """A zero tensor fitting the spec (``free_size`` for each ``None`` dim): dummy inputs."""
        return torch.zeros(batch, *(free_size if size is None else size for size in self.shape), dtype=self.dtype)

    def to_dict(self) -> dict:
        """A msgpack-able form, for the expert-info reply: ``{"s": [256], "d": "float32"}``."""
        return {"s": list(self.shape), "d": DTYPE_NAMES[self.dtype]}

    @classmethod
    def from_dict(cls, data: object, *, max_ndim: int = 8) -> "TensorSpec":
        """Parse ``to_dict``'s output from an untrusted peer; raises ExpertProtocolError."""
        if not isinstance(data, Mapping) or set(data) != {"s", "d"}:
            raise ExpertProtocolError("tensor spec must be a map with exactly the keys 's' and 'd'")
        shape, dtype = data["s"], data["d"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ExpertProtocolError(f"tensor spec: unknown dtype {dtype!r}")
        if not isinstance(shape, (list, tuple)) or len(shape) >= max_ndim:
            raise ExpertProtocolError("tensor spec: shape must be a short list")
        if not all(size is None or (type(size) is int and 0 <= size < 2**31) for size in shape):
            raise ExpertProtocolError(f"tensor spec: bad shape {shape!r}")
        return cls(tuple(shape), DTYPES[dtype])


def check_tensors(
    specs: Sequence[TensorSpec],
    tensors: Sequence[object],
    *,
    what: str = "input",
    max_batch: int | None = None,
    nan_check: bool = True,
) -> int:
    """Validate one request's tensors against ``specs``; returns the batch size.
    Raises ExpertInputError naming the first problem (count, type, dtype, shape, batch, NaN/inf)."""
    if len(tensors) != len(specs):
        raise ExpertInputError(f"expected {len(specs)} {what} tensor(s), got {len(tensors)}")
    batch = None
    for index, (spec, tensor) in enumerate(zip(specs, tensors)):
        if not isinstance(tensor, torch.Tensor):
            raise ExpertInputError(f"{what} {index}: expected a tensor, got {type(tensor).__name__}")
        if not spec.matches(tensor):
            got = DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype)) + str(list(tensor.shape))
            raise ExpertInputError(f"{what} {index}: got {got}, expected {spec.describe()}")
        if batch is None:
            batch = tensor.shape[0]
        elif tensor.shape[0] != batch:
            raise ExpertInputError(f"{what} {index}: batch size {tensor.shape[0]}, but {what} 0 has {batch}")
    if batch is None or batch < 1:
        raise ExpertInputError(f"a request needs at least one sample and one {what} tensor")
    if max_batch is not None and batch > max_batch:
        raise ExpertInputError(f"batch of {batch} samples; this expert takes at most {max_batch} per request")
    if nan_check:
        check_finite(tensors, what=what)  # type: ignore[arg-type]
    return batch


def check_finite(tensors: Sequence[torch.Tensor], *, what: str = "input") -> None:
    """ExpertInputError if a floating-point tensor holds NaN or inf (a full pass over the data:
    the runtime runs it on its worker thread, not on the trio thread)."""
    for index, tensor in enumerate(tensors):
        # A finite sum proves every value finite (NaN and inf propagate) and costs one kernel;
        # only a non-finite sum (or an overflow of huge values) needs the exact check.
        if tensor.is_floating_point() and tensor.numel() and not math.isfinite(float(tensor.sum())):
            if not bool(torch.isfinite(tensor).all()):
                raise ExpertInputError(f"{what} {index} holds NaN or inf")


def signature(tensors: Sequence[torch.Tensor]) -> tuple:
    """What must agree between requests batched together: every size after the batch dim."""
    return tuple(tuple(tensor.shape[1:]) for tensor in tensors)
