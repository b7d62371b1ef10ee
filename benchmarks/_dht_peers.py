"""Benchmark peers: N DHT nodes in this process on loopback TCP, bootstrapped from each other
(or from BOOT, a node of another such process).

    python benchmarks/_dht_peers.py N SWARM_ID [BOOT]
Prints `READY <multiaddr of the first>` and runs until stdin closes.
"""

import sys
from contextlib import AsyncExitStack
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from volunteer.dht import DHTConfig  # noqa: E402
from volunteer.dht.node import open_dht  # noqa: E402
from volunteer.net.stack import StackOptions, open_stack  # noqa: E402

QUIET = StackOptions(relay_client=False, hole_punching=False)


async def main(n: int, swarm_id: str, boot: str | None = None) -> None:
    async with AsyncExitStack() as stack:
        first = boot
        mine = None
        for _ in range(n):
            host = await stack.enter_async_context(open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET))
            boot = [first] if first else []
            await stack.enter_async_context(open_dht(host, DHTConfig(swarm_id=swarm_id), bootstrap=boot))
            first = first or host.full_addrs()[0]
            mine = mine or host.full_addrs()[0]
        print("READY", mine, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), sys.argv[2], *sys.argv[3:4])
