"""Benchmark peer: a volunteer serving ffn experts (hidden 256 and 1024) on loopback TCP.

    python benchmarks/_expert_server.py [--device cpu|cuda] [--receipts on|off] [--inline-compute-limit S]
Prints `READY <multiaddr>` and serves until stdin closes.
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from volunteer.experts import ExpertsConfig  # noqa: E402
from volunteer.experts.backend import make_backend  # noqa: E402
from volunteer.net.stack import StackOptions  # noqa: E402
from volunteer.node import VolunteerOptions, open_volunteer  # noqa: E402
from volunteer.swarmfile import SwarmSpec  # noqa: E402

SWARM = "bench"


def open_bench_volunteer(config: ExpertsConfig, receipts: bool, hiddens: tuple[int, ...] = (256, 1024)):
    """A volunteer on loopback TCP (no NAT, relay, hole punching or mDNS) serving an ffn expert
    ``ffn{h}.0`` of each hidden size: what every expert benchmark's server runs."""
    backends = [make_backend(f"ffn{h}.0", "ffn", h, config=config) for h in hiddens]
    options = VolunteerOptions(
        listen=["/ip4/127.0.0.1/tcp/0"], stack=StackOptions(relay_client=False, hole_punching=False),
        nat=False, mdns=False, experts_config=config, backends=backends,
    )
    return open_volunteer(SwarmSpec(SWARM, SWARM, receipts=receipts), options)


async def main(device: str, receipts: bool, inline_compute_limit: float | None = None) -> None:
    config = ExpertsConfig(device=device, nan_check=False)
    if inline_compute_limit is not None:
        config = dataclasses.replace(config, inline_compute_limit=inline_compute_limit)
    async with open_bench_volunteer(config, receipts) as node:
        print("READY", node.host.full_addrs()[0], flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--receipts", default="on", choices=["on", "off"])
    parser.add_argument("--inline-compute-limit", type=float, help="ExpertsConfig.inline_compute_limit (its default if not given)")
    args = parser.parse_args()
    trio.run(main, args.device, args.receipts == "on", args.inline_compute_limit)
