"""One remote expert call's critical path, both processes on one clock: where a call's time goes.

    .venv/bin/python benchmarks/call_timeline.py [--calls 300] [--gap local|none] [--hidden 256] [--batch 16]

Runs a volunteer (ffn, receipts on) in a second process and times ``--calls`` remote forwards
from this one, each after a local forward+backward of the same expert (``--gap local``: what
``benchmarks/experts.py``'s alternation puts before every remote call) or back to back
(``--gap none``). Both processes stamp the same points of the call path with the monotonic
clock, which Linux shares between processes, and the stamps are joined call by call into the
stages below (medians, with the quartiles): where the caller hands the call to the trainer's
event loop, where the request leaves, where the volunteer hears it, computes and answers, where
the reply is read and checked, and where the caller has it back. The stages add up to the call.

Why: ``call_stages.py`` says what each function costs on each side; this says which of those
costs a call waits for, and how long each process waits for the other (a wake-up, a core busy
with the other process). A stamp costs about a microsecond. Timings move with the machine's
load: compare stages within one run, and runs of one load.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from call_stages import install, wrapper  # noqa: E402  (puts the project on sys.path too)

STAMPS: list[tuple[str, int]] = []  # (label + "<" on entry or ">" on exit, ns)
_TCP = "volunteer.net.transport.tcpstream"
TRAINER = [
    ("volunteer.experts.client", "_Call.forward", "task"),
    (_TCP, "TcpStream.send_all", "tx"),
    (_TCP, "TcpStream.receive_some", "rx"),
    ("volunteer.experts.client", "Reply.decode", "reply"),
    ("volunteer.experts.client", "TensorReader.finish", "outputs"),
]
VOLUNTEER = [
    (_TCP, "TcpStream.send_all", "tx"),
    (_TCP, "TcpStream.receive_some", "rx"),
    ("volunteer.experts.server", "unpack", "header"),
    ("volunteer.experts.tensors", "TensorReader.finish", "inputs"),
    ("volunteer.experts.runtime", "Runtime.forward", "compute"),
    ("volunteer.experts.server", "serialize", "serialize"),
    ("volunteer.experts.server", "ExpertServer._receipt", "receipt"),
]
# Each stage ends at a stamp (its label; "v." before the volunteer's): the first such stamp after
# the stage before ended. The first stage starts at the call, the last ends at its return.
STAGES = [
    ("caller hands the call to the trainer's loop", "task<"),
    ("request encoded, encrypted", "tx<"),
    # to the volunteer's header from the write's start: woken on the writer's core, the volunteer
    # may read before the write returns
    ("request written, volunteer woken, at the header", "v.header<"),
    ("inputs read", "v.inputs>"),
    ("to the runtime", "v.compute<"),
    ("compute", "v.compute>"),
    ("reply serialized", "v.serialize>"),
    ("reply receipted (digests, signature)", "v.receipt>"),
    ("reply encoded, encrypted", "v.tx<"),
    ("reply written, the trainer's reader has it", "rx>"),
    ("reply decrypted, its header read", "reply<"),
    ("reply payload read", "outputs>"),
    ("reply checked, call bookkeeping", "task>"),
    ("loop hands the outputs back to the caller", "returned"),
]


def _stamp(label: str, mark: str = "<") -> None:
    STAMPS.append((label + mark, time.perf_counter_ns()))


_stamped = wrapper(_stamp, lambda label, _: _stamp(label, ">"))


def serve(hidden: int) -> None:
    """The volunteer side: serve the expert, stamp its path; on stdin ``R`` forgets the stamps
    so far, ``D path`` writes them to ``path`` as JSON."""
    import trio
    from _expert_server import open_bench_volunteer

    from volunteer.experts import ExpertsConfig

    async def main() -> None:
        async with open_bench_volunteer(ExpertsConfig(device="cpu", nan_check=False), True, (hidden,)) as node:
            print("READY", node.host.full_addrs()[0], flush=True)
            while line := await trio.to_thread.run_sync(sys.stdin.readline):
                if line.startswith("R"):
                    STAMPS.clear()
                elif line.startswith("D"):
                    Path(line.split(None, 1)[1].strip()).write_text(json.dumps(STAMPS))
                    print("DONE", flush=True)

    install(VOLUNTEER, _stamped)
    trio.run(main)


def _by_label(stamps: list[tuple[str, int]]) -> dict[str, list[int]]:
    """Each label's stamp times, in order."""
    times: dict[str, list[int]] = {}
    for label, t in stamps:
        times.setdefault(label, []).append(t)
    for found in times.values():
        found.sort()  # a process's threads (the runtime's worker) stamp too
    return times


def join(calls: list[list[tuple[str, int]]], volunteer: list[tuple[str, int]]) -> list[dict[str, float]]:
    """Per call, each stage's microseconds (calls whose stamps do not all line up are left out)."""
    theirs = _by_label(volunteer)
    rows = []
    for stamps in calls:
        ours = _by_label(stamps)
        ends, reached = [], stamps[0][1]  # the call's first stamp: "call"
        for _, point in STAGES:
            times = theirs.get(point[2:], []) if point.startswith("v.") else ours.get(point, [])
            at = bisect.bisect_left(times, reached)
            if at == len(times) or times[at] > stamps[-1][1]:  # not within this call
                break
            reached = times[at]
            ends.append(reached)
        else:
            rows.append({name: (end - start) / 1000
                         for (name, _), start, end in zip(STAGES, [stamps[0][1], *ends], ends)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--gap", default="local", choices=["local", "none"],
                        help="before each remote call: a local forward+backward (as experts.py), or nothing")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the volunteer process
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    if args.serve:
        serve(args.hidden)
        return
    from _measure import forward, forward_backward
    from experts import Client
    from volunteer import RemoteExpert
    from volunteer.experts.layers import FeedForward

    server = subprocess.Popen([sys.executable, __file__, "--serve", "--hidden", str(args.hidden)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    addr = server.stdout.readline().split()[1]
    client = Client()
    try:
        expert, local = RemoteExpert(f"ffn{args.hidden}.0", addr, client), FeedForward(args.hidden)
        x = torch.randn(args.batch, args.hidden)
        for _ in range(30):  # warm-up: connection, ranges, the runtime's costs
            forward(expert, x)
        install(TRAINER, _stamped)
        server.stdin.write("R\n")
        server.stdin.flush()
        calls, wholes, locals_ = [], [], []
        for _ in range(args.calls):
            if args.gap == "local":
                forward_backward(local, x)
                started = time.perf_counter_ns()
                forward(local, x)
                locals_.append((time.perf_counter_ns() - started) / 1000)
            STAMPS.clear()
            STAMPS.append(("call", time.perf_counter_ns()))
            forward(expert, x)
            STAMPS.append(("returned", time.perf_counter_ns()))
            calls.append(list(STAMPS))
            wholes.append((STAMPS[-1][1] - STAMPS[0][1]) / 1000)
        with tempfile.TemporaryDirectory() as tmp:
            dump = Path(tmp) / "volunteer.json"
            server.stdin.write(f"D {dump}\n")
            server.stdin.flush()
            assert server.stdout.readline().startswith("DONE")
            volunteer = [tuple(stamp) for stamp in json.loads(dump.read_text())]
    finally:
        client.close()
        server.stdin.close()
        server.wait(timeout=30)
    rows = join(calls, volunteer)
    print(f"ffn h{args.hidden} b{args.batch} forward, {args.calls} calls, gap: {args.gap}; "
          f"{len(rows)} joined; medians (quartiles), us")
    for name, _ in STAGES:
        spent = sorted(row[name] for row in rows)
        print(f"  {name:<50}{statistics.median(spent):>7.0f}   ({spent[len(spent) // 4]:.0f}-{spent[3 * len(spent) // 4]:.0f})")
    print(f"  {'the whole call':<50}{statistics.median(wholes):>7.0f}")
    if locals_:
        print(f"  {'(the same forward, local, just before)':<50}{statistics.median(locals_):>7.0f}")


if __name__ == "__main__":
    main()
