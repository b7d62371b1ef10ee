"""hivemind's side of benchmarks/dht.py; runs in hivemind's own venv (benchmarks/setup_hivemind.sh).

Prints one JSON object: {"2": {"store_seq": ops/s, "get_seq": ..., "get_any_seq": ..., ...}, "32": {...},
"beam_ms": median find_best_experts latency}. Measured as hivemind's benchmarks/benchmark_dht.py
does: DHT processes on loopback bootstrapped from the first, store with an expiration, get with
latest=True (get) and latest=False (get_any, hivemind's default), one client DHT doing the work.
"""

import argparse
import json
import random
import statistics
import time
from concurrent.futures import wait

import hivemind
from hivemind.moe.client.beam_search import MoEBeamSearcher
from hivemind.moe.server.dht_handler import declare_experts
from hivemind.utils.timed_storage import get_dht_time

CONCURRENCY = 32


def swarm(n: int):
    first = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    peers = [first]
    initial = first.get_visible_maddrs()
    for _ in range(n - 1):
        peers.append(hivemind.DHT(start=True, initial_peers=initial, host_maddrs=["/ip4/127.0.0.1/tcp/0"]))
    return peers


def rate(ops: int, fn, concurrent: bool) -> float:
    started = time.perf_counter()
    if not concurrent:
        for i in range(ops):
            fn(i, False)
    else:
        pending = []
        for i in range(ops):
            pending.append(fn(i, True))
            if len(pending) >= CONCURRENCY:
                done, rest = wait(pending, return_when="FIRST_COMPLETED")
                pending = list(rest)
        wait(pending)
    return ops / (time.perf_counter() - started)


def measure(n: int, ops: int) -> dict:
    peers = swarm(n)
    client = peers[-1] if n > 1 else peers[0]
    out = {}
    try:
        for mode, concurrent in (("seq", False), ("conc", True)):
            tag = f"{mode}-{n}-{random.random()}"
            value = b"x" * 64

            def store(i, future):
                return client.store(f"{tag}-{i}", value, get_dht_time() + 600, return_future=future)

            def get(i, future):
                return client.get(f"{tag}-{i}", latest=True, return_future=future)

            def get_any(i, future):
                return client.get(f"{tag}-{i}", latest=False, return_future=future)

            out[f"store_{mode}"] = rate(ops, store, concurrent)
            out[f"get_{mode}"] = rate(ops, get, concurrent)
            out[f"get_any_{mode}"] = rate(ops, get_any, concurrent)
    finally:
        for peer in peers:
            peer.shutdown()
    return out


def measure_beam(repeats: int) -> float:
    rng = random.Random(0)
    peers = swarm(9)
    try:
        uids = [f"expert.{i}.{j}" for i, j in rng.sample([(i, j) for i in range(64) for j in range(64)], 256)]
        for k in range(8):
            declare_experts(peers[k], uids[k::8], get_dht_time() + 600)
        searcher = MoEBeamSearcher(peers[8], "expert.", (64, 64))
        times = []
        for _ in range(repeats):
            scores = [[rng.random() for _ in range(64)] for _ in range(2)]
            started = time.perf_counter()
            found = searcher.find_best_experts(scores, beam_size=4)
            times.append(time.perf_counter() - started)
            assert len(found) == 4, found
        return statistics.median(times) * 1000
    finally:
        for peer in peers:
            peer.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--nodes", default="2,32")
    parser.add_argument("--beam-repeats", type=int, default=30)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.ops, args.beam_repeats = 50, 5
    result = {n: measure(int(n), args.ops) for n in args.nodes.split(",")}
    result["beam_ms"] = measure_beam(args.beam_repeats)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
