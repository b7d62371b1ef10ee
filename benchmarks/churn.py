"""Replicated experts under churn, side by side in one run:

1. catch-up: time for a joiner to download an expert of ~8 M parameters (ffn, hidden 1024:
   parameters + Adam state, sha256-verified) from a live replica over loopback; and a joiner's
   whole catch-up race (``replicas/catchup.py``) from one source, taken as it is, against two
   sources, corroborated (both states fetched and compared);
2. sync round: bytes one replica sends in one sync round of that expert, and per minute at the
   default sync_period (30 s) with 2 replicas; the round's time, and the longest stall of the
   event loop that both replicas share while it runs (a task asking to wake every millisecond
   notes how late it wakes: tensor work done on the loop shows up here, work on a runtime's
   worker does not);
3. accuracy under churn: ``examples/train_digits.py --churn`` with replicas 1 and with replicas 2
   (best test accuracy, experts lost, updates lost).

    python benchmarks/churn.py                 # all three (the churn runs take a few minutes)
    python benchmarks/churn.py --skip-churn    # only the transfer figures
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from volunteer.dht import DHTConfig  # noqa: E402
from volunteer.experts import ExpertsConfig  # noqa: E402
from volunteer.experts.backend import make_backend  # noqa: E402
from volunteer.net.stack import StackOptions  # noqa: E402
from volunteer.node import VolunteerOptions, open_volunteer  # noqa: E402
from volunteer.replicas import ReplicasConfig  # noqa: E402
from volunteer.replicas.catchup import race_for_state  # noqa: E402
from volunteer.replicas.transfer import catch_up  # noqa: E402
from volunteer.swarmfile import GridSpec, SwarmSpec  # noqa: E402

HIDDEN = 1024
SWARM = "churnbench"
GRID = GridSpec("big", (1,), "ffn", HIDDEN, replicas=2, sync_period=3600.0)
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


def options(**changes) -> VolunteerOptions:
    base = dict(listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, nat=False, mdns=False,
                dht_config=DHTConfig(swarm_id=SWARM, expert_update_period=600.0, expert_expiration=1200.0),
                experts_config=ExpertsConfig(device="cpu"), replicas_config=ReplicasConfig(sync_timeout=120.0))
    return VolunteerOptions(**{**base, **changes})


def sent(node) -> int:
    return sum(conn.bytes_sent for conn in node.host.connections())


async def transfer_figures(repeats: int) -> dict:
    spec = SwarmSpec(SWARM, SWARM, [], [], grids=[GRID])
    async with open_volunteer(spec, options(uids=["big.0"])) as source:
        entry = source.host.full_addrs()[0]
        params = sum(p.numel() for p in source.runtime.backends["big.0"].module.parameters())
        joined = SwarmSpec(SWARM, SWARM, [entry], [], grids=[GRID])
        async with open_volunteer(joined, options(uids=["big.0"])) as replica:
            times = []
            for _ in range(repeats):
                backend = make_backend("big.0", "ffn", HIDDEN)
                started = time.perf_counter()
                await catch_up(replica.host, source.host.peer_id, backend, swarm_id=SWARM)
                times.append(time.perf_counter() - started)
            while not (await _both_declared(source)):
                await trio.sleep(0.05)
            race = await _race_figures(joined, [str(source.host.peer_id), str(replica.host.peer_id)], repeats)
            before = sent(source)
            stalls: list[float] = []
            started = time.perf_counter()
            async with trio.open_nursery() as watching:
                watching.start_soon(_note_stalls, stalls)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(source.replicas.sync_grid, GRID)
                    nursery.start_soon(replica.replicas.sync_grid, GRID)
                watching.cancel_scope.cancel()
            round_s = time.perf_counter() - started
            round_bytes = sent(source) - before
    times.sort()
    return {"params": params, "catch_up_s": times[len(times) // 2], "round_bytes": round_bytes,
            "round_s": round_s, "stall_s": max(stalls, default=0.0), **race}


async def _race_figures(spec: SwarmSpec, sources: list[str], repeats: int) -> dict:
    """Median seconds of a joiner's catch-up race from the first source alone and from both."""
    config = ReplicasConfig()
    figures = {}
    async with open_volunteer(spec, options()) as joiner:
        for name, phase in (("race_one_s", sources[:1]), ("race_two_s", sources)):
            times = []
            for _ in range(repeats):
                backend = make_backend("big.0", "ffn", HIDDEN)
                started = time.perf_counter()
                result = await race_for_state(joiner.host, backend, [phase], swarm_id=SWARM, config=config)
                times.append(time.perf_counter() - started)
                if result.chosen is None or (len(phase) > 1 and result.corroborated_by is None):
                    raise SystemExit(f"the catch-up race from {len(phase)} source(s) decided nothing: {result}")
            figures[name] = sorted(times)[len(times) // 2]
    return figures


async def _note_stalls(stalls: list[float], tick: float = 0.001) -> None:
    """How late a task that asks to wake every ``tick`` wakes: the event loop's stalls."""
    while True:
        before = time.perf_counter()
        await trio.sleep(tick)
        stalls.append(time.perf_counter() - before - tick)


async def _both_declared(node) -> bool:
    from volunteer.dht.grid import get_experts

    return len((await get_experts(node.dht, ["big.0"]))["big.0"]) >= 2


def churn_run(replicas: int, life: str, processes: int) -> dict:
    cmd = [sys.executable, str(ROOT / "examples" / "train_digits.py"), "--churn", "--grid", "2x2", "--replicas",
           str(replicas), "--max-experts", "2", "--churn-life", life, "--churn-processes", str(processes),
           "--sync-period", "5", "--epochs", "2000"]  # trains on until `processes` volunteers have joined
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT).stdout
    best = re.search(r"best ([0-9.]+)\)", out)
    churn = re.search(r"churn: (\d+) volunteer processes .*experts lost (\d+), updates lost (\d+)", out)
    return {
        "best": float(best.group(1)) if best else float("nan"),
        "processes": int(churn.group(1)) if churn else -1,
        "experts_lost": int(churn.group(2)) if churn else -1,
        "updates_lost": int(churn.group(3)) if churn else -1,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-churn", action="store_true")
    parser.add_argument("--churn-life", default="15:40")
    parser.add_argument("--churn-processes", type=int, default=6, help="volunteer processes over each churn run, at least")
    args = parser.parse_args()

    figures = trio.run(transfer_figures, args.repeats)
    per_minute = figures["round_bytes"] * 60 / 30.0
    print(f"expert: ffn hidden {HIDDEN}, {figures['params'] / 1e6:.1f} M parameters")
    print(f"  catch-up (state download, median of {args.repeats}): {figures['catch_up_s']:.2f} s")
    print(f"  catch-up race: one source {figures['race_one_s']:.2f} s, two sources corroborated "
          f"{figures['race_two_s']:.2f} s ({figures['race_two_s'] / figures['race_one_s']:.2f}x)")
    print(f"  sync round, bytes one replica sends: {figures['round_bytes'] / 2**20:.1f} MiB "
          f"({figures['round_bytes'] / (4 * figures['params']):.2f}x its float32 parameters)")
    print(f"  sync traffic per expert per minute (sync_period 30 s, 2 replicas): {per_minute / 2**20:.1f} MiB")
    print(f"  sync round: {figures['round_s']:.2f} s, longest event-loop stall {figures['stall_s'] * 1e3:.0f} ms")
    if args.skip_churn:
        return 0
    print("accuracy under churn (digits, grid 2x2, 2 experts per volunteer):")
    rows = {replicas: churn_run(replicas, args.churn_life, args.churn_processes) for replicas in (1, 2)}
    print(f"  {'':12}{'replicas 1':>14}{'replicas 2':>14}")
    for key in ("best", "processes", "experts_lost", "updates_lost"):
        print(f"  {key:12}{rows[1][key]:>14}{rows[2][key]:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
