"""hivemind compatibility, timed: an unmodified hivemind client calling our server vs the same
client calling a hivemind server, in one run.

    .venv/bin/python benchmarks/hivemind_compat.py [--repeats 30] [--quick] [--rows all|experts|dht]
        [--profile FILE.prof] [--ours-only]

--profile writes a cProfile of our side (the trio thread serving the hivemind client) to FILE
(read it with ``python -m pstats FILE``); --ours-only skips the hivemind-to-hivemind column.

Rows (median ms, the hivemind client in hivemind 1.1.12's own venv, everything on loopback, CPU):
forward and forward+backward of an ffn expert (hidden 1024, batch 64) served by our
``HivemindExperts`` vs by ``hivemind.moe.Server``; DHT store and get from a hivemind node to ours
(``HivemindDHT``) vs to another hivemind node. ratio = ours / hivemind's (below 1: we are faster).
hivemind's side: benchmarks/_hivemind_compat.py (setup: bash benchmarks/setup_hivemind.sh).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hivemind_runner import ROOT, VENV, run_hivemind  # noqa: E402

from volunteer.experts import ExpertsConfig  # noqa: E402
from volunteer.experts.backend import make_backend  # noqa: E402
from volunteer.experts.runtime import open_runtime  # noqa: E402
from volunteer.hivemind import HivemindDHT, HivemindExperts  # noqa: E402
from volunteer.hivemind.kad import KadPeerRouting  # noqa: E402
from volunteer.net.stack import StackOptions, open_stack  # noqa: E402

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
HIDDEN, BATCH, UID = 1024, 64, "ffn.0"
ROWS = ("forward_ms", "forward_backward_ms", "dht_store_ms", "dht_get_ms")


def client_args(target: str, repeats: int, rows: str) -> list[str]:
    return ["client", "--target", target, "--uid", UID, "--hidden", str(HIDDEN), "--batch", str(BATCH),
            "--repeats", str(repeats), "--rows", rows]


def hivemind_side(repeats: int, rows: str) -> dict | None:
    """The hivemind client against a hivemind server (both in hivemind's venv; process groups killed)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        return None
    server = subprocess.Popen(
        [str(python), str(ROOT / "benchmarks" / "_hivemind_compat.py"), "serve", "--uid", UID, "--hidden", str(HIDDEN)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT / "benchmarks",
        start_new_session=True, text=True,
    )
    try:
        line = server.stdout.readline()
        if not line.startswith("READY "):
            print(f"hivemind server did not start: {line!r}")
            return None
        return run_hivemind("_hivemind_compat.py", client_args(line.split()[1], repeats, rows), timeout=900)
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()
        server.stdin.close()
        server.stdout.close()


async def our_side(repeats: int, rows: str, profile: str | None = None) -> dict | None:
    """The hivemind client against our node: HivemindDHT + HivemindExperts on one Host."""
    config = ExpertsConfig(device="cpu")
    async with open_runtime([make_backend(UID, "ffn", HIDDEN, config=config)], config) as runtime:
        dht = HivemindDHT()
        experts = HivemindExperts(runtime, dht=None, config=config)
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET, services=[dht, KadPeerRouting(), experts]) as host:
            target = str(host.full_addrs()[0])
            profiler = cProfile.Profile() if profile else None
            if profiler is not None:
                profiler.enable()  # this (trio) thread only: the hivemind client waits in another
            try:
                return await trio.to_thread.run_sync(
                    lambda: run_hivemind("_hivemind_compat.py", client_args(target, repeats, rows), timeout=900)
                )
            finally:
                if profiler is not None:
                    profiler.disable()
                    profiler.dump_stats(profile)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="5 repeats per row")
    parser.add_argument("--rows", choices=["all", "experts", "dht"], default="all")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of our side to FILE")
    parser.add_argument("--ours-only", action="store_true", help="skip the hivemind-to-hivemind column")
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats
    ours = trio.run(our_side, repeats, args.rows, args.profile)
    theirs = None if args.ours_only else hivemind_side(repeats, args.rows)
    print(f"hivemind client, ffn hidden {HIDDEN} batch {BATCH}, {repeats} repeats, median ms")
    print(f"{'row':<24}{'→ ours':>10}{'→ hivemind':>12}{'ratio':>8}")
    for row in ROWS:
        if (ours or {}).get(row) is None and (theirs or {}).get(row) is None:
            continue
        mine = ours.get(row) if ours else None
        other = theirs.get(row) if theirs else None
        ratio = f"{mine / other:.2f}" if mine is not None and other else "n/a"
        print(f"{row:<24}{_ms(mine):>10}{_ms(other):>12}{ratio:>8}")


if __name__ == "__main__":
    main()
