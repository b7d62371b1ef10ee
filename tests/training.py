"""The trainer tests' toy task: a mixture of remote experts and a linear head learn to sum their
inputs. One piece for the tests that train through our swarm, through hivemind volunteers and
through real hivemind servers; each asserts what it expects of the losses itself."""

from __future__ import annotations

from typing import Callable

import torch


class SumTask:
    """A fixed batch ``x`` of ``hidden`` features, its target ``x.sum(-1)``, a head on top of
    ``moe`` and one Adam over both (created in this order: seeded tests stay reproducible)."""

    def __init__(self, moe: torch.nn.Module, hidden: int, *, batch: int, lr: float) -> None:
        self.moe = moe
        self.head = torch.nn.Linear(hidden, 1)
        self.optimizer = torch.optim.Adam([*moe.parameters(), *self.head.parameters()], lr=lr)
        self.x = torch.randn(batch, hidden)
        self.target = self.x.sum(-1, keepdim=True)

    def step(self, after_backward: Callable[[], None] | None = None) -> float:
        """One optimizer step on the batch; ``after_backward`` runs between backward and step
        (to look at the gradients). Returns the loss."""
        loss = torch.nn.functional.mse_loss(self.head(self.moe(self.x)), self.target)
        self.optimizer.zero_grad()
        loss.backward()
        if after_backward is not None:
            after_backward()
        self.optimizer.step()
        return loss.item()

    def fit(self, steps: int, after_backward: Callable[[], None] | None = None) -> list[float]:
        """``steps`` steps; their losses."""
        return [self.step(after_backward) for _ in range(steps)]
