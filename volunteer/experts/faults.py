"""Fault injection for experiments: fail a fraction of expert calls, or delay every call.

Learning@home's robustness experiment made 10% of expert calls fail; ``examples/train_digits.py
--fail-rate 0.1`` does the same to ours, and ``--latency-ms`` adds delay as a far-away volunteer
would. The client calls ``before_call`` (if ``swarm.faults`` is set) before it sends a request.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

import trio

from ..errors import ExpertUnavailableError


class FaultInjection:
    """Make ``fail_rate`` of calls raise ExpertUnavailableError and delay each by ``latency`` s;
    calls to the experts in ``fail_uids`` always fail, and those in ``slow_uids`` wait that many
    seconds more (deterministic tests of re-routing and of stragglers)."""

    def __init__(
        self, fail_rate: float = 0.0, latency: float = 0.0, seed: int | None = None, fail_uids: Iterable[str] = (),
        slow_uids: Mapping[str, float] | None = None,
    ) -> None:
        slow = dict(slow_uids or {})
        if not 0.0 <= fail_rate < 1.0 or latency < 0 or any(s < 0 for s in slow.values()):
            raise ValueError("fail_rate must be in [0, 1) and latency and slow_uids' delays >= 0")
        self.fail_uids = frozenset(fail_uids)
        self.slow_uids = slow
        self.fail_rate = fail_rate
        self.latency = latency
        self.rng = random.Random(seed)
        self.calls = 0
        self.failed = 0

    async def before_call(self, uid: str) -> None:
        self.calls += 1
        delay = self.latency + self.slow_uids.get(uid, 0.0)
        if delay:
            await trio.sleep(delay)
        if uid in self.fail_uids:
            self.failed += 1
            raise ExpertUnavailableError(f"injected failure of a call to {uid} (always fails)")
        if self.fail_rate and self.rng.random() < self.fail_rate:
            self.failed += 1
            raise ExpertUnavailableError(f"injected failure of a call to {uid} (fail rate {self.fail_rate:.0%})")

    def summary(self) -> str:
        """``", 103 of 1024 calls failed on purpose"`` when injecting, else ``""``."""
        if not self.fail_rate:
            return ""
        return f", {self.failed} of {self.calls} expert calls failed on purpose"


__all__ = ["FaultInjection"]
