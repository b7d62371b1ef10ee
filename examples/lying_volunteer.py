"""A volunteer whose experts lie: what a trainer's guard and audits are for (red-team runs).

    python examples/lying_volunteer.py zeros join SWARM [volunteer join options...]

runs ``volunteer join`` exactly as a user would, after changing one thing in this process: every
built-in ``ffn`` expert it serves returns a lie instead of its output. Its state, declarations, replica
syncs and timing stay honest, as a real attacker's modified install would. The lies:

- ``zeros``: outputs times 0 (a host that computes nothing);
- ``times10``: outputs times 10;
- ``negate``: outputs times -1 (a plausible scale: only the direction gives it away);
- ``nan``: outputs times NaN;
- ``random``: made-up outputs, noise at the honest output's scale (a host that computes nothing
  and hides it from a range check: only the direction of its replies gives it away);
- ``subtle``: outputs +3 % on a random 20 % of forward passes (close to replicas' honest drift);
- ``scaled``: outputs x1.02 on every forward (far inside replicas' honest drift: only an exact
  audit sees it);
- ``turned``: outputs turned 30 degrees at the honest norm on every forward (likewise);
- ``gradients``: honest outputs, input gradients x1.02 (only an exact audit of backwards sees it).

``Lie``, ``lie_in_module`` and ``lie_in_backward`` are importable too (tests make an in-process
volunteer lie with them).
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import torch
from torch import nn

LIES = ("zeros", "times10", "negate", "nan", "random", "subtle", "scaled", "turned", "gradients")
SCALED = 1.02  # the scaled lie's factor (outputs, or input gradients for the gradients lie)
TURN_DEGREES = 30.0  # the turned lie's angle
SUBTLE_SHARE = 0.2  # forward passes the subtle liar changes
SUBTLE_FACTOR = 1.03


class Lie:
    """What a lying expert does to an honest output."""

    def __init__(self, kind: str, seed: int | None = None) -> None:
        if kind not in LIES:
            raise ValueError(f"unknown lie {kind!r}; one of {', '.join(LIES)}")
        self.kind = kind
        self.rng = random.Random(seed)
        self.noise = torch.Generator().manual_seed(self.rng.getrandbits(32))
        self.told = 0  # outputs changed

    def __call__(self, output: torch.Tensor) -> torch.Tensor:
        if self.kind == "gradients" or self.kind == "subtle" and self.rng.random() >= SUBTLE_SHARE:
            return output  # the gradients lie is told in backward (lie_in_backward)
        self.told += 1
        if self.kind == "turned":
            other = torch.randn(output.shape, generator=self.noise, dtype=output.dtype)
            other = other - (other * output).sum() / (output * output).sum().clamp_min(1e-12) * output
            angle = math.radians(TURN_DEGREES)
            return math.cos(angle) * output + math.sin(angle) * output.norm() / other.norm().clamp_min(1e-12) * other
        if self.kind == "random":
            noise = torch.randn(output.shape, generator=self.noise, dtype=output.dtype)
            return noise * (output.norm() / noise.norm().clamp_min(1e-12))
        factor = {"zeros": 0.0, "times10": 10.0, "negate": -1.0, "nan": float("nan"), "subtle": SUBTLE_FACTOR,
                  "scaled": SCALED}[self.kind]
        return output * factor


def lie_in_module(module: nn.Module, lie: Lie) -> None:
    """Make this module instance return ``lie(honest output)`` (its parameters stay as they are)."""
    honest = module.forward

    def forward(*args, **kwargs):
        return lie(honest(*args, **kwargs))

    module.forward = forward


class _ScaledInputGradient(torch.autograd.Function):
    """Identity forward; its backward hands back the input gradient times ``factor``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


def lie_in_backward(module: nn.Module, factor: float) -> None:
    """Make this module instance answer honest outputs but input gradients times ``factor``
    (NaN, or a scale the guard's range lets pass): only checks of backwards can see it."""
    honest = module.forward
    module.forward = lambda x: honest(_ScaledInputGradient.apply(x, factor))


def lie_in_served_ffn(lie: Lie) -> None:
    """Make every ``ffn`` expert this process serves lie (what a modified install does). The lie
    goes on each module as the runtime takes it to serve, so what the process computes for itself
    stays honest, as an attacker's would: a joiner checks the states it fetches by their answers
    (``replicas/corroborate.py``), and a liar that lied to itself there could not join at all."""
    from volunteer.experts.layers import FeedForward
    from volunteer.experts.runtime import Runtime

    def patch(backend) -> None:
        if isinstance(backend.module, FeedForward):
            if lie.kind == "gradients":
                lie_in_backward(backend.module, SCALED)
            else:
                lie_in_module(backend.module, lie)

    honest_init, honest_add = Runtime.__init__, Runtime.add_backend

    def __init__(self, backends, *args, **kwargs) -> None:
        backends = list(backends)
        for backend in backends:
            patch(backend)
        honest_init(self, backends, *args, **kwargs)

    def add_backend(self, backend) -> None:
        patch(backend)
        honest_add(self, backend)

    Runtime.__init__ = __init__
    Runtime.add_backend = add_backend


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in LIES:
        print(__doc__, file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from volunteer.cli.main import main as volunteer

    lie_in_served_ffn(Lie(argv[0]))
    return volunteer(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
