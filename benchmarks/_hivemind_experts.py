"""hivemind's side of benchmarks/experts.py; runs in hivemind's own venv.

Prints one JSON object: {"256x16": {"forward_ms", "forward_backward_ms", "local_forward_ms",
"local_forward_backward_ms"}, "1024x64": {...}, "throughput": samples/s}. The server is hivemind's
own (background_server, expert_cls="ffn", Adam) in another process on loopback; the client finds
the experts through the DHT as hivemind's tests do, and calls them with RemoteExpert.
"""

import argparse
import faulthandler
import json
import sys

import hivemind
import torch
from hivemind.moe.client.expert import create_remote_experts
from hivemind.moe.expert_uid import ExpertInfo
from hivemind.moe.server import background_server
from hivemind.moe.server.layers.common import FeedforwardBlock

from _measure import latency_figures, trainers_throughput  # this script's own directory

CONFIGS = [(256, 16), (1024, 64)]


def run_isolated(argv: list[str]) -> dict:
    """Run one config in a fresh process group; its output goes to a file, since hivemind's
    helper processes (p2pd, handlers) outlive it holding any pipe open; kill them all after."""
    import os
    import signal
    import subprocess
    import tempfile

    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=900)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--throughput-seconds", type=float, default=15.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", help="HIDDENxBATCH: measure one config (hivemind cannot start a second server in one process)")
    args = parser.parse_args()
    if not args.only:
        merged = {}
        for hidden, batch in CONFIGS:
            merged.update(run_isolated([sys.argv[0], *sys.argv[1:], "--only", f"{hidden}x{batch}"]))
        print(json.dumps(merged))
        return
    faulthandler.dump_traceback_later(int(__import__("os").environ.get("HM_DUMP", "900")), exit=True)  # a hung call must not hang the benchmark run
    if args.quick:
        args.repeats, args.throughput_seconds = 10, 4.0
    out = {}
    for hidden, batch in [c for c in CONFIGS if f"{c[0]}x{c[1]}" == args.only]:
        with background_server(expert_uids=[f"ffn{hidden}.0"], expert_cls="ffn", hidden_dim=hidden, num_handlers=2,
                               device="cpu", optim_cls=torch.optim.Adam) as server_peer:
            dht = hivemind.DHT(initial_peers=server_peer.addrs, start=True)
            expert = create_remote_experts([ExpertInfo(f"ffn{hidden}.0", server_peer.peer_id)], dht)[0]
            local = FeedforwardBlock(hidden)
            x = torch.randn(batch, hidden)
            print(f"hivemind h{hidden} b{batch}: measuring", file=sys.stderr, flush=True)
            out[f"{hidden}x{batch}"] = latency_figures(expert, local, x, args.repeats)
            if hidden == 1024:
                out["throughput"] = trainers_throughput(expert, args.throughput_seconds, 16, hidden, batch)
            dht.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
