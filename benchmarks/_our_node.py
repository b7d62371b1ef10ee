"""Benchmark peer: a volunteer node serving /echo/1.0.0 (and perf, ping) on loopback.

Prints `READY <multiaddr>` and runs until stdin closes. Run with the project's Python.
``--quic``: listen on QUIC v1 instead of TCP.
"""

import sys
from pathlib import Path

import trio

# this checkout's volunteer, not whichever copy the venv has installed
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from volunteer.net.stack import StackOptions, open_stack  # noqa: E402
from volunteer.net.perf import PerfLimits  # noqa: E402

ECHO = "/echo/1.0.0"


async def echo(stream) -> None:
    while data := await stream.receive_some(1 << 20):
        await stream.send_all(data)
    await stream.send_eof()


async def main() -> None:
    # Benchmarks move gigabytes: lift the perf budget that protects real volunteers.
    options = StackOptions(perf=PerfLimits(max_bytes_per_minute_per_peer=1 << 40, max_bytes_per_minute_total=1 << 40))
    listen = "/ip4/127.0.0.1/udp/0/quic-v1" if "--quic" in sys.argv[1:] else "/ip4/127.0.0.1/tcp/0"
    async with open_stack(listen=[listen], options=options) as host:
        host.set_handler(ECHO, echo)
        print("READY", host.full_addrs()[0], flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


trio.run(main)
