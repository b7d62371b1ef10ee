"""Trainers that check what volunteers return: the digits example with one lying volunteer among
honest replicas of every expert, run as a user runs it (``examples/train_digits.py --liar``: 3
honest `volunteer join` processes and one whose ffn experts lie, each hosting the whole 4x4 grid,
replicas synced every 5 s).

    python benchmarks/audits.py                    # all figures (about an hour on 2 busy cores)
    python benchmarks/audits.py --runs 1 --honest-runs 1 --subtle-runs 1 --overhead-runs 1   # a quick look

1. zeros, x10, NaN, random (``--runs`` each): best test accuracy, and after how many of its replies the
   liar was excluded (median and worst; the goal: >= 0.97, within 200);
2. no liar (``--honest-runs``, ``--fixed-epochs`` each): honest volunteers excluded (the goal: none);
3. the subtle liar, +3 % on a random 20 % of its forwards (``--subtle-runs``, ``--fixed-epochs``):
   its share of the replies, the accuracy it costs against the honest runs (best accuracy over the
   same epochs and seeds), and whether audits flagged it;
4. what audits cost (``--overhead-runs`` of each, no liar): audits switched on and off every 10
   steps of the same run (``--audits alternate``), median step time with and without (the goal:
   <= 5 %), at the policy's floor (2 % of every host's calls) and with the adaptive policy from a
   cold start (20 % of an untrusted host's calls until it has passed 10 audits in a row).

Every swarm asks for receipts (exact audits: the default of our kind; ``--receipts off`` runs
them with ``--no-receipts``, audits comparing replicas). Every process runs torch with one intra-op
thread (as benchmarks/experts.py). On a shared machine step times are noisy: only figures of the
same run are compared.
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
RUN_LIMIT = 1200  # seconds one training run may take


RECEIPTS: list[str] = []  # train_digits.py's receipts flag (none: the swarm's default, receipts on)


def run(args: list[str]) -> dict:
    """One train_digits.py run; its summary line (or what went wrong)."""
    args = [*args, *RECEIPTS]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, str(ROOT / "examples" / "train_digits.py"), *args], capture_output=True,
                              text=True, timeout=RUN_LIMIT, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {RUN_LIMIT} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("summary: ")]
    if not lines:
        return {"error": f"exit {done.returncode}: {(done.stdout + done.stderr)[-1500:]}"}
    summary = json.loads(lines[-1].removeprefix("summary: "))
    summary["seconds"] = time.monotonic() - started
    print(f"  {' '.join(args)}: {json.dumps(summary)}", flush=True)
    return summary


def median_and_worst(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"median {statistics.median(values):g}, worst {max(values):g}"


def liar_figures(kind: str, runs: int, epochs: int) -> list[dict]:
    return [run(["--liar", kind, "--seed", str(seed), "--epochs", str(epochs), "--target", "0.97"]) for seed in range(runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs per crude lie (zeros, x10, NaN, random)")
    parser.add_argument("--honest-runs", type=int, default=10)
    parser.add_argument("--subtle-runs", type=int, default=5)
    parser.add_argument("--overhead-runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20, help="at most this many epochs per liar run (it stops at 0.97)")
    parser.add_argument("--fixed-epochs", type=int, default=8,
                        help="epochs of every run without a liar and with the subtle one (their accuracies are compared)")
    parser.add_argument("--lies", default="zeros,times10,nan,random")
    parser.add_argument("--receipts", choices=("on", "off"), default="on",
                        help="exact audits on receipts (our kind's default) or, off, audits that compare replicas")
    args = parser.parse_args()
    if args.receipts == "off":
        RECEIPTS.append("--no-receipts")

    results: dict[str, list[dict]] = {}
    for kind in [k for k in args.lies.split(",") if k]:
        print(f"liar: {kind}", flush=True)
        results[kind] = liar_figures(kind, args.runs, args.epochs)
    print("no liar", flush=True)
    # the same number of epochs as the subtle runs: their accuracies compare like with like
    honest = [run(["--honest", "3", "--seed", str(seed), "--epochs", str(args.fixed_epochs), "--target", "1.0"])
              for seed in range(args.honest_runs)]
    print("subtle liar", flush=True)
    subtle = [run(["--liar", "subtle", "--seed", str(seed), "--epochs", str(args.fixed_epochs), "--target", "1.0"])
              for seed in range(args.subtle_runs)]
    print("audits on and off, alternating every 10 steps", flush=True)
    overhead = {
        policy: [run(["--honest", "3", "--seed", str(100 + seed), "--epochs", "10", "--target", "1.0", "--audits", "alternate",
                      *extra]) for seed in range(args.overhead_runs)]
        for policy, extra in (("the default floor, 2 % of every host's calls", ["--audit-rate", "0.02"]),
                              ("the adaptive policy from a cold start", []))
    }

    print("\nOne liar among 3 honest replicas of every expert (digits, 4x4 grid, replicas synced every 5 s)")
    print(f"{'lie':<9}{'runs':>5}{'best accuracy':>32}{'excluded':>10}  {'after its replies':<30}")
    for kind, rows in results.items():
        ok = [r for r in rows if "error" not in r]
        excluded = [r["liar_excluded_after"] for r in ok if r["liar_excluded"]]
        accuracy = [r["best"] for r in ok]
        acc = f"median {statistics.median(accuracy):.3f}, worst {min(accuracy):.3f}" if accuracy else "n/a"
        print(f"{kind:<9}{len(ok):>5}{acc:>32}{f'{len(excluded)}/{len(ok)}':>10}  {median_and_worst(excluded):<30}")
        for r in rows:
            if "error" in r:
                print(f"  a {kind} run failed: {r['error']}")
    fine = [r for r in honest if "error" not in r]
    wrongly = sum(r["honest_excluded"] for r in fine)
    # outvoted on one expert: not called for it again, not a verdict on the volunteer
    outvoted = sum(r.get("honest_outvoted_on", 0) for rows in [fine, *results.values()] for r in rows if "error" not in r)
    print(f"no liar: {len(fine)} runs, honest volunteers excluded: {wrongly} "
          f"(best accuracy median {statistics.median([r['best'] for r in fine]):.3f})" if fine else "no liar: no run finished")
    print(f"honest replicas outvoted on an expert, over every run: {outvoted}")
    done = [r for r in subtle if "error" not in r]
    paired = [(h["best"], r["best"]) for h, r in zip(honest, subtle) if "error" not in h and "error" not in r]
    if done and paired:
        share = statistics.median(r["liar_replies"] / max(1, r["liar_replies"] + r["honest_replies"]) for r in done)
        cost = statistics.median(h - r for h, r in paired)  # the same seed: the same data split and model init
        flagged = sum(1 for r in done if r["liar_audits_disagreed"] > 0)
        excluded = sum(1 for r in done if r["liar_excluded"])
        print(f"subtle liar (+3 % on 20 % of forwards): {len(done)} runs, {share:.1%} of the replies, accuracy cost "
              f"{cost:+.3f} (best accuracy, honest run minus subtle run of the same seed, median), audits flagged it "
              f"in {flagged} run(s), excluded it in {excluded}")
    for policy, rows in overhead.items():
        measured = [r for r in rows if "error" not in r and r["step_median_audits_on"] and r["step_median_audits_off"]]
        print(f"audits at {policy}:")
        for r in measured:
            on, off = r["step_median_audits_on"], r["step_median_audits_off"]
            cpu_on, cpu_off = r["step_cpu_median_audits_on"], r["step_cpu_median_audits_off"]
            print(f"  per step, audits on / off: wall {on * 1000:.1f} / {off * 1000:.1f} ms ({on / off - 1:+.1%}), trainer CPU "
                  f"{cpu_on * 1000:.1f} / {cpu_off * 1000:.1f} ms ({cpu_on / cpu_off - 1:+.1%}); {r['audits']} audits for "
                  f"{r['calls']} calls (half the run without)")
        if measured:
            wall = [r["step_median_audits_on"] / r["step_median_audits_off"] - 1 for r in measured]
            cpu = [r["step_cpu_median_audits_on"] / r["step_cpu_median_audits_off"] - 1 for r in measured]
            print(f"  cost over {len(measured)} runs (median): {statistics.median(wall):+.1%} of the step's wall time, "
                  f"{statistics.median(cpu):+.1%} of the trainer's CPU per step (goal <= 5 %)")


if __name__ == "__main__":
    main()
