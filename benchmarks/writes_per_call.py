"""Socket writes per request/response call, both sides together.

    .venv/bin/python benchmarks/writes_per_call.py [--calls 200]

Two hosts in one process on loopback TCP. Each call opens a stream lazily (0-RTT negotiation),
sends 100 bytes and its EOF, and reads the reply to EOF; the handler answers with
``send_all_then_eof`` where the stream has it. Counted: the secure channel's writes (one per
flush of yamux frames, so one per socket send of a small message).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from volunteer.net.stack import open_stack  # noqa: E402
from volunteer.net.noise.driver import NoiseConnection  # noqa: E402
from volunteer.net.streams import BufferedStream, send_all_then_eof  # noqa: E402

PROTOCOL = "/bench/request-response/1.0.0"
writes = 0


def count_writes() -> None:
    """Wrap the secure channel's two write paths with a counter."""
    plain, parts = NoiseConnection.send_all, NoiseConnection.send_all_parts

    async def send_all(self, data) -> None:
        global writes
        writes += 1
        await plain(self, data)

    async def send_all_parts(self, chunks) -> None:
        global writes
        writes += 1
        await parts(self, chunks)

    NoiseConnection.send_all, NoiseConnection.send_all_parts = send_all, send_all_parts


async def answer(stream) -> None:
    request = await BufferedStream(stream).receive_until_eof(1 << 16)
    await send_all_then_eof(stream, request)


async def main(calls: int) -> None:
    global writes
    async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as server, open_stack() as client:
        server.set_handler(PROTOCOL, answer)
        conn = await client.connect(server.full_addrs()[0])
        await trio.sleep(0.5)  # identify and the first keepalive pings are done
        writes = 0
        for _ in range(calls):
            stream = await conn.new_stream([PROTOCOL])
            await send_all_then_eof(stream, b"x" * 100)
            assert await BufferedStream(stream).receive_until_eof(1 << 16) == b"x" * 100
            await stream.aclose()
        await trio.sleep(0.2)  # let the last FINs and window updates go out
        print(f"socket writes per request/response call, both sides: {writes / calls:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    count_writes()
    trio.run(main, parser.parse_args().calls)
