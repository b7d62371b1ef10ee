"""Choosing the DHT's α (queries in flight per lookup) and measuring heartbeat traffic.

    .venv/bin/python benchmarks/dht_alpha.py

Part 1: 100 nodes on the in-memory transport under trio's MockClock; every request takes 40 ms
of virtual time each way (a volunteer swarm's RTT), and 20% of the nodes are silent (they
accept the stream and never answer, like a volunteer whose link died: the worst case for a
lookup). For each α, 100 FIND_VALUE lookups of stored keys from random live nodes: median and
95th percentile lookup time, requests per lookup, success rate.
Part 2: bytes each host sends per expert per minute to keep its experts declared (16 hosts on
loopback TCP, 64 experts on one host, 5 s heartbeats).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio
import trio.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from volunteer.dht import DHTConfig  # noqa: E402
from volunteer.dht.declare import ExpertDeclarer  # noqa: E402
from volunteer.dht.node import DHTNode, open_dht  # noqa: E402
from volunteer.net.stack import StackOptions, open_stack  # noqa: E402
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport  # noqa: E402

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
ONE_WAY = 0.040


async def alpha_run(alpha: int, n: int = 100, lookups: int = 100, seed: int = 1) -> dict:
    rng = random.Random(seed)
    config = DHTConfig(swarm_id="alpha", alpha=alpha)
    network = MemoryNetwork()
    original_exchange = DHTNode._exchange
    silent: set = set()

    async def slow_exchange(self, contact, body):
        await trio.sleep(ONE_WAY)
        if contact.peer in silent:
            await trio.sleep_forever()  # the request is never answered
        reply = await original_exchange(self, contact, body)
        await trio.sleep(ONE_WAY)
        return reply

    DHTNode._exchange = slow_exchange
    try:
        async with AsyncExitStack() as stack:
            nodes = []
            for _ in range(n):
                host = await stack.enter_async_context(open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET))
                boot = [rng.choice(nodes).host.full_addrs()[0]] if nodes else []
                nodes.append(await stack.enter_async_context(open_dht(host, config, bootstrap=boot, clock=trio.current_time)))
            keys = [f"k{i}".encode() for i in range(lookups)]
            for key in keys:
                await rng.choice(nodes).store(key, b"v", trio.current_time() + 3000)
            silent.update(n.host.peer_id for n in rng.sample(nodes, n // 5))
            live = [node for node in nodes if node.host.peer_id not in silent]
            times, requests, ok = [], [], 0
            for key in keys:
                asker = rng.choice(live)
                before = asker.stats["requests"]
                started = trio.current_time()
                found = await asker.get(key)
                times.append(trio.current_time() - started)
                requests.append(asker.stats["requests"] - before)
                ok += bool(found)
            times.sort()
            return {"median_s": statistics.median(times), "p95_s": times[int(len(times) * 0.95)],
                    "requests": statistics.mean(requests), "success": ok / len(keys)}
    finally:
        DHTNode._exchange = original_exchange


async def heartbeat_bytes(hosts: int = 16, experts: int = 64, beats: int = 6) -> float:
    config = DHTConfig(swarm_id="beat")
    async with AsyncExitStack() as stack:
        nodes = []
        for _ in range(hosts):
            host = await stack.enter_async_context(open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET))
            boot = [nodes[0].host.full_addrs()[0]] if nodes else []
            nodes.append(await stack.enter_async_context(open_dht(host, config, bootstrap=boot)))
        side = int(experts ** 0.5)
        declarer = ExpertDeclarer(nodes[-1], [f"expert.{i}.{j}" for i in range(side) for j in range(side)])
        await declarer.declare_once()  # the first declaration looks the keys up; heartbeats reuse them
        before = declarer.heartbeat_bytes
        for _ in range(beats):
            await declarer.declare_once()
        per_beat = (declarer.heartbeat_bytes - before) / beats
        return per_beat * (60 / config.expert_update_period) / len(declarer.uids)


def main() -> None:
    print(f"lookups: 100 nodes, 20% silent, {ONE_WAY * 2000:.0f} ms RTT (virtual time)")
    print(f"{'alpha':>5} {'median s':>9} {'p95 s':>7} {'requests':>9} {'success':>8}")
    for alpha in (1, 2, 3, 5, 8):
        started = time.monotonic()
        r = trio.run(alpha_run, alpha, clock=trio.testing.MockClock(autojump_threshold=0))
        print(f"{alpha:>5} {r['median_s']:>9.2f} {r['p95_s']:>7.2f} {r['requests']:>9.1f} {r['success']:>8.0%}"
              f"   ({time.monotonic() - started:.0f} s wall)")
    rate = trio.run(heartbeat_bytes)
    print(f"\nheartbeats: {rate:.0f} bytes per expert per minute sent by a host with 64 experts "
          f"(16 hosts, 5 s period, one STORE per close peer per beat)")


if __name__ == "__main__":
    main()
