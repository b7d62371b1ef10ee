"""Per-expert counters of the runtime and the snapshot it gives the TUI and the control socket."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Sequence

from ..errors import describe
from .requests import Kind, Request


@dataclass
class Counters:
    """What the runtime counts for one expert (under its lock)."""

    forward: int = 0
    backward: int = 0
    samples: int = 0
    batches: int = 0
    errors: int = 0
    busy: int = 0
    compute_s: float = 0.0  # worker time spent in forward/backward (a volunteer's contribution)
    last_error: str | None = None
    last_error_time: float | None = None
    latencies: deque = field(default_factory=deque)

    def snapshot(self, uid: str, *, queued: int, updates: int) -> "ExpertStats":
        """These counters as an ExpertStats (the caller holds the runtime's lock)."""
        latencies = sorted(self.latencies)
        return ExpertStats(
            uid=uid,
            requests=self.forward + self.backward,
            forward=self.forward,
            backward=self.backward,
            samples=self.samples,
            batches=self.batches,
            mean_batch_size=self.samples / self.batches if self.batches else 0.0,
            latency_p50=percentile(latencies, 0.5),
            latency_p95=percentile(latencies, 0.95),
            errors=self.errors,
            busy=self.busy,
            last_error=self.last_error,
            last_error_time=self.last_error_time,
            queued=queued,
            updates=updates,
            compute_s=self.compute_s,
        )


class Ledger:
    """Every served expert's counters, kept by the runtime under its lock. Counting only: what
    the runtime decides lives in ``scheduler.py``. The clocks are the caller's."""

    def __init__(self, latency_window: int) -> None:
        self.latency_window = latency_window
        self._counters: dict[str, Counters] = {}

    def add(self, uid: str) -> None:
        """Count ``uid`` from now on (from zero)."""
        self._counters[uid] = Counters()

    def remove(self, uid: str) -> None:
        """Forget ``uid``'s counters."""
        del self._counters[uid]

    def _of(self, uid: str) -> Counters:
        # an expert removed while its batch ran is counted into a stub nobody reads
        return self._counters.get(uid) or Counters()

    def accepted(self, request: Request) -> None:
        """A forward or backward was taken (inline or queued)."""
        counters = self._of(request.uid)
        if request.kind is Kind.FORWARD:
            counters.forward += 1
        elif request.kind is Kind.BACKWARD:
            counters.backward += 1

    def busy(self, uid: str) -> None:
        """A forward or backward was refused because a bound was reached."""
        self._of(uid).busy += 1

    def failed(self, uid: str, error: BaseException, wall: float) -> None:
        """Work that answers no request failed (an owed optimizer step)."""
        counters = self._of(uid)
        counters.errors += 1
        counters.last_error, counters.last_error_time = describe(error), wall

    def computed(
        self, uid: str, batch: Sequence[Request], *, runs: int, samples: int, seconds: float, done: float, wall: float
    ) -> None:
        """A batch was computed: ``samples`` of it answered in ``runs`` successful calls taking
        ``seconds`` and ending at ``done`` (the clock its requests were stamped with); its
        requests hold their results or errors."""
        counters = self._of(uid)
        counters.batches += runs
        counters.compute_s += seconds
        counters.samples += samples
        for request in batch:
            if request.error is not None:
                counters.errors += 1
                counters.last_error = describe(request.error)
                counters.last_error_time = wall
            counters.latencies.append(done - request.submitted)
        while len(counters.latencies) > self.latency_window:
            counters.latencies.popleft()

    def snapshot(self, uid: str, *, queued: int, updates: int) -> "ExpertStats":
        """``uid``'s counters now."""
        return self._counters[uid].snapshot(uid, queued=queued, updates=updates)

    @property
    def uids(self) -> list[str]:
        """The experts counted."""
        return list(self._counters)


@dataclass(frozen=True)
class ExpertStats:
    """A snapshot of one expert's counters, for the TUI and the control socket (seconds)."""

    uid: str
    requests: int  # accepted requests, forward + backward
    forward: int
    backward: int
    samples: int  # samples computed
    batches: int
    mean_batch_size: float
    latency_p50: float | None  # submit → answer, over the last ``latency_window`` requests
    latency_p95: float | None
    errors: int  # requests answered with an error
    busy: int  # requests refused because a queue was full
    last_error: str | None
    last_error_time: float | None  # wall clock
    queued: int  # requests waiting now
    updates: int  # optimizer steps of the backend
    compute_s: float = 0.0  # seconds the worker spent computing this expert's batches

    def as_dict(self) -> dict:
        """Plain dict (JSON- and msgpack-able)."""
        return asdict(self)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-quantile of sorted values (None for none)."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


__all__ = ["Counters", "ExpertStats", "Ledger", "percentile"]
