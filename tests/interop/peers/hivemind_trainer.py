"""An unmodified hivemind 1.1 trainer for interop tests; runs in hivemind's own venv (.bench/hm).

    python hivemind_trainer.py --hidden H --grid N --steps S [--prefix ffn.] INITIAL_PEER

Joins the DHT through INITIAL_PEER (client mode), waits until ``get_experts`` finds all N experts
``PREFIX0 .. PREFIX{N-1}``, trains ``RemoteMixtureOfExperts`` + a local head for S steps on a fixed
regression task, then calls one expert with a wrong-shaped input and once more with a right one.
Prints one JSON line: {"first": mean loss of the first 10 steps, "last": of the last 10,
"wrong_shape_error": "<type>: <message>" or null, "after_error_shape": [...]}.
"""

import argparse
import json
import sys
import time

import hivemind
import torch
from hivemind.moe.server.dht_handler import get_experts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--grid", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prefix", default="ffn.")
    parser.add_argument("initial_peer")
    args = parser.parse_args()
    torch.manual_seed(0)
    dht = hivemind.DHT(start=True, initial_peers=[args.initial_peer], client_mode=True,
                       host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    uids = [f"{args.prefix}{i}" for i in range(args.grid)]
    deadline = time.monotonic() + 60
    while True:
        experts = get_experts(dht, uids)
        if all(expert is not None for expert in experts) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    print("found", [e is not None for e in experts], file=sys.stderr, flush=True)

    moe = hivemind.RemoteMixtureOfExperts(
        in_features=args.hidden, grid_size=(args.grid,), dht=dht, uid_prefix=args.prefix, k_best=2,
        forward_timeout=20, backward_timeout=20,
    )
    head = torch.nn.Linear(args.hidden, 4)
    optimizer = torch.optim.Adam([*moe.parameters(), *head.parameters()], lr=3e-3)
    teacher = torch.randn(args.hidden, 4)
    inputs = torch.randn(256, args.hidden)
    targets = torch.sin(inputs @ teacher)
    losses = []
    for step in range(args.steps):
        index = torch.randint(0, len(inputs), (32,))
        loss = torch.nn.functional.mse_loss(head(moe(inputs[index])), targets[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    error = None
    try:
        experts[0](torch.zeros(3, args.hidden + 1))
    except Exception as exc:  # what hivemind's client raises for a remote failure
        error = f"{type(exc).__name__}: {exc}"
    after = list(experts[0](torch.randn(3, args.hidden)).shape)
    print(json.dumps({
        "first": sum(losses[:10]) / 10, "last": sum(losses[-10:]) / 10,
        "wrong_shape_error": error, "after_error_shape": after,
    }), flush=True)
    dht.shutdown()


if __name__ == "__main__":
    main()
