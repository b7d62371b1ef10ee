"""``examples/train_digits.py --churn``, shortened: volunteer processes join and leave all through
training (placed by the swarm file's grid, two experts each, living 8-15 s, half leaving gracefully and half
killed, never fewer than 2 alive, at least 6 over the run); with replicas 2 the trainer reaches
95% and no expert loses its state. The example runs in its own process group: whatever happens,
every process it started is killed when the test ends."""

from __future__ import annotations

import re

from .conftest import run_example_in_own_group

RUN_LIMIT = 240  # seconds for the whole shortened run, on a loaded 2-core machine


def run_churn(*args: str) -> tuple[int, str]:
    return run_example_in_own_group(["train_digits.py", "--churn", *args], limit=RUN_LIMIT)


def test_training_under_churn_with_two_replicas_loses_no_expert():
    # two experts per volunteer: each expert lives on only some of them, so a leaver's experts
    # survive only through placement, catch-up, sync and hand-off
    code, out = run_churn("--grid", "2x2", "--replicas", "2", "--max-experts", "2", "--churn-life", "8:15", "--churn-processes", "6",
                          "--sync-period", "3", "--epochs", "60")
    assert code == 0, out[-4000:]
    assert "reached 95% test accuracy" in out
    match = re.search(r"churn: (\d+) volunteer processes \((\d+) left gracefully, (\d+) killed\), replicas 2: "
                      r"experts lost (\d+), updates lost (\d+)", out)
    assert match, out[-4000:]
    started, graceful, killed, lost, _updates = map(int, match.groups())
    assert started >= 6 and graceful >= 1 and killed >= 1
    assert lost == 0
