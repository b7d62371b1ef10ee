"""benchmarks/_measure.py, which both sides of benchmarks/experts.py time their calls with: the
four cases alternate call by call, so a drift of the machine reaches the remote and the local
figure alike."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks._measure import latency_figures


class Recorded(nn.Module):
    """A module that writes down, in one shared log, each call's name and whether grad was on."""

    def __init__(self, name: str, log: list[tuple[str, bool]]) -> None:
        super().__init__()
        self.name, self.log = name, log
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append((self.name, torch.is_grad_enabled()))
        return self.layer(x)


def test_the_four_cases_alternate_call_by_call_after_the_warm_up() -> None:
    log: list[tuple[str, bool]] = []
    remote, local = Recorded("remote", log), Recorded("local", log)
    figures = latency_figures(remote, local, torch.randn(3, 4), repeats=5, warm_up=2)
    assert set(figures) == {"forward_ms", "forward_backward_ms", "local_forward_ms", "local_forward_backward_ms"}
    assert all(value > 0 for value in figures.values())
    one_round = [("remote", False), ("remote", True), ("local", False), ("local", True)]
    warm = [call for case in one_round for call in [case] * 2]  # each case warmed up on its own first
    assert log == warm + one_round * 5
