"""A volunteer node without experts for CLI tests (``open_volunteer``, the node the CLI starts):
listens on loopback, prints `READY <multiaddr>`, runs until stdin closes."""

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's volunteer, as in benchmarks/

from volunteer.node import VolunteerOptions, open_volunteer  # noqa: E402
from volunteer.swarmfile import SwarmSpec  # noqa: E402

# the first node of its own swarm: nobody to reach, no NAT to probe, no LAN to search
OPTIONS = VolunteerOptions(listen=["/ip4/127.0.0.1/tcp/0"], nat=False, mdns=False)


async def main() -> None:
    async with open_volunteer(SwarmSpec("e2e", "e2e"), OPTIONS) as node:
        print("READY", node.host.full_addrs()[0], flush=True)
        # Exit when the test closes our stdin (or kills us).
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


trio.run(main)
