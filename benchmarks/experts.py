"""Remote expert latency and server throughput: ours vs hivemind 1.1.12, side by side in one run.

    .venv/bin/python benchmarks/experts.py [--repeats 50] [--rounds 3] [--quick] [--skip-hivemind]
                                           [--device cuda] [--receipts on|off] [--inline-compute-limit S]

For ffn experts at hidden 256 / batch 16 and hidden 1024 / batch 64 on CPU over loopback (the
server in a second process): median latency of a remote forward and of forward+backward, the
same computation done locally, and the overhead (remote minus local). Then server throughput in
samples/s with 16 concurrent trainers doing forward+backward (hidden 1024, batch 64). hivemind's
figures come from benchmarks/_hivemind_experts.py in its own venv (benchmarks/setup_hivemind.sh).
Each case's four figures (remote and local, forward and forward+backward) are timed call by call in
turn (``_measure.latency_figures``), and ``--rounds`` rounds run ours and then hivemind's, so that
each ratio compares two measurements minutes apart at most; the table gives the median ratio and
every round's. The goal: our overhead at most a fifth of hivemind's, throughput at least
hivemind's. Last, what
the trainer's checks of every reply (experts/guard.py) cost: forward+backward with them and
without, alternating call by call in the same run (the goal: at most 5 %). ``--receipts``: whether
our server signs receipts and keeps snapshots (exact audits: on by default in a swarm of our kind).

Every process (this one, our server, hivemind's) runs torch with ``--torch-threads`` intra-op
threads, 1 by default: on a 2-core machine the client and the server share the cores, and a
parallel region whose second thread waits for a busy core took ~24 ms instead of 0.2 ms, which
made the local baselines (and so the overheads) noise. Both sides get the same setting.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _measure import forward_backward, latency_figures, trainers_throughput  # noqa: E402
from volunteer import RemoteExpert  # noqa: E402
from volunteer.experts.client import DHTDirectory  # noqa: E402
from volunteer.experts.layers import FeedForward  # noqa: E402
from volunteer.experts.loop import BackgroundLoop  # noqa: E402
from volunteer.net.stack import StackOptions, open_stack  # noqa: E402

CONFIGS = [(256, 16), (1024, 64)]


class Client:
    """A trainer-side host in a background loop (what Swarm holds, without a DHT): calls go
    through our directory, to the server's address."""

    swarm_id = "bench"
    faults = None

    def __init__(self) -> None:
        import trio

        from volunteer.experts.callstats import CallStats
        from volunteer.experts.guard import ReplyGuard
        from volunteer.experts.trust import TrustLedger
        from volunteer.dht.vouches import VouchBook
        from volunteer.net.identity import KeyPair

        self.loop = BackgroundLoop().start()
        self.calls = CallStats()
        self.guard = ReplyGuard(TrustLedger())
        self.vouches = VouchBook(KeyPair.generate(), self.swarm_id, 0.0)  # tallied as a trainer does
        self._stop = None

        async def start() -> None:
            ready = trio.Event()

            async def main() -> None:
                async with open_stack(options=StackOptions(relay_client=False, hole_punching=False)) as host:
                    self.host = host
                    self.directory = DHTDirectory(host, None, self.swarm_id)
                    self._stop = trio.Event()
                    ready.set()
                    await self._stop.wait()

            trio.lowlevel.spawn_system_task(main)
            await ready.wait()

        self.loop.run(start)

    def close(self) -> None:
        async def stop() -> None:
            self._stop.set()

        self.loop.run(stop)
        self.loop.stop()


@contextmanager
def served(*server_args: str) -> Iterator[tuple[str, Client]]:
    """Our server (``_expert_server.py`` with ``server_args``) in a second process, and a trainer's
    ``Client`` here: (the server's multiaddr, the client), both closed on exit."""
    server = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "_expert_server.py"), *server_args],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline()
    assert line.startswith("READY "), line
    client = None
    try:
        client = Client()
        yield line.split()[1], client
    finally:
        if client is not None:
            client.close()
        server.stdin.close()
        server.wait(timeout=30)


def measure_ours(repeats: int, throughput_seconds: float, device: str = "cpu", receipts: str = "on",
                 server_args: tuple[str, ...] = ()) -> dict:
    out: dict = {}
    with served("--device", device, "--receipts", receipts, *server_args) as (addr, client):
        for hidden, batch in CONFIGS:
            expert = RemoteExpert(f"ffn{hidden}.0", addr, client)
            local = FeedForward(hidden).to(device)
            x = torch.randn(batch, hidden)
            out[f"{hidden}x{batch}"] = latency_figures(expert, local, x, repeats)
            unchecked = RemoteExpert(f"ffn{hidden}.0", addr, client, check_replies=False)
            out[f"{hidden}x{batch}"].update(checks_cost(expert, unchecked, x, repeats))
        out["throughput"] = throughput(client, addr, throughput_seconds)
    return out


def checks_cost(checked, unchecked, x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median forward+backward ms with the trainer's reply checks (experts/guard.py) and without,
    the two alternating call by call so that both see the same machine."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for expert in (checked, unchecked):  # warm-up: connection, first batch, the guard's warm-up
        for _ in range(20):
            forward_backward(expert, x)
    for _ in range(repeats):
        for on, expert in ((True, checked), (False, unchecked)):
            started = time.perf_counter()
            forward_backward(expert, x)
            times[on].append(time.perf_counter() - started)
    return {"checked_ms": statistics.median(times[True]) * 1000, "unchecked_ms": statistics.median(times[False]) * 1000}


def guard_us(hidden: int, batch: int, repeats: int = 2000) -> float:
    """Median microseconds the reply checks of one forward+backward take in this process alone
    (the guard's statistic of the outputs and of the input gradients, its range, the ledger)."""
    from volunteer.experts.guard import ReplyGuard
    from volunteer.experts.trust import TrustLedger

    guard = ReplyGuard(TrustLedger())
    outputs, grad_inputs, grad_outputs = ([torch.randn(batch, hidden)] for _ in range(3))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        guard.check_outputs("ffn.0", "peer", outputs, outputs)
        guard.check_gradients("ffn.0", "peer", grad_inputs, grad_outputs)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def gradient_bound_cost(hidden: int, batch: int, repeats: int, device: str = "cpu") -> tuple[float, float]:
    """Median ms of one backward with its optimizer step on a volunteer's backend (no network), and
    median ms of the gradient bound's work inside it (``experts/gradbound.py``: the parameter
    gradient's norm and its verdict, what every backward now pays), alternating step by step."""
    from volunteer.experts import ExpertsConfig
    from volunteer.experts.backend import make_backend
    from volunteer.experts.backend import gradient_norm
    from volunteer.experts.gradbound import NormBound

    backend = make_backend(f"ffn{hidden}.0", "ffn", hidden, config=ExpertsConfig(device=device))
    x, g = torch.randn(batch, hidden), torch.randn(batch, hidden) * 1e-3
    settle = torch.cuda.synchronize if backend.device.type == "cuda" else (lambda: None)
    bound = NormBound()
    steps, checks = [], []
    for index in range(repeats + 5):
        started = time.perf_counter()
        backend.backward([x], [g])
        settle()
        step = time.perf_counter() - started
        backend.backward([x], [g], defer_step=True)  # grads left in place for the bound to read
        settle()  # a GPU's backward kernels finish first: their time is the step's, not the bound's
        started = time.perf_counter()
        norm = gradient_norm([p.grad for p in backend.module.parameters() if p.grad is not None])
        bound.taken(bound.check(norm))
        settle()
        check = time.perf_counter() - started
        backend.settle()
        if index >= 5:  # warm-up: first kernels, the bound's own warm-up
            steps.append(step)
            checks.append(check)
    return statistics.median(steps) * 1000, statistics.median(checks) * 1000


def throughput(client: Client, addr: str, seconds: float, trainers: int = 16, hidden: int = 1024, batch: int = 64) -> float:
    expert = RemoteExpert(f"ffn{hidden}.0", addr, client, forward_timeout=60, backward_timeout=60)
    return trainers_throughput(expert, seconds, trainers, hidden, batch)


def _dig(found: dict | None, *path: str) -> float | None:
    for key in path:
        found = (found or {}).get(key)
    return found


def _over(figures: dict, remote: str, local: str) -> float | None:
    """Remote minus local ms (0 when the remote median beat the local one), or None when a side
    has no figure."""
    if figures.get(remote) is None or figures.get(local) is None:
        return None
    return max(0.0, figures[remote] - figures[local])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="ours then hivemind's, this many times (default 3)")
    parser.add_argument("--throughput-seconds", type=float, default=15.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-hivemind", action="store_true")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch intra-op threads in every process, ours and hivemind's (default 1)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where our server's experts and the local baseline run (hivemind's stay on CPU)")
    parser.add_argument("--receipts", default="on", choices=["on", "off"],
                        help="our server signs receipts and keeps snapshots (default on, as a swarm of our kind)")
    parser.add_argument("--inline-compute-limit", type=float,
                        help="our server's ExpertsConfig.inline_compute_limit in seconds (its default if not given)")
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # the server and hivemind's process inherit it
        os.environ[name] = str(args.torch_threads)
    torch.set_num_threads(args.torch_threads)
    if args.quick:
        args.repeats, args.throughput_seconds, args.rounds = 10, 4.0, 1

    rounds: list[tuple[dict, dict | None]] = []
    for _ in range(args.rounds):  # ours then hivemind's, round after round: each ratio from one moment
        ours = measure_ours(args.repeats, args.throughput_seconds, args.device, args.receipts,
                            () if args.inline_compute_limit is None else ("--inline-compute-limit", str(args.inline_compute_limit)))
        theirs = None
        if not args.skip_hivemind:
            from hivemind_runner import run_hivemind

            theirs = run_hivemind("_hivemind_experts.py", ["--quick"] if args.quick else ["--repeats", str(args.repeats)],
                                  timeout=1800)
        rounds.append((ours, theirs))
    print(f"\nRemote ffn experts on {args.device}, loopback, server in another process ({args.rounds} round(s) of "
          f"{args.repeats} calls per case; figures: medians over rounds of each round's median; ratio: median of the "
          f"rounds' ratios; {args.torch_threads} torch thread(s) per process, receipts {args.receipts})")
    print(f"{'figure':<34}{'ours':>10}{'hivemind':>10}{'ratio':>8}   per round")

    def across(side: int, *path: str) -> float | None:
        values = [_dig(pair[side], *path) for pair in rounds]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    for hidden, batch in CONFIGS:
        key = f"{hidden}x{batch}"
        for figure in ("forward_ms", "forward_backward_ms", "local_forward_ms", "local_forward_backward_ms"):
            o = across(1, key, figure)
            print(f"{f'h{hidden} b{batch} {figure}':<34}{across(0, key, figure):>10.1f}{(f'{o:.1f}' if o else 'n/a'):>10}")
        for name, remote, local in (("forward", "forward_ms", "local_forward_ms"), ("fwd+bwd", "forward_backward_ms", "local_forward_backward_ms")):
            overheads = [(_over(ours[key], remote, local), _over((theirs or {}).get(key, {}), remote, local)) for ours, theirs in rounds]
            ratios = [mine / other for mine, other in overheads if other]  # theirs at or under 0: no ratio
            ours_over = statistics.median(mine for mine, _ in overheads)
            theirs_known = [other for _, other in overheads if other is not None]
            theirs_over = statistics.median(theirs_known) if theirs_known else None
            ratio = f"{statistics.median(ratios):.2f}" if ratios else "n/a"
            print(f"{f'h{hidden} b{batch} {name} overhead ms':<34}{ours_over:>10.1f}"
                  f"{(f'{theirs_over:.1f}' if theirs_over is not None else 'n/a'):>10}{ratio:>8}   "
                  + " ".join(f"{r:.2f}" for r in ratios))
    ours_tp, theirs_tp = across(0, "throughput"), across(1, "throughput")
    ratios = [pair[0]["throughput"] / pair[1]["throughput"] for pair in rounds if (pair[1] or {}).get("throughput")]
    ratio = f"{statistics.median(ratios):.2f}" if ratios else "n/a"
    print(f"{'throughput samples/s (16 trainers)':<34}{ours_tp:>10.0f}{(f'{theirs_tp:.0f}' if theirs_tp else 'n/a'):>10}{ratio:>8}")
    print("(overhead ratio: ours / hivemind, goal <= 0.2; throughput ratio: ours / hivemind, goal >= 1)")
    ours = rounds[-1][0]
    print(f"\nThe trainer's reply checks, ours only (fwd+bwd, median of {args.repeats}, alternating call by call)")
    print(f"{'figure':<34}{'checks on':>10}{'off':>10}{'cost':>8}{'checks alone':>14}")
    for hidden, batch in CONFIGS:
        mine = ours[f"{hidden}x{batch}"]
        on, off = mine["checked_ms"], mine["unchecked_ms"]
        alone = guard_us(hidden, batch)
        print(f"{f'h{hidden} b{batch} fwd+bwd ms':<34}{on:>10.2f}{off:>10.2f}{on / off - 1:>+8.1%}{f'{alone:.0f} us':>14}")
    print("(checks alone: what they take of one forward+backward in this process, without the network)")
    print(f"\nThe gradient bound, volunteer side (backward + optimizer step, median of {args.repeats})")
    print(f"{'figure':<34}{'step ms':>10}{'bound ms':>10}{'cost':>8}")
    for hidden, batch in CONFIGS:
        step_ms, bound_ms = gradient_bound_cost(hidden, batch, args.repeats, args.device)
        print(f"{f'h{hidden} b{batch} backward':<34}{step_ms:>10.2f}{bound_ms:>10.3f}{bound_ms / step_ms:>+8.1%}")
    print("(bound: the parameter gradient's norm and its verdict, paid by every backward; goal under 5 %)")


if __name__ == "__main__":
    main()
