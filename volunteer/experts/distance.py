"""How far apart two sets of tensors are: a trainer's exact audit compares recomputed parameters
with it, a replica corroborates a state handed over with it. Part of the experts' shared core
(see ``standing.py``).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


def same_shapes(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> bool:
    """Whether two tensor lists hold the same shapes, tensor by tensor."""
    return len(first) == len(second) and all(a.shape == b.shape for a, b in zip(first, second))


def distance(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> float:
    """``|a - b| / max(|a|, |b|)`` over all tensors (0 for two all-zero sets, ``inf`` when their
    shapes differ or a value is not finite). Between 0 and 2. Used for parameters (catch-up
    corroboration); replies are compared with ``compare``."""
    if not same_shapes(first, second):
        return math.inf
    gap = norm_a = norm_b = 0.0
    for a, b in zip(first, second):  # tensor by tensor: a whole state is not copied into one
        a, b = a.detach().float(), b.detach().float()
        gap += float(torch.linalg.vector_norm(a - b)) ** 2
        norm_a += float(torch.linalg.vector_norm(a)) ** 2
        norm_b += float(torch.linalg.vector_norm(b)) ** 2
    if not all(math.isfinite(v) for v in (gap, norm_a, norm_b)):
        return math.inf
    scale = math.sqrt(max(norm_a, norm_b))
    return 0.0 if scale == 0.0 else math.sqrt(gap) / scale





__all__ = ["distance", "same_shapes"]
