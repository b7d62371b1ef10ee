"""How a sync round turns our parameters and the other replicas' contributions into new
parameters: pure functions of tensors, no backend, no I/O.

An ``Aggregate`` takes our own floating-point parameters (by name) and the contributions that
arrived (each with the same names, shapes and dtypes: ``SyncRound.add`` checks that) and returns
the parameters the round agrees on. ``robust`` (the default of ``ReplicaSync``) is CenteredClip
from the coordinate-wise median with three or more inputs; what reaches it has passed the
round's guard (``guard.py``: finite, within the learned drift, no steady push). ``ReplicaSync`` takes one; the runtime runs it, on its worker
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


ROBUST_ITERATIONS = 3  # CenteredClip iterations: BTARD finds a few enough from the median


def coordinate_median(stacked: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise (lower) median of the rows of ``stacked``; three rows, the common
    case, without a sort: their sum less their largest and smallest."""
    if stacked.shape[0] == 3:
        return stacked.sum(dim=0) - stacked.amax(dim=0) - stacked.amin(dim=0)
    return stacked.median(dim=0).values


def centered_clip(points: Sequence[torch.Tensor], iterations: int = ROBUST_ITERATIONS) -> torch.Tensor:
    """CenteredClip (BTARD) of flat ``points`` started at their coordinate-wise median: each
    iteration moves the centre by the mean of every point's deviation clipped to ``tau``, the
    median deviation norm, so a minority moves it by less than ``tau`` an iteration."""
    stacked = torch.stack(list(points))
    centre = coordinate_median(stacked)
    for _ in range(iterations):
        deltas = stacked - centre
        norms = deltas.norm(dim=1)
        tau = float(norms.median())
        if tau <= 0:
            break
        scale = torch.clamp(tau / norms.clamp_min(torch.finfo(norms.dtype).tiny), max=1.0)
        centre = centre + (deltas * scale.unsqueeze(1)).mean(dim=0)
    return centre


def robust(own: Parameters, contributions: Sequence[Parameters]) -> dict[str, torch.Tensor]:
    """CenteredClip of our parameters and the contributions when there are three or more inputs
    (a single liar among them cannot drag the result past the honest spread); the plain ``mean``
    of two (there is no majority to side with) or of ours alone."""
    if len(contributions) < 2:
        return mean(own, contributions)
    names = list(own)
    result = centered_clip([flatten(own, names)] + [flatten(c, names) for c in contributions])
    return unflatten(result, own, names)


def flatten(params: Parameters, names: Sequence[str]) -> torch.Tensor:
    """``params`` named ``names`` as one float32 vector, in that order (float32: distances and
    medians of a round need no more, and an 8 M-parameter expert's copies stay at 32 MiB)."""
    if not names:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat([params[name].detach().reshape(-1).to(torch.float32) for name in names])


def unflatten(flat: torch.Tensor, like: Parameters, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """``flatten``'s inverse: tensors shaped and typed like ``like``'s."""
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for name in names:
        tensor = like[name]
        count = tensor.numel()
        out[name] = flat[offset : offset + count].reshape(tensor.shape).to(tensor.dtype)
        offset += count
    return out


__all__ = ["Aggregate", "Parameters", "centered_clip", "coordinate_median", "flatten", "mean", "robust", "unflatten"]
