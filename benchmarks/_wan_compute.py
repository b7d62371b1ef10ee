"""The experts' compute of one WAN benchmark step, measured locally (no network, no protocol).

A step makes every volunteer compute at once: each runs its experts' forward on its samples,
then (after the trainer's turn) their backward, and the four volunteers of the benchmark share
this machine's cores. So the compute is measured that way: one fresh process per volunteer,
each with one torch thread (as every volunteer of the benchmark runs), its experts (the run's class, fused
Adam as our server's) forward, then backward (the graph kept, as our server keeps it), every
phase begun by all of them together. A phase lasts until the slowest volunteer's share is done;
the step's compute is the forward phase plus the backward phase. Each expert's optimizer step
follows its backward, as on our server's worker (an expert's next backward then reuses the
gradient memory the step freed; four backwards in a row, steps after, took half as long again:
fresh gradient buffers, page faults), so the phase counts all steps but the last, which is
taken after the reply, while the network carries it, untimed, before the next round begins.

Four processes on two cores compute more slowly than one process's time times two (they share
the memory bandwidth and the last-level cache too): measured together, the figure is what the
cores deliver to a step, whatever the software on top. ``alone`` (one volunteer's share with
the machine to itself) is printed beside it.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _volunteer_share(experts: int, samples: int, hidden: int, rounds: int, start, results,
                     expert_class: str = "ffn", seq: int = 0) -> None:
    """One volunteer's rounds of forward and backward, each phase begun at ``start`` (a barrier
    of all volunteers); puts ``[(forward s, backward s), ...]`` (after a warm-up round)."""
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # before torch is imported here
    sys.path.insert(0, str(ROOT))
    import torch

    from volunteer.experts.layers import get_expert_class

    torch.set_num_threads(1)
    modules = [get_expert_class(expert_class).build(hidden) for _ in range(experts)]
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-3, fused=True) for m in modules]
    times = []
    for i in range(rounds + 1):  # the first round warms up allocators and is not kept
        xs = [torch.randn(samples, *((seq,) if seq else ()), hidden, requires_grad=True) for _ in modules]
        start.wait()
        t0 = time.perf_counter()
        outs = [m(x) for m, x in zip(modules, xs)]
        forward = time.perf_counter() - t0
        start.wait()
        t1 = time.perf_counter()
        for out, opt in zip(outs, optimizers):
            out.backward(torch.randn_like(out))
            backward = time.perf_counter() - t1  # until the last backward: its step is after the reply
            opt.step()  # before the next expert's backward, as our server's worker does
            opt.zero_grad(set_to_none=True)
        if i:
            times.append((forward, backward))
    results.put(times)


def phases(shares: list[list[tuple[float, float]]]) -> dict:
    """The step's compute from each volunteer's per-round (forward, backward) seconds: per round
    the slowest share of each phase; ``forward``, ``backward`` and ``step`` are the medians over
    the rounds."""
    if not shares or not shares[0] or any(len(s) != len(shares[0]) for s in shares):
        raise ValueError("every volunteer needs the same rounds")
    rounds = list(zip(*shares))
    forward = [max(f for f, _ in r) for r in rounds]
    backward = [max(b for _, b in r) for r in rounds]
    return {"forward": statistics.median(forward), "backward": statistics.median(backward),
            "step": statistics.median(f + b for f, b in zip(forward, backward))}


def measure(volunteers: int, experts: int, samples: int, hidden: int, rounds: int,
            expert_class: str = "ffn", seq: int = 0) -> dict:
    """``phases`` of ``volunteers`` shares computed at once, each in a fresh process (``seq``:
    samples are sequences of that many positions, for sequence experts)."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(volunteers), context.Queue()
    procs = [context.Process(target=_volunteer_share, args=(experts, samples, hidden, rounds, start, results,
                                                                               expert_class, seq))
             for _ in range(volunteers)]
    for proc in procs:
        proc.start()
    try:
        shares = [results.get(timeout=600) for _ in procs]
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return phases(shares)
