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


def latency_figures(expert, local, x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median ms of a remote forward, remote forward+backward, and the same two done locally."""

    def remote_forward():
        with torch.no_grad():
            expert(x)

    def remote_both():
        xr = x.clone().requires_grad_()
        expert(xr).sum().backward()

    def local_forward():
        with torch.no_grad():
            local(x)

    def local_both():
        xl = x.clone().requires_grad_()
        local(xl).sum().backward()

    return {
        "forward_ms": median_ms(remote_forward, repeats),
        "forward_backward_ms": median_ms(remote_both, repeats),
        "local_forward_ms": median_ms(local_forward, repeats),
        "local_forward_backward_ms": median_ms(local_both, repeats),
    }


def trainers_throughput(expert, seconds: float, trainers: int, hidden: int, batch: int) -> float:
    """Samples/s that ``trainers`` threads doing forward+backward through ``expert`` get."""
    samples = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def trainer() -> None:
        x = torch.randn(batch, hidden)
        while time.monotonic() < deadline:
            xr = x.clone().requires_grad_()
            expert(xr).sum().backward()
            with lock:
                samples[0] += batch

    threads = [threading.Thread(target=trainer) for _ in range(trainers)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples[0] / (time.monotonic() - started)
