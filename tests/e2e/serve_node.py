"""A bare volunteer node for CLI tests: listens on loopback, prints `READY <multiaddr>`, runs until stdin closes."""

import sys

import trio

from volunteer.net.host import open_host


async def main() -> None:
    async with open_host(listen=["/ip4/127.0.0.1/tcp/0"]) as host:
        print("READY", host.full_addrs()[0], flush=True)
        # Exit when the test closes our stdin (or kills us).
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


trio.run(main)
