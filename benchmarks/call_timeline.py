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
# (stage, its start, its end): a stamp's label, "v." before the volunteer's; each point is the
# first such stamp after the stage before it ended
STAGES = [
    ("caller hands the call to the trainer's loop", "call", "task<"),
    ("request encoded, encrypted", "task<", "tx<"),
    # from the write's start: a volunteer woken on the writer's core may read before it returns
    ("request written, volunteer woken, at the header", "tx<", "v.header<"),
    ("inputs read", "v.header<", "v.inputs>"),
    ("to the runtime", "v.inputs>", "v.compute<"),
    ("compute", "v.compute<", "v.compute>"),
    ("reply serialized", "v.compute>", "v.serialize>"),
    ("reply receipted (digests, signature)", "v.serialize>", "v.receipt>"),
    ("reply encoded, encrypted", "v.receipt>", "v.tx<"),
    ("reply written, the trainer's reader has it", "v.tx<", "rx>"),
    ("reply decrypted, its header read", "rx>", "reply<"),
    ("reply payload read", "reply<", "outputs>"),
    ("reply checked, call bookkeeping", "outputs>", "task>"),
    ("loop hands the outputs back to the caller", "task>", "returned"),
]


def _stamp(label: str, mark: str = "<") -> None:
    STAMPS.append((label + mark, time.perf_counter_ns()))


_stamped = wrapper(_stamp, lambda label, _: _stamp(label, ">"))


def serve(hidden: int) -> None:
    """The volunteer side: serve the expert, stamp its path; on stdin ``R`` forgets the stamps
    so far, ``D path`` writes them to ``path`` as JSON."""
    import trio

    from volunteer.experts import ExpertsConfig
    from volunteer.experts.backend import make_backend
    from volunteer.net.stack import StackOptions
    from volunteer.node import VolunteerOptions, open_volunteer
    from volunteer.swarmfile import SwarmSpec

    async def main() -> None:
        config = ExpertsConfig(device="cpu", nan_check=False)
        options = VolunteerOptions(listen=["/ip4/127.0.0.1/tcp/0"], stack=StackOptions(relay_client=False, hole_punching=False),
                                   nat=False, mdns=False, experts_config=config,
                                   backends=[make_backend(f"ffn{hidden}.0", "ffn", hidden, config=config)])
        async with open_volunteer(SwarmSpec("bench", "bench", receipts=True), options) as node:
            print("READY", node.host.full_addrs()[0], flush=True)
            while line := await trio.to_thread.run_sync(sys.stdin.readline):
                if line.startswith("R"):
                    STAMPS.clear()
                elif line.startswith("D"):
                    Path(line.split(None, 1)[1].strip()).write_text(json.dumps(STAMPS))
                    print("DONE", flush=True)

    install(VOLUNTEER, _stamped)
    trio.run(main)


def _after(stamps: list[tuple[str, int]], label: str, since: int) -> int | None:
    """The first stamp ``label`` at or after ``since``, or None."""
    return next((t for name, t in stamps if name == label and t >= since), None)


def join(calls: list[list[tuple[str, int]]], volunteer: list[tuple[str, int]]) -> list[dict[str, float]]:
    """Per call, each stage's microseconds (calls whose stamps do not all line up are left out)."""
    rows = []
    for stamps in calls:
        points: dict[str, int] = {"call": stamps[0][1], "returned": stamps[-1][1]}
        cursor = points["call"]
        for _, start, end in STAGES:
            for point in (start, end):
                if point in points:
                    cursor = max(cursor, points[point])
                    continue
                found = _after(volunteer, point[2:], cursor) if point.startswith("v.") else _after(stamps, point, cursor)
                if found is None or found > points["returned"]:
                    break
                points[point] = cursor = found
        if len(points) == len({p for _, s, e in STAGES for p in (s, e)}):
            rows.append({name: (points[end] - points[start]) / 1000 for name, start, end in STAGES})
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
    for name, _, _ in STAGES:
        spent = sorted(row[name] for row in rows)
        print(f"  {name:<50}{statistics.median(spent):>7.0f}   ({spent[len(spent) // 4]:.0f}-{spent[3 * len(spent) // 4]:.0f})")
    print(f"  {'the whole call':<50}{statistics.median(wholes):>7.0f}")
    if locals_:
        print(f"  {'(the same forward, local, just before)':<50}{statistics.median(locals_):>7.0f}")


if __name__ == "__main__":
    main()
