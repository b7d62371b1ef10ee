"""DHT throughput and beam-search latency: ours vs hivemind 1.1.12, side by side in one run.

    .venv/bin/python benchmarks/dht.py [--ops 300] [--quick] [--skip-hivemind]

For each swarm size (2 and 32 nodes): sequential and concurrent (32 in flight) store and get
throughput from one node, the others in a second process (as hivemind runs each DHT in a
process of its own); then find_best_experts latency on a 64x64 grid (256 experts declared by 8
hosts, beam size 4). hivemind's figures come from benchmarks/_hivemind_dht.py in its own venv
(bash benchmarks/setup_hivemind.sh). Read the ratios: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from volunteer.dht import DHTConfig  # noqa: E402
from volunteer.dht.declare import ExpertDeclarer  # noqa: E402
from volunteer.dht.beam import find_best_experts  # noqa: E402
from volunteer.dht.node import open_dht  # noqa: E402
from volunteer.net.stack import StackOptions, open_stack  # noqa: E402

QUIET = StackOptions(relay_client=False, hole_punching=False)
NODES_PER_PROCESS = 4
CONCURRENCY = 32


class Peers:
    """n DHT nodes in subprocesses of at most NODES_PER_PROCESS each (hivemind runs one process
    per node: our peers get the machine's cores as well, not one event loop for all)."""

    def __init__(self, n: int, swarm_id: str) -> None:
        sizes = [min(NODES_PER_PROCESS, n - i) for i in range(0, n, NODES_PER_PROCESS)]
        self.procs = []
        self.addr = None
        for size in sizes:
            proc = subprocess.Popen(
                [sys.executable, str(ROOT / "benchmarks" / "_dht_peers.py"), str(size), swarm_id, *([self.addr] if self.addr else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )
            self.procs.append(proc)
            line = proc.stdout.readline()
            if not line.startswith("READY "):
                self.close()
                raise RuntimeError(f"DHT peers did not start: {line!r}")
            self.addr = self.addr or line.split()[1]

    def close(self) -> None:
        for proc in self.procs:
            proc.stdin.close()
        for proc in self.procs:
            proc.wait(timeout=30)


async def _rate(n_ops: int, op, concurrency: int) -> float:
    started = time.perf_counter()
    if concurrency == 1:
        for i in range(n_ops):
            await op(i)
    else:
        limiter = trio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with limiter:
                await op(i)

        async with trio.open_nursery() as nursery:
            for i in range(n_ops):
                nursery.start_soon(one, i)
    return n_ops / (time.perf_counter() - started)


async def measure_ours(nodes: int, ops: int) -> dict:
    swarm_id = f"bench{nodes}"
    peers = Peers(nodes - 1, swarm_id)
    try:
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as host:
            async with open_dht(host, DHTConfig(swarm_id=swarm_id), bootstrap=[peers.addr]) as dht:
                await trio.sleep(0.5)
                out = {}
                for mode, conc in (("seq", 1), ("conc", CONCURRENCY)):
                    tag = f"{mode}-{nodes}"
                    value = b"x" * 64

                    async def store(i: int) -> None:
                        assert await dht.store(f"{tag}-{i}".encode(), value, time.time() + 600) >= 1

                    async def get(i: int) -> None:
                        assert await dht.get(f"{tag}-{i}".encode())

                    async def get_any(i: int) -> None:
                        assert await dht.get(f"{tag}-{i}".encode(), latest=False)

                    out[f"store_{mode}"] = await _rate(ops, store, conc)
                    out[f"get_{mode}"] = await _rate(ops, get, conc)
                    out[f"get_any_{mode}"] = await _rate(ops, get_any, conc)
                return out
    finally:
        peers.close()


BEAM_SETTINGS = {"default": None, "max_age=0": 0.0}  # label -> find_best_experts(max_age=...)


async def measure_beam_ours(repeats: int) -> dict[str, float]:
    """Median find_best_experts latency (ms): with the default settings (grid lookups cached for
    expert_cache_age, tombstones forwarded to the cache) and with max_age=0 (every prefix asked
    of the network every time)."""
    swarm_id = "beam"
    peers = Peers(8, swarm_id)
    rng = random.Random(0)
    try:
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as host:
            async with open_dht(host, DHTConfig(swarm_id=swarm_id), bootstrap=[peers.addr]) as dht:
                # 256 experts of a 64x64 grid, declared by 8 hosts (our own hosts, in this process)
                uids = [f"expert.{i}.{j}" for i, j in rng.sample([(i, j) for i in range(64) for j in range(64)], 256)]
                async with trio.open_nursery() as nursery:
                    hosts = []
                    for k in range(8):
                        h = await nursery.start(_host_with_dht, swarm_id, peers.addr)
                        hosts.append(h)
                    for k, node in enumerate(hosts):
                        await ExpertDeclarer(node, uids[k::8]).declare_once()
                    medians = {}
                    for label, max_age in BEAM_SETTINGS.items():
                        times = []
                        for _ in range(repeats):
                            scores = [[rng.random() for _ in range(64)] for _ in range(2)]
                            started = time.perf_counter()
                            found = await find_best_experts(dht, "expert", scores, beam_size=4, max_age=max_age)
                            times.append(time.perf_counter() - started)
                            assert len(found) == 4
                        medians[label] = statistics.median(times) * 1000
                    nursery.cancel_scope.cancel()
                return medians
    finally:
        peers.close()


async def _host_with_dht(swarm_id: str, boot: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as host:
        async with open_dht(host, DHTConfig(swarm_id=swarm_id), bootstrap=[boot]) as dht:
            task_status.started(dht)
            await trio.sleep_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--nodes", default="2,32")
    parser.add_argument("--beam-repeats", type=int, default=30)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-hivemind", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.ops, args.beam_repeats = 50, 5
    sizes = [int(n) for n in args.nodes.split(",")]
    ours = {n: trio.run(measure_ours, n, args.ops) for n in sizes}
    ours_beam = trio.run(measure_beam_ours, args.beam_repeats)
    theirs = None
    if not args.skip_hivemind:
        from hivemind_runner import run_hivemind

        extra = ["--quick"] if args.quick else ["--ops", str(args.ops)]
        theirs = run_hivemind("_hivemind_dht.py", ["--nodes", args.nodes, *extra], timeout=1200)
    print(f"\nDHT benchmark ({args.ops} ops per figure; concurrent = {CONCURRENCY} in flight)")
    print(f"{'figure':<28}{'ours':>12}{'hivemind':>12}{'ratio':>9}")
    for n in sizes:
        for figure in ("store_seq", "get_seq", "get_any_seq", "store_conc", "get_conc", "get_any_conc"):
            mine = ours[n][figure]
            other = _lookup(theirs, n, figure)
            ratio = f"{mine / other:.1f}x" if other else "n/a"
            print(f"{figure + f' ({n} nodes) ops/s':<30}{mine:>12.0f}{(f'{other:.0f}' if other else 'n/a'):>12}{ratio:>9}")
    other = (theirs or {}).get("beam_ms")
    for setting, mine in ours_beam.items():
        ratio = f"{other / mine:.1f}x" if other else "n/a"
        label = f"beam 64x64 ms, {setting}"
        print(f"{label:<30}{mine:>10.1f}{(f'{other:.1f}' if other else 'n/a'):>12}{ratio:>9}")
    print("(ratio: how many times better ours is; for latency, hivemind / ours)")
    print("get = newest value across the swarm (latest=True); get_any = any live value, the local copy if held")
    print("(hivemind's default, latest=False); beam default: grid lookups reused for expert_cache_age (5 s), a")
    print("leaver's tombstones pushed to the cache; max_age=0 asks the network for every prefix (hivemind reuses")
    print("cached values until they expire, up to 60 s)")


def _lookup(theirs: dict | None, n: int, figure: str) -> float | None:
    if not theirs:
        return None
    row = theirs.get(str(n)) or theirs.get(n) or {}
    return row.get(figure)


if __name__ == "__main__":
    main()
