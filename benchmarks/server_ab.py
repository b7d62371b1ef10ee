"""Two settings of our expert server side by side: which one's calls cost less overhead.

    .venv/bin/python benchmarks/server_ab.py --a "--inline-compute-limit 0.001" --b "" [--rounds 5]
                                             [--repeats 40] [--hidden 256] [--batch 16]

Starts two servers (``_expert_server.py`` with the arguments of ``--a`` and of ``--b``) and one
trainer, then runs rounds: in each, ``_measure.latency_figures`` against A and then against B
(forward and forward+backward, each remote call beside the same computation done locally).
Prints every round's overheads and their medians. A run of ``experts.py`` per setting drifts with
the machine by more than most changes are worth (single runs of one tree differ by half on a
shared 2-core machine); rounds alternating within one run see the same machine.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", default="", help="server arguments of setting A (one string)")
    parser.add_argument("--b", default="", help="server arguments of setting B (one string)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=256, choices=[256, 1024])
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # as benchmarks/experts.py: one torch thread per process

    import torch

    from _measure import latency_figures
    from experts import served
    from volunteer import RemoteExpert
    from volunteer.experts.layers import FeedForward

    torch.set_num_threads(1)
    settings = {"A": args.a, "B": args.b}
    overheads: dict[str, list[tuple[float, float]]] = {name: [] for name in settings}
    with ExitStack() as stack:
        experts = {}
        for name, server_args in settings.items():
            addr, client = stack.enter_context(served(*shlex.split(server_args)))
            experts[name] = RemoteExpert(f"ffn{args.hidden}.0", addr, client)
        local = FeedForward(args.hidden)
        x = torch.randn(args.batch, args.hidden)
        for _ in range(args.rounds):
            for name, expert in experts.items():
                found = latency_figures(expert, local, x, args.repeats)
                overheads[name].append((found["forward_ms"] - found["local_forward_ms"],
                                        found["forward_backward_ms"] - found["local_forward_backward_ms"]))
    print(f"ffn h{args.hidden} b{args.batch}, overhead over local in ms, {args.rounds} rounds of {args.repeats} calls per case")
    for name, rounds in overheads.items():
        print(f"  {name} ({settings[name] or 'defaults'}): forward {statistics.median(f for f, _ in rounds):.2f}, "
              f"forward+backward {statistics.median(b for _, b in rounds):.2f}; rounds (fwd/fwd+bwd): "
              + " ".join(f"{f:.2f}/{b:.2f}" for f, b in rounds))


if __name__ == "__main__":
    main()
