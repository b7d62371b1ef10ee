"""Our trainer of benchmarks/wan.py; runs in the trainer's home of the rig with this checkout.

    python _wan_ours.py SWARM_FILE --steps N --warmup W --volunteers V [--relayed] [--hidden H]
                        [--expert-class ffn|transformer --seq L --batch B]

Joins the swarm with default settings, waits until the grid's experts are declared by all V
volunteers, then trains a RemoteMixtureOfExperts (grid 4x4, k_best 4, defaults otherwise; for
``transformer`` experts a per-sample one: whole sequences to the experts, as hivemind's).
Warm-up steps run until every volunteer's connection has the path the profile means (direct,
or relayed) and at least W steps ran; then N measured steps. Prints one JSON line: the steps
(see _wan_train.train), the connection path per volunteer, the mixture's stats, the tensor
payload bytes per measured step each way (what the physical limit counts), and with
``--controls`` (the volunteers' control sockets, reachable from every namespace: they are files)
``utilisation``: each volunteer's compute seconds (its runtime's) over the measured steps' wall
time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from _wan_train import default_ifname, train  # noqa: E402
from volunteer import RemoteMixtureOfExperts, Swarm  # noqa: E402
from volunteer.cli.control import compute_seconds  # noqa: E402
from volunteer.net.addresses import is_loopback  # noqa: E402
from volunteer.net.multiaddr import Multiaddr  # noqa: E402

GRID = (4, 4)
BATCH, K_BEST = 64, 4
DISCOVERY_TIMEOUT = 120.0
WARMUP_TIMEOUT = 180.0


def _dialable(addrs, relayed: bool) -> bool:
    """Whether a declaration has the address the profile means: a relay circuit, or an address
    off this machine (a volunteer declares 127.0.0.1 until AutoNAT has confirmed its public one)."""
    parsed = [Multiaddr(a) if isinstance(a, bytes) else a for a in addrs]
    if relayed:
        return any(a.is_relayed() for a in parsed)
    return any(not a.is_relayed() and not is_loopback(a) for a in parsed)


def _payload(swarm) -> tuple[int, int]:
    """Tensor payload bytes sent and received by every expert call so far."""
    rows = [row for hosts in swarm.expert_stats().values() for row in hosts]
    return sum(r["bytes_out"] for r in rows), sum(r["bytes_in"] for r in rows)


def _describe(conn) -> str:
    """A connection's path, what it lost of our bytes (in all and lately) and what repairs did."""
    text = conn.describe_path(with_transport=True)
    loss = conn.raw.loss()
    if loss is not None:
        text += f", {100 * loss.share:.2f} % of our bytes lost"
    stats = getattr(conn.muxer, "repair_stats", lambda: None)()
    if stats is not None and stats["repairs"]:
        text += (f" ({100 * loss.steady.share:.2f} % lately), repairs: {stats['rebuilt']} rebuilt here, "
                 f"{stats['rebuilt_by_peer']} by the peer, {stats['unrepairable']} beyond repair, "
                 f"{stats['members_sent'] / max(1, stats['blocks_sent']):.1f} per block, "
                 f"window {stats['congestion_window'] // 1024} KiB, cuts {sum(stats['window_cuts'].values())}")
    return text


async def _paths(host, peers) -> dict[str, str]:
    """Each volunteer's connections, the one its calls take first."""
    out = {}
    for peer in peers:
        best = host.connection_to(peer)
        if best is None:
            out[str(peer)] = "none"
            continue
        others = [c for c in host.connections(peer) if c is not best]
        out[str(peer)] = _describe(best) + "".join(f" (also {_describe(c)})" for c in others)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("swarm_file")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--volunteers", type=int, default=4)
    parser.add_argument("--relayed", action="store_true", help="volunteers are reached through a relay only")
    parser.add_argument("--hidden", type=int, default=1024, help="the experts' width")
    parser.add_argument("--controls", nargs="*", default=[], help="the volunteers' control sockets")
    parser.add_argument("--expert-class", default="ffn", help="the volunteers' expert class")
    parser.add_argument("--seq", type=int, default=0, help="positions per sample (sequence experts); 0: vectors")
    parser.add_argument("--batch", type=int, default=BATCH, help="samples per step")
    args = parser.parse_args()
    torch.manual_seed(0)
    ifname = default_ifname()
    with Swarm.join(args.swarm_file) as swarm:
        moe = RemoteMixtureOfExperts(swarm, in_features=args.hidden, grid_size=GRID, uid_prefix="expert", k_best=K_BEST,
                                     per_sample=args.seq > 0)
        deadline = time.monotonic() + DISCOVERY_TIMEOUT
        while True:
            live = moe.live_experts(refresh=True)
            peers = {d.peer for hosts in live.values() for d in hosts}
            usable = all(_dialable(d.addrs, args.relayed) for hosts in live.values() for d in hosts)
            if len(live) == GRID[0] * GRID[1] and len(peers) >= args.volunteers and usable:
                break
            if time.monotonic() > deadline:
                print(json.dumps({"error": f"only {len(live)} experts on {len(peers)} volunteers found"}))
                return 1
            time.sleep(0.5)
        warm = 0
        deadline = time.monotonic() + WARMUP_TIMEOUT
        while True:
            train(moe, hidden=args.hidden, batch=args.batch, steps=1, ifname=ifname, seed=1000 + warm, seq=args.seq)
            warm += 1
            paths = swarm.loop.run(_paths, swarm.host, peers)
            settled = all(p.startswith("relayed") == args.relayed and p != "none" for p in paths.values())
            if warm >= args.warmup and settled:
                break
            if time.monotonic() > deadline:
                print(json.dumps({"error": f"paths did not settle after {warm} warm-up steps: {paths}"}))
                return 1
        before = _payload(swarm)
        compute_before, wall_before = compute_seconds(args.controls), time.monotonic()
        steps = train(moe, hidden=args.hidden, batch=args.batch, steps=args.steps, ifname=ifname, seq=args.seq)
        compute_after, wall = compute_seconds(args.controls), time.monotonic() - wall_before
        after = _payload(swarm)
        paths = swarm.loop.run(_paths, swarm.host, peers)
        utilisation = [None if a is None or b is None else (a - b) / wall for a, b in zip(compute_after, compute_before)]
        print(json.dumps({"steps": steps, "paths": paths, "warmup": warm, "stats": moe.stats,
                          "payload_out": (after[0] - before[0]) / args.steps,
                          "payload_in": (after[1] - before[1]) / args.steps,
                          "utilisation": utilisation}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
