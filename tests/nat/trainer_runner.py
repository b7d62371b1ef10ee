"""Runs inside a rig namespace: a trainer that joins a swarm (swarm file), waits until the
grid's experts are declared with relayed addresses, trains a small mixture through them and
prints one JSON line: losses, the connection path to the volunteer, and errors seen."""

from __future__ import annotations

import json
import sys
import time

import torch

from volunteer import RemoteMixtureOfExperts, Swarm


def main(swarm_file: str, steps: int = 20) -> int:
    torch.manual_seed(0)
    with Swarm.join(swarm_file, listen=["/ip4/0.0.0.0/tcp/4001"]) as swarm:
        deadline = time.monotonic() + 90
        while True:
            found = swarm.get_experts(["expert.0.0", "expert.1.1"])
            hosts = [d for decls in found.values() for d in decls]
            # wait for the heartbeat that carries the relay address (reserved after AutoNAT)
            if len(hosts) == 2 and all(any("p2p-circuit" in _text(a) for a in d.addrs) for d in hosts):
                break
            if time.monotonic() > deadline:
                print(json.dumps({"ok": False, "error": f"experts not declared with relayed addresses: {found}"}, default=str))
                return 1
            time.sleep(0.5)
        moe = RemoteMixtureOfExperts(swarm, in_features=16, grid_size=(2, 2), uid_prefix="expert", k_best=2,
                                     forward_timeout=20, backward_timeout=20, timeout_after_k_min=2)
        head = torch.nn.Linear(16, 1)
        optimizer = torch.optim.Adam([*moe.parameters(), *head.parameters()], lr=3e-2)
        x = torch.randn(64, 16)
        target = x[:, :4].sum(-1, keepdim=True)
        losses = []
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(head(moe(x)), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        volunteer = hosts[0].peer
        conn = swarm.loop.run(_path, swarm.host, volunteer)
        print(json.dumps({"ok": True, "losses": losses, "path": conn, "failures": moe.failures}))
    return 0


def _text(addr) -> str:
    from volunteer.net.multiaddr import Multiaddr

    return str(Multiaddr(addr)) if isinstance(addr, bytes) else str(addr)


async def _path(host, peer) -> str:
    conn = host.connection_to(peer)
    return conn.describe_path() if conn else "none"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
