"""Python function calls one remote expert call makes, trainer and volunteer side, counted exactly.

    .venv/bin/python benchmarks/call_functions.py [--calls 100] [--case forward|fwd+bwd] [--top 30]

A volunteer (ffn h256, receipts on) runs in this process on its own trio thread, so that one
profile hook per thread (``sys.setprofile``) sees every Python function the call runs: the
caller's thread (autograd, the hand-off), the trainer's event loop, the volunteer's event loop.
Prints the Python calls per remote call of each (C functions not counted), and the functions
called most. A count, not a time: it does not move with the machine's load, and it says where a
call's Python is, which a sampling profiler of a 1 ms call does not. Wall times stay
``benchmarks/experts.py``'s; instructions, ``benchmarks/call_instructions.py``'s.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
WARM_UP = 30


def counter() -> tuple:
    """A profile hook counting Python function calls by file:function, and its counts."""
    counts: collections.Counter = collections.Counter()

    def hook(frame, event, arg) -> None:
        if event == "call":
            code = frame.f_code
            counts[f"{code.co_filename.split('site-packages/')[-1].replace(str(ROOT) + '/', '')}:{code.co_name}"] += 1

    return hook, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--case", default="forward", choices=["forward", "fwd+bwd"])
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import trio

    torch.set_num_threads(1)
    from _measure import forward, forward_backward
    from experts import Client
    from volunteer import RemoteExpert
    from volunteer.experts import ExpertsConfig
    from volunteer.experts.backend import make_backend
    from volunteer.experts.loop import BackgroundLoop
    from volunteer.net.stack import StackOptions
    from volunteer.node import VolunteerOptions, open_volunteer
    from volunteer.swarmfile import SwarmSpec

    volunteer_loop = BackgroundLoop("volunteer").start()
    address: list[str] = []
    ready = threading.Event()

    async def serve() -> None:
        config = ExpertsConfig(device="cpu", nan_check=False)
        options = VolunteerOptions(
            listen=["/ip4/127.0.0.1/tcp/0"], stack=StackOptions(relay_client=False, hole_punching=False), nat=False,
            mdns=False, experts_config=config, backends=[make_backend("ffn256.0", "ffn", 256, config=config)],
        )
        async with open_volunteer(SwarmSpec("bench", "bench", receipts=True), options) as node:
            address.append(str(node.host.full_addrs()[0]))
            ready.set()
            await trio.sleep_forever()

    def volunteer() -> None:
        try:
            volunteer_loop.run(serve)
        except trio.RunFinishedError:
            pass  # stopped at the end, as it should be

    threading.Thread(target=volunteer, daemon=True).start()
    ready.wait()
    client = Client()
    expert, x = RemoteExpert("ffn256.0", address[0], client), torch.randn(16, 256)
    call = forward if args.case == "forward" else forward_backward
    for _ in range(WARM_UP):
        call(expert, x)

    hooks = {"caller's thread": counter(), "trainer's loop": counter(), "volunteer's loop": counter()}

    async def install(hook) -> None:
        sys.setprofile(hook)

    volunteer_loop.run(install, hooks["volunteer's loop"][0])
    client.loop.run(install, hooks["trainer's loop"][0])
    sys.setprofile(hooks["caller's thread"][0])
    for _ in range(args.calls):
        call(expert, x)
    sys.setprofile(None)
    volunteer_loop.run(install, None)
    client.loop.run(install, None)

    print(f"Python function calls per remote h256 b16 {args.case} (receipts on, {args.calls} calls counted)")
    for side, (_, counts) in hooks.items():
        print(f"{side:18} {sum(counts.values()) / args.calls:7.0f}")
    for side, (_, counts) in hooks.items():
        print(f"\n{side}: the {args.top} functions called most, per call")
        for name, count in counts.most_common(args.top):
            print(f"  {count / args.calls:7.1f}  {name}")
    client.close()
    volunteer_loop.stop()


if __name__ == "__main__":
    main()
