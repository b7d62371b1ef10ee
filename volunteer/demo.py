"""The local demo: a small swarm on loopback, shown step by step.

Until the DHT and experts land this is two nodes: one serves an echo protocol, the other dials it
over Noise + yamux, sends data through, and pings it.
"""

from __future__ import annotations

import os
import sys

import trio

from .net.host import open_host
from .net.ping import PING, Pinger

ECHO = "/volunteer/demo/echo/1.0.0"


async def _echo(stream) -> None:
    while data := await stream.receive_some(1 << 16):
        await stream.send_all(data)
    await stream.send_eof()


async def run_demo(size: int = 8 * 1024 * 1024) -> None:
    async with open_host(listen=["/ip4/127.0.0.1/tcp/0"]) as server, open_host() as client:
        server.set_handler(ECHO, _echo)
        addr = server.full_addrs()[0]
        print(f"node A listening on {addr}")
        started = trio.current_time()
        conn = await client.connect(addr)
        print(f"node B connected to A in {(trio.current_time() - started) * 1000:.1f} ms ({conn.describe_path()}, Noise + yamux)")
        payload = os.urandom(size)
        stream = await client.new_stream(server.peer_id, [ECHO])
        received = bytearray()
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            async def send():
                await stream.send_all(payload)
                await stream.send_eof()

            nursery.start_soon(send)
            while data := await stream.receive_some(1 << 20):
                received += data
        elapsed = trio.current_time() - started
        assert bytes(received) == payload, "echo mismatch"
        print(f"echoed {size / 2**20:.0f} MiB byte-exact in {elapsed * 1000:.0f} ms ({2 * size / elapsed / 1e6:.0f} MB/s both ways)")
        pinger = Pinger(await conn.new_stream([PING]))
        for seq in range(1, 4):
            print(f"ping seq={seq} rtt={await pinger.ping() * 1000:.2f} ms")
        await pinger.aclose()
    print("demo done")


def main() -> int:
    trio.run(run_demo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
