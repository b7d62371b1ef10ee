"""hivemind's side of benchmarks/hivemind_compat.py; runs in hivemind's own venv.

    python _hivemind_compat.py serve --uid U --hidden H      # a hivemind.moe.Server; prints READY <maddr>
    python _hivemind_compat.py client --target MADDR --uid U --hidden H --batch B --repeats N [--rows all|experts|dht]

The client is an unmodified hivemind client (client-mode DHT joined through TARGET only, its
RemoteExpert): it prints one JSON object with median milliseconds of forward, forward+backward,
DHT store and DHT get, all against TARGET.
"""

import argparse
import json
import sys
import time

import hivemind
import torch
from hivemind.moe.client.expert import create_remote_experts
from hivemind.moe.expert_uid import ExpertInfo
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from _measure import median_ms  # this script's own directory


def serve(args) -> None:
    from hivemind.moe.server import Server

    server = Server.create(expert_uids=[args.uid], expert_cls="ffn", hidden_dim=args.hidden, device="cpu",
                           host_maddrs=["/ip4/127.0.0.1/tcp/0"], num_handlers=2, start=True)
    addrs = [str(a) for a in server.dht.get_visible_maddrs() if "/tcp/" in str(a)]
    print("READY", addrs[0], flush=True)
    sys.stdin.read()
    server.shutdown()


def client(args) -> None:
    dht = hivemind.DHT(initial_peers=[args.target], client_mode=True, start=True,
                       host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    peer = PeerID.from_base58(args.target.rsplit("/p2p/", 1)[1])
    expert = create_remote_experts([ExpertInfo(args.uid, peer)], dht)[0]
    x = torch.randn(args.batch, args.hidden)

    def forward() -> None:
        with torch.no_grad():
            expert(x)

    def forward_backward() -> None:
        expert(x.clone().requires_grad_()).sum().backward()

    counter = iter(range(10**9))

    def store() -> None:
        assert dht.store(f"bench.{next(counter)}", [1, 2, 3], get_dht_time() + 60)

    dht.store("bench.get", "value", get_dht_time() + 600)

    def get() -> None:
        assert dht.get("bench.get", latest=True) is not None

    out = {}
    if args.rows in ("all", "experts"):
        out["forward_ms"] = median_ms(forward, args.repeats)
        out["forward_backward_ms"] = median_ms(forward_backward, args.repeats)
    if args.rows in ("all", "dht"):
        out["dht_store_ms"] = median_ms(store, args.repeats)
        out["dht_get_ms"] = median_ms(get, args.repeats)
    print(json.dumps(out), flush=True)
    dht.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["serve", "client"])
    parser.add_argument("--target")
    parser.add_argument("--uid", default="ffn.0")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", choices=["all", "experts", "dht"], default="all")
    args = parser.parse_args()
    serve(args) if args.mode == "serve" else client(args)


if __name__ == "__main__":
    main()
