"""hivemind's side of benchmarks/wan.py; runs in hivemind 1.1.12's own venv, in a rig namespace.

    python _wan_hivemind.py bootstrap --announce MADDR            # a DHT node; prints READY <maddr>
    python _wan_hivemind.py serve --uids A,B,.. --peer MADDR --announce MADDR
                                                                   # a hivemind.moe.Server; READY
    python _wan_hivemind.py train --peer MADDR [--peer MADDR ...] --steps N --warmup W
                                                                   # one JSON line, as _wan_ours
    (serve and train: [--hidden H] [--expert-class ffn|transformer]; train: [--seq L --batch B])

Everything is hivemind's own: its DHT, its Server (ffn experts, or its ``transformer``, which
takes a padding mask beside the sequence: the trainer passes one that masks nothing; Adam, as benchmarks/experts.py
runs it, with 2 connection handlers instead of 8 per expert, which would be 32 processes per
volunteer on a 2-core machine), its RemoteMixtureOfExperts with default settings, and p2pd over
TCP with its defaults. The trainer's initial peers are the bootstrap node and every server
(their forwarded addresses), as a hivemind user lists the peers they know: from the bootstrap
node alone its p2pd finds no route to the servers. Servers and
the bootstrap node run until stdin closes.
"""

import argparse
import json
import os
import sys
import time

import hivemind
import torch
from hivemind.moe.server.dht_handler import get_experts

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _wan_train import default_ifname, train  # noqa: E402  (this script's own directory)

GRID = (4, 4)
BATCH, K_BEST = 64, 4
LISTEN = "/ip4/0.0.0.0/tcp/4001"
DISCOVERY_TIMEOUT = 180.0


def bootstrap(args) -> None:
    # on a public address, as a relay must be: p2pd serves circuits only once it knows it is public,
    # and AutoNAT cannot tell with the handful of peers a benchmark has
    dht = hivemind.DHT(start=True, host_maddrs=[LISTEN], announce_maddrs=[args.announce], force_reachability="public")
    addrs = [str(a) for a in dht.get_visible_maddrs() if str(a).startswith(args.announce)]
    print("READY", addrs[0], flush=True)
    sys.stdin.read()
    dht.shutdown()


def serve(args) -> None:
    from hivemind.moe.server import Server

    options = {"host_maddrs": [LISTEN], "announce_maddrs": [args.announce]}
    server = Server.create(expert_uids=args.uids.split(","), expert_cls=args.expert_class, hidden_dim=args.hidden, device="cpu",
                           num_handlers=2, optim_cls=torch.optim.Adam, initial_peers=[args.peer], start=True,
                           **options)
    print("READY", server.dht.peer_id, flush=True)
    sys.stdin.read()
    server.shutdown()


class _Unmasked(torch.nn.Module):
    """hivemind's ``transformer`` expert takes a padding mask beside the sequence: none here."""

    def __init__(self, moe: torch.nn.Module) -> None:
        super().__init__()
        self.moe = moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x, torch.zeros(x.shape[:2], dtype=torch.bool))


def train_mixture(args) -> int:
    dht = hivemind.DHT(initial_peers=args.peer, client_mode=True, start=True, host_maddrs=["/ip4/0.0.0.0/tcp/0"])
    uids = [f"expert.{i}.{j}" for i in range(GRID[0]) for j in range(GRID[1])]
    deadline = time.monotonic() + DISCOVERY_TIMEOUT
    while True:
        found = get_experts(dht, uids)
        if all(e is not None for e in found):
            break
        if time.monotonic() > deadline:
            print(json.dumps({"error": f"{sum(e is not None for e in found)} of {len(uids)} experts found"}))
            return 1
        time.sleep(1.0)
    torch.manual_seed(0)
    moe = hivemind.RemoteMixtureOfExperts(in_features=args.hidden, grid_size=GRID, dht=dht, uid_prefix="expert.", k_best=K_BEST)
    if args.seq:
        moe = _Unmasked(moe)
    ifname = default_ifname()
    for i in range(args.warmup):
        train(moe, hidden=args.hidden, batch=args.batch, steps=1, ifname=ifname, seed=1000 + i, seq=args.seq)
    steps = train(moe, hidden=args.hidden, batch=args.batch, steps=args.steps, ifname=ifname, seq=args.seq)
    print(json.dumps({"steps": steps, "warmup": args.warmup}), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bootstrap")
    b.add_argument("--announce", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--uids", required=True)
    s.add_argument("--peer", required=True)
    s.add_argument("--announce", required=True)
    t = sub.add_parser("train")
    t.add_argument("--peer", required=True, action="append", help="initial DHT peers (repeatable)")
    t.add_argument("--steps", type=int, default=50)
    t.add_argument("--warmup", type=int, default=5)
    for command in (s, t):
        command.add_argument("--hidden", type=int, default=1024, help="the experts' width")
        command.add_argument("--expert-class", default="ffn", help="ffn or transformer")
    t.add_argument("--seq", type=int, default=0, help="positions per sample (sequence experts); 0: vectors")
    t.add_argument("--batch", type=int, default=BATCH, help="samples per step")
    args = parser.parse_args()
    if args.cmd == "bootstrap":
        bootstrap(args)
    elif args.cmd == "serve":
        serve(args)
    else:
        return train_mixture(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
