"""Benchmark peer: a volunteer serving ffn experts (hidden 256 and 1024) on loopback TCP.

    python benchmarks/_expert_server.py
Prints `READY <multiaddr>` and serves until stdin closes.
"""

import sys
from pathlib import Path

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from volunteer.experts import ExpertsConfig, make_backend, open_runtime  # noqa: E402
from volunteer.experts.server import ExpertServer  # noqa: E402
from volunteer.net.host import HostConfig, open_host  # noqa: E402

SWARM = "bench"


async def main() -> None:

    config = ExpertsConfig(device="cpu", nan_check=False)
    backends = [make_backend(f"ffn{h}.0", "ffn", h, config=config) for h in (256, 1024)]
    async with open_host(listen=["/ip4/127.0.0.1/tcp/0"], config=HostConfig(enable_hole_punching=False, enable_relay_client=False)) as host:
        async with open_runtime(backends, config) as runtime:
            ExpertServer(host, runtime, SWARM, config).install()
            print("READY", host.full_addrs()[0], flush=True)
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


if __name__ == "__main__":
    trio.run(main)
