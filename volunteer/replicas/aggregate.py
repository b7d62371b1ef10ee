"""How a sync round turns our parameters and the other replicas' contributions into new
parameters: pure functions of tensors, no backend, no I/O.

An ``Aggregate`` takes our own floating-point parameters (by name) and the contributions that
arrived (each with the same names, shapes and dtypes: ``SyncRound.add`` checks that) and returns
the parameters the round agrees on. ``ReplicaSync`` takes one; the runtime runs it, on its worker
or inline under the same cost rule as any job on the expert, never as a sum on the event loop.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

Parameters = Mapping[str, torch.Tensor]
Aggregate = Callable[[Parameters, Sequence[Parameters]], dict[str, torch.Tensor]]


def mean(own: Parameters, contributions: Sequence[Parameters]) -> dict[str, torch.Tensor]:
    """The plain average of our parameters and every contribution (summed in float64, returned
    in each parameter's dtype); ours alone, unchanged, when nothing arrived."""
    if not contributions:
        return dict(own)
    averaged: dict[str, torch.Tensor] = {}
    for name, mine in own.items():
        total = mine.to(torch.float64).clone()
        for tensors in contributions:
            total += tensors[name].to(torch.float64)
        averaged[name] = (total / (1 + len(contributions))).to(mine.dtype)
    return averaged


__all__ = ["Aggregate", "Parameters", "mean"]
