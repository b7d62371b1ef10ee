"""What the trainer does between two remote calls changes what the next one takes.

    .venv/bin/python benchmarks/call_gaps.py [--calls 300] [--hidden 256] [--batch 16]

Times a remote ffn forward (our server in a second process on loopback, as
``benchmarks/experts.py`` runs it) back to back, and after each of: a sleep of 0.5, 2 and 10 ms
(the machine idles), a 2 ms busy loop (one core stays busy), and a local forward+backward of the
same expert (what a training step does between its calls). Medians of ``--calls`` calls each.

Why: on a virtual machine an idle core is handed back to the host, and waking a process on it
costs far more than waking one on a busy core. A call wakes four threads in turn (the trainer's
event loop, the volunteer's, the trainer's loop again, the caller), so its latency after an
idle gap is mostly those wake-ups: ``benchmarks/experts.py`` alternates its cases call by call,
which puts such gaps before every remote call, ours and hivemind's alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=256, choices=[256, 1024])
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # as benchmarks/experts.py: one torch thread per process

    import torch

    from _measure import forward, forward_backward
    from experts import served
    from volunteer import RemoteExpert
    from volunteer.experts.layers import FeedForward

    torch.set_num_threads(1)
    with served() as (addr, client):
        expert = RemoteExpert(f"ffn{args.hidden}.0", addr, client)
        local = FeedForward(args.hidden)
        x = torch.randn(args.batch, args.hidden)
        for _ in range(50):  # warm-up: connection, first batches, the server's lazy imports
            forward(expert, x)

        def busy(seconds: float) -> None:
            started = time.perf_counter()
            while time.perf_counter() - started < seconds:
                pass

        gaps = [
            ("back to back", None),
            ("after sleeping 0.5 ms", lambda: time.sleep(0.0005)),
            ("after sleeping 2 ms", lambda: time.sleep(0.002)),
            ("after sleeping 10 ms", lambda: time.sleep(0.01)),
            ("after a 2 ms busy loop", lambda: busy(0.002)),
            ("after a local fwd+bwd", lambda: forward_backward(local, x)),
        ]
        print(f"Remote ffn h{args.hidden} b{args.batch} forward on loopback, median of {args.calls} calls")
        for name, between in gaps:
            times = []
            for _ in range(args.calls):
                if between is not None:
                    between()
                started = time.perf_counter()
                forward(expert, x)
                times.append(time.perf_counter() - started)
            print(f"  {name:<26}{statistics.median(times) * 1e6:>8.0f} us")


if __name__ == "__main__":
    main()
