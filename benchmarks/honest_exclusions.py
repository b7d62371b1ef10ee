"""No honest host is ever excluded: many honest digits runs with exact audits, under load, and
how many honest volunteers each excluded (issue 35 asks for 50 runs and none).

    python benchmarks/honest_exclusions.py --runs 50              # 50 runs of 3 epochs, one busy process beside
    python benchmarks/honest_exclusions.py --runs 2 --epochs 1    # a quick look

Each run is ``examples/train_digits.py --honest 3 --receipts`` (3 honest `volunteer join`
processes hosting the whole 4x4 grid, replicas synced every 5 s, every reply receipted and audited
by recompute at the ledger's adaptive rates), a new seed each, while ``--load`` processes spin on
the CPU beside them (a loaded machine is where honest replicas lag and snapshots are slow to come).
Per run it prints the summary's honest exclusions, honest replicas outvoted on an expert, audits and
best accuracy; at the end the totals. Exits 1 if any honest volunteer was excluded or a run gave no
result.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_LIMIT = 900  # seconds one training run may take on a loaded machine


def spin() -> None:
    """Load: one core's worth of busy work until killed."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % (1 << 31)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run(seed: int, epochs: int) -> dict:
    """One honest run; its summary line (or what went wrong)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    args = ["--honest", "3", "--receipts", "--epochs", str(epochs), "--target", "1.01", "--seed", str(seed)]
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, str(ROOT / "examples" / "train_digits.py"), *args], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    try:
        out, _ = child.communicate(timeout=RUN_LIMIT)
    except BaseException as exc:  # out of time, or stopped: SIGTERM lets it stop its volunteers and remove their keys
        child.terminate()
        child.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            return {"error": f"no result within {RUN_LIMIT} s"}
        raise
    lines = [line for line in out.splitlines() if line.startswith("summary: ")]
    if not lines:
        return {"error": f"exit {child.returncode}: {out[-1500:]}"}
    summary = json.loads(lines[-1].removeprefix("summary: "))
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["why"] = [line for line in out.splitlines() if line.startswith("HONEST volunteer")]
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (fixed: the target is out of reach)")
    parser.add_argument("--load", type=int, default=1, help="busy processes beside each run")
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args()

    # SIGTERM stops early as Ctrl-C does: the runs done so far are still counted
    signal.signal(signal.SIGTERM, _interrupt)
    burners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.load)]
    for burner in burners:
        burner.start()
    excluded = outvoted = failed = audits = done = 0
    try:
        for i in range(args.runs):
            try:
                summary = run(args.first_seed + i, args.epochs)
            except KeyboardInterrupt:
                print(f"stopped during run {i + 1}", flush=True)
                break
            done += 1
            if "error" in summary:
                failed += 1
                print(f"run {i + 1}: {summary['error']}", flush=True)
                continue
            excluded += summary["honest_excluded"]
            outvoted += summary["honest_outvoted_on"]
            audits += summary["audits"]
            print(f"run {i + 1}: honest excluded {summary['honest_excluded']}, outvoted on "
                  f"{summary['honest_outvoted_on']} experts, {summary['audits']} audits, best {summary['best']:.3f}, "
                  f"{summary['seconds']} s", flush=True)
            for line in summary["why"]:
                print(f"  {line}", flush=True)
    finally:
        for burner in burners:
            burner.kill()
    print(f"{done} honest runs ({args.epochs} epochs, {args.load} busy processes beside): {excluded} honest "
          f"volunteers excluded, {outvoted} outvoted on an expert, {audits} audits, {failed} runs without a result",
          flush=True)
    return 1 if excluded or failed else 0


if __name__ == "__main__":
    sys.exit(main())
