"""Per-expert counters of the runtime and the snapshot it gives the TUI and the control socket."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field


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


__all__ = ["Counters", "ExpertStats", "percentile"]
