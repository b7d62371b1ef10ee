"""A real ``hivemind.moe.Server`` for interop tests; runs in hivemind's own venv (.bench/hm).

    python hivemind_server.py --hidden H --uids ffn.0,ffn.1 [INITIAL_PEER ...]

Hosts ffn experts with those uids (CPU), declares them in the DHT, prints ``READY <multiaddr>``
once serving, and runs until stdin closes or it is killed.
"""

import argparse
import sys

import torch
from hivemind.moe.server import Server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--uids", required=True)
    parser.add_argument("initial_peers", nargs="*")
    args = parser.parse_args()
    torch.manual_seed(0)
    server = Server.create(
        expert_uids=args.uids.split(","), expert_cls="ffn", hidden_dim=args.hidden, device="cpu",
        initial_peers=args.initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True,
        max_batch_size=1024, num_handlers=2,
    )
    addrs = [str(addr) for addr in server.dht.get_visible_maddrs() if "/tcp/" in str(addr)]
    print("READY", addrs[0], flush=True)
    sys.stdin.read()  # until our side closes stdin
    server.shutdown()


if __name__ == "__main__":
    main()
