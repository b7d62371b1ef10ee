"""Echo throughput over trio TCP on loopback, raw and through one Noise connection, side by side.

    .venv/bin/python benchmarks/noise_echo.py [--size-mib 64] [--one-process] [--rounds 1]

By default the echo server runs in a second process (as a real peer would, and so that both
ends get a core); ``--one-process`` puts both ends on one trio loop. MB/s counts both
directions (2 x size / time). Read the ratio: the machine is shared, absolute figures drift.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from volunteer.net.identity import KeyPair  # noqa: E402
from volunteer.net.noise import secure_inbound, secure_outbound  # noqa: E402

CHUNK = 1 << 20


async def _echo(stream) -> None:
    while data := await stream.receive_some(CHUNK):
        await stream.send_all(data)
    await stream.send_eof()


async def serve(identity: KeyPair, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Raw and Noise echo servers on two loopback ports; reports (raw_port, noise_port)."""
    raw = await trio.open_tcp_listeners(0, host="127.0.0.1")
    noise = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def noise_echo(stream):
        await _echo(await secure_inbound(stream, identity))

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, _echo, raw)
        await nursery.start(trio.serve_listeners, noise_echo, noise)
        task_status.started((raw[0].socket.getsockname()[1], noise[0].socket.getsockname()[1]))


async def echo_through(stream, size: int) -> float:
    """Send ``size`` bytes while reading the echo back; returns seconds."""
    payload = memoryview(os.urandom(CHUNK))
    started = time.perf_counter()

    async def writer():
        left = size
        while left:
            chunk = payload[: min(left, CHUNK)]
            await stream.send_all(chunk)
            left -= len(chunk)
        await stream.send_eof()

    received = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        while data := await stream.receive_some(CHUNK):
            received += len(data)
    if received != size:
        raise RuntimeError(f"echo returned {received} of {size} bytes")
    return time.perf_counter() - started


async def measure(raw_port: int, noise_port: int, server_peer, size: int, rounds: int) -> None:
    client = KeyPair.generate()
    results = {}
    for name in ("raw TCP", "Noise"):
        best = float("inf")
        for _ in range(rounds):
            if name == "raw TCP":
                stream = await trio.open_tcp_stream("127.0.0.1", raw_port)
            else:
                stream = await secure_outbound(await trio.open_tcp_stream("127.0.0.1", noise_port), client, server_peer)
            best = min(best, await echo_through(stream, size))
            await stream.aclose()
        results[name] = 2 * size / best / 1e6
        print(f"{name:8} echo {size >> 20} MiB: {results[name]:8.0f} MB/s ({best * 1000:.0f} ms)", flush=True)
    print(f"Noise / raw: {results['Noise'] / results['raw TCP']:.2f}")


async def one_process(size: int, rounds: int) -> None:
    identity = KeyPair.generate()
    async with trio.open_nursery() as nursery:
        ports = await nursery.start(serve, identity)
        await measure(*ports, identity.peer_id, size, rounds)
        nursery.cancel_scope.cancel()


async def server_main() -> None:
    identity = KeyPair.generate()
    async with trio.open_nursery() as nursery:
        raw_port, noise_port = await nursery.start(serve, identity)
        print(f"READY {raw_port} {noise_port}", flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes our stdin
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="best of N per row")
    parser.add_argument("--one-process", action="store_true")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        trio.run(server_main)
        return
    size = args.size_mib << 20
    if args.one_process:
        print("one process (both ends on one trio loop)")
        trio.run(one_process, size, args.rounds)
        return
    argv = [sys.executable, __file__, "--serve"]
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline().split()
        if not line or line[0] != "READY":
            raise SystemExit(f"echo server did not start: {line}")
        print("two processes (echo server in a subprocess)")
        # The server's key is its own: no expected peer ID (the handshake still authenticates it).
        trio.run(measure, int(line[1]), int(line[2]), None, size, args.rounds)
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
