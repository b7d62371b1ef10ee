"""The measurements both sides of benchmarks/experts.py make (ours, and hivemind's in its own
venv, which imports this file too): the same cases timed the same way, so the side-by-side
compares like with like. Needs only the standard library and torch."""

from __future__ import annotations

import statistics
import threading
import time

import torch


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: connection, first batch
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _forward(module, x: torch.Tensor) -> None:
    with torch.no_grad():
        module(x)


def _forward_backward(module, x: torch.Tensor) -> None:
    module(x.clone().requires_grad_()).sum().backward()


def latency_figures(expert, local, x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median ms of a remote forward, remote forward+backward, and the same two done locally."""
    return {
        "forward_ms": median_ms(lambda: _forward(expert, x), repeats),
        "forward_backward_ms": median_ms(lambda: _forward_backward(expert, x), repeats),
        "local_forward_ms": median_ms(lambda: _forward(local, x), repeats),
        "local_forward_backward_ms": median_ms(lambda: _forward_backward(local, x), repeats),
    }


def trainers_throughput(expert, seconds: float, trainers: int, hidden: int, batch: int) -> float:
    """Samples/s that ``trainers`` threads doing forward+backward through ``expert`` get."""
    samples = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def trainer() -> None:
        x = torch.randn(batch, hidden)
        while time.monotonic() < deadline:
            _forward_backward(expert, x)
            with lock:
                samples[0] += batch

    threads = [threading.Thread(target=trainer) for _ in range(trainers)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples[0] / (time.monotonic() - started)
