"""The experts' compute of one WAN benchmark step, measured locally (no network).

    python _wan_compute.py worker --experts 4 --samples 16 --hidden 1024 --repeats 8

A fresh process with one torch thread (as every volunteer of the benchmark runs) times one
volunteer's share of a step: its experts (ffn, Adam) forward on their samples, then backward
(the graph kept, as our server keeps it). The step's volunteers compute at once on this
machine's cores, so the compute a step cannot avoid is that work times the volunteers, over
the cores (``step_compute``): the physical bound, whatever the software.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(experts: int, samples: int, hidden: int, repeats: int) -> dict:
    """Time ``repeats`` rounds of forward and backward of ``experts`` ffn experts."""
    sys.path.insert(0, str(ROOT))
    import torch

    from volunteer.experts.layers import FeedForward

    modules = [FeedForward(hidden) for _ in range(experts)]
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in modules]
    forward, backward = [], []
    for i in range(repeats + 1):  # the first round warms up allocators and is not kept
        xs = [torch.randn(samples, hidden, requires_grad=True) for _ in modules]
        t0 = time.perf_counter()
        outs = [m(x) for m, x in zip(modules, xs)]
        t1 = time.perf_counter()
        for out in outs:
            out.backward(torch.randn_like(out))
        t2 = time.perf_counter()
        for opt in optimizers:  # after the reply, as the server does: load, not timed
            opt.step()
            opt.zero_grad()
        if i:
            forward.append(t1 - t0)
            backward.append(t2 - t1)
    return {"forward": statistics.median(forward), "backward": statistics.median(backward)}


def measure(experts: int, samples: int, hidden: int, repeats: int) -> dict:
    """``{"forward": s, "backward": s}`` of one volunteer's share, alone, in a fresh process."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    argv = [sys.executable, __file__, "worker", "--experts", str(experts), "--samples", str(samples),
            "--hidden", str(hidden), "--repeats", str(repeats)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"compute worker failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def step_compute(alone: dict, volunteers: int, cores: int) -> float:
    """Seconds of compute a step cannot avoid: each phase's work of all volunteers spread over
    ``cores`` (never less than one volunteer's own)."""
    share = max(1.0, volunteers / max(1, cores))
    return (alone["forward"] + alone["backward"]) * share


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--experts", type=int, required=True)
    w.add_argument("--samples", type=int, required=True)
    w.add_argument("--hidden", type=int, required=True)
    w.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps(worker(args.experts, args.samples, args.hidden, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
