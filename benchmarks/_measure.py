"""The measurements both sides of benchmarks/experts.py make (ours, and hivemind's in its own
venv, which imports this file too): the same cases timed the same way, so the side-by-side
compares like with like. Needs only the standard library and torch."""

from __future__ import annotations

import statistics
import threading
import time

import torch


def forward(module, x: torch.Tensor) -> None:
    with torch.no_grad():
        module(x)


def forward_backward(module, x: torch.Tensor) -> None:
    # zero-mean output gradients: the expert's weights wander instead of marching one way, as
    # ``.sum().backward()`` made them (hundreds of steps of it killed the ReLUs and collapsed the
    # expert's gain 16-fold, and the trainer's guard then took the honest replies for lies)
    outputs = module(x.clone().requires_grad_())
    outputs.backward(torch.randn_like(outputs))


def latency_figures(expert, local, x: torch.Tensor, repeats: int, warm_up: int = 10) -> dict[str, float]:
    """Median ms of a remote forward, remote forward+backward, and the same two done locally
    (``local`` on the device its parameters are on; a GPU's queue is drained before the clock stops).

    The four cases alternate call by call after ``warm_up`` calls of each (connection, first
    batches, a server's lazy imports), so that a drift of the machine's speed over the run (a
    shared 2-core machine drifts by half within a minute) moves the remote and the local figures
    alike, and their difference, the overhead, stays put."""
    device = next(local.parameters()).device
    x_local = x.to(device)

    def settled(fn):
        def run() -> None:
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        return run

    cases = {
        "forward_ms": lambda: forward(expert, x),
        "forward_backward_ms": lambda: forward_backward(expert, x),
        "local_forward_ms": settled(lambda: forward(local, x_local)),
        "local_forward_backward_ms": settled(lambda: forward_backward(local, x_local)),
    }
    for fn in cases.values():
        for _ in range(warm_up):
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(spent) * 1000 for name, spent in times.items()}


def trainers_throughput(expert, seconds: float, trainers: int, hidden: int, batch: int) -> float:
    """Samples/s that ``trainers`` threads doing forward+backward through ``expert`` get."""
    samples = [0]
    failures: list[BaseException] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def trainer() -> None:
        x = torch.randn(batch, hidden)
        try:
            while time.monotonic() < deadline:
                forward_backward(expert, x)
                with lock:
                    samples[0] += batch
        except Exception as exc:  # a figure from the survivors would be no figure: say so below
            failures.append(exc)

    threads = [threading.Thread(target=trainer) for _ in range(trainers)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} of {trainers} trainers failed; the first: {failures[0]!r}") from failures[0]
    return samples[0] / (time.monotonic() - started)
