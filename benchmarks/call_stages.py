"""Where one remote expert call's microseconds go: wall time per stage, trainer and volunteer side.

    .venv/bin/python benchmarks/call_stages.py [--calls 200] [--receipts on|off] [--only "h256 forward"]

Wraps the call path's functions (encode, stream writes, Noise and yamux, decode, guard, receipts,
snapshots, runtime hand-offs, call statistics) in timers, in this process (the trainer) and in a
volunteer started as a second process, runs ``--calls`` calls of each case (ffn h256 b16 and h1024
b64, forward and forward+backward) and prints, per side, the microseconds per call each stage
took in wall time and in its thread's CPU time (inclusive: a stage's time holds the stages it
calls; an async stage's CPU holds what other tasks of its thread ran while it waited; ``calls/call``:
how often it ran).
Timers add about a microsecond per wrapped call. Stages that wait (a receive, a send that wakes
the other process) hold the other side's time too on a machine whose cores are busy: read the
CPU-bound stages (digests, signatures, copies, encoding) as the costs, and compare runs of the
same load. Not a figure for the README by itself: ``benchmarks/experts.py`` is that.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import inspect
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TOTALS: collections.Counter = collections.Counter()  # label -> ns
CPU: collections.Counter = collections.Counter()  # label -> ns of its thread's CPU time
COUNTS: collections.Counter = collections.Counter()  # label -> calls

_NET = [
    ("volunteer.net.noise.transport", "NoiseTransport.encrypt_parts", "noise encrypt"),
    ("volunteer.net.noise.transport", "NoiseTransport.receive_data", "noise decrypt"),
    ("volunteer.net.yamux.session", "Session.receive_data", "yamux receive_data"),
    ("volunteer.net.yamux.session", "Session.send_data", "yamux send_data"),
    ("volunteer.net.yamux.driver", "YamuxConnection._flush", "yamux flush (incl. socket send)"),
]
TRAINER = [
    ("volunteer.experts.loop", "BackgroundLoop.run", "thread hop + whole call"),
    ("volunteer.experts.client", "_Call.forward", "_Call.forward"),
    ("volunteer.experts.client", "_Call.backward", "_Call.backward"),
    ("volunteer.experts.client", "_exchange", "exchange (incl. waiting)"),
    ("volunteer.experts.client", "serialize", "serialize"),
    ("volunteer.experts.client", "detached_cpu", "detached_cpu"),
    ("volunteer.experts.client", "check_reply", "receipt check"),
    ("volunteer.experts.client", "_Call._encoding", "encoding choice"),
    ("volunteer.experts.protocol", "Request.encode", "Request.encode"),
    ("volunteer.experts.protocol", "Reply.decode", "Reply.decode"),
    ("volunteer.experts.receipts", "Receipt.from_wire", "Receipt.from_wire"),
    ("volunteer.experts.receipts", "PayloadDigest.update", "reply digest"),
    ("volunteer.experts.tensors", "TensorReader.__init__", "TensorReader header"),
    ("volunteer.experts.tensors", "TensorReader.feed", "TensorReader.feed"),
    ("volunteer.experts.tensors", "TensorReader.finish", "TensorReader.finish"),
    ("volunteer.experts.guard", "ReplyGuard.check_outputs", "guard outputs"),
    ("volunteer.experts.guard", "ReplyGuard.check_gradients", "guard gradients"),
    ("volunteer.experts.guard", "log_rms", "guard: reply's scale"),
    ("volunteer.experts.guard", "RangeTracker.add", "guard: range learning"),
    ("volunteer.experts.trust", "TrustLedger.replied", "guard: ledger (replied)"),
    ("volunteer.experts.trust", "TrustLedger.accepted", "guard: ledger (accepted)"),
    ("volunteer.experts.callstats", "CallStats.record", "call statistics"),
    ("volunteer.dht.vouches", "VouchBook.accept", "vouches"),
    ("volunteer.net.pool", "StreamPool.lend", "stream pool"),
    *_NET,
]
VOLUNTEER = [
    ("volunteer.experts.server", "ExpertServer._one_call", "one call (incl. sending)"),
    ("volunteer.experts.server", "unpack", "header unpack"),
    ("volunteer.experts.protocol", "Request.from_message", "Request.from_message"),
    ("volunteer.experts.server", "ExpertServer._admit", "admission"),
    ("volunteer.experts.tensors", "TensorReader.finish", "TensorReader.finish"),
    ("volunteer.experts.runtime", "Runtime.forward", "runtime forward (incl. hand-offs)"),
    ("volunteer.experts.runtime", "Runtime.backward", "runtime backward (incl. hand-offs)"),
    ("volunteer.experts.runtime", "Runtime._perform", "runtime job"),
    ("volunteer.experts.backend", "ExpertBackend.forward", "module forward"),
    ("volunteer.experts.backend", "ExpertBackend.forward_keeping_graph", "module forward keeping graph"),
    ("volunteer.experts.backend", "ExpertBackend.backward_from_graph", "module backward from graph"),
    ("volunteer.experts.backend", "ExpertBackend.backward", "module backward"),
    ("volunteer.experts.backend", "ExpertBackend.settle", "optimizer step (settle)"),
    ("volunteer.experts.backend", "ExpertBackend.state_fingerprint", "state fingerprint"),
    ("volunteer.experts.snapshots", "SnapshotStore.note", "snapshot note (on the path)"),
    ("volunteer.experts.snapshots", "SnapshotStore._copy", "snapshot copy (its thread)"),
    ("volunteer.experts.snapshots", "SnapshotStore.settle_copies", "waiting for copies"),
    ("volunteer.experts.server", "serialize", "serialize"),
    ("volunteer.experts.server", "ExpertServer._receipt", "receipt (digests + signature)"),
    ("volunteer.experts.server", "payload_digest", "reply digest"),
    ("volunteer.experts.receipts", "Receipt.sign", "receipt signature"),
    ("volunteer.experts.protocol", "Reply.encode", "Reply.encode"),
    ("volunteer.net.upload", "UploadMeter.take", "upload meter"),
    *_NET,
]


def wrapper(on_enter, on_exit):
    """A wrapper for ``install``: around each call of a wrapped function (sync or async),
    ``on_enter(label)`` before and ``on_exit(label, what on_enter returned)`` after."""
    def wrap(fn, label: str):
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def wrapped_async(*args, **kwargs):
                entered = on_enter(label)
                try:
                    return await fn(*args, **kwargs)
                finally:
                    on_exit(label, entered)
            return wrapped_async

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            entered = on_enter(label)
            try:
                return fn(*args, **kwargs)
            finally:
                on_exit(label, entered)
        return wrapped
    return wrap


def _started(label: str) -> tuple[int, int]:
    return time.perf_counter_ns(), time.thread_time_ns()


def _ended(label: str, started: tuple[int, int]) -> None:
    TOTALS[label] += time.perf_counter_ns() - started[0]
    CPU[label] += time.thread_time_ns() - started[1]  # an async stage's: other tasks' too, while it waited
    COUNTS[label] += 1


_timed = wrapper(_started, _ended)


def install(stages, wrap=_timed) -> None:
    """Wrap each (module, "Class.attr" or "function", label) that exists in this tree with
    ``wrap(fn, label)`` (``_timed``; ``call_timeline.py`` passes its own)."""
    for module_name, qualname, label in stages:
        owner = importlib.import_module(module_name)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        if not hasattr(owner, name):
            continue  # another tree's call path: nothing to time there
        raw = inspect.getattr_static(owner, name) if inspect.isclass(owner) else getattr(owner, name)
        if isinstance(raw, (staticmethod, classmethod)):
            setattr(owner, name, type(raw)(wrap(raw.__func__, label)))
        else:
            setattr(owner, name, wrap(raw, label))


def thread_cpu() -> collections.Counter:
    """Nanoseconds each thread of this process has run, by thread name (Linux schedstat; empty
    elsewhere). Threads of one name are summed; a thread that ended is gone from both readings."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    found: collections.Counter = collections.Counter()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                found[names.get(int(tid), "other")] += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return found


def cpu_table(title: str, calls: int, before: collections.Counter, less: dict[str, int] | None = None) -> str:
    """CPU microseconds per call of each thread since ``before`` (``less``: ns to take off a
    thread, the trainer's local calls)."""
    spent = thread_cpu()
    spent.subtract(before)
    for name, ns in (less or {}).items():
        spent[name] -= ns
    lines = [f"{title}: {sum(v for v in spent.values() if v > 0) / calls / 1000:.0f} us CPU per call"]
    for name, ns in sorted(spent.items(), key=lambda item: -item[1]):
        if ns > 0:
            lines.append(f"  cpu {name:<36}{ns / calls / 1000:>10.1f} us")
    return "\n".join(lines)


def table(title: str, calls: int) -> str:
    lines = [f"{title}{'':<{max(0, 40 - len(title))}}{'wall':>13}{'CPU':>13}"]
    for label, ns in sorted(TOTALS.items(), key=lambda item: -CPU[item[0]]):
        lines.append(f"  {label:<40}{ns / calls / 1000:>10.1f} us{CPU[label] / calls / 1000:>10.1f} us "
                     f"{COUNTS[label] / calls:>6.2f} calls/call")
    return "\n".join(lines)


async def serve(receipts: bool) -> None:
    """The volunteer side: serve ffn h256 and h1024; on stdin ``R`` resets the timers, ``D n
    title`` prints their table per call for ``n`` calls (to stderr)."""
    import trio
    from _expert_server import open_bench_volunteer

    from volunteer.experts import ExpertsConfig

    async with open_bench_volunteer(ExpertsConfig(device="cpu", nan_check=False), receipts) as node:
        print("READY", node.host.full_addrs()[0], flush=True)
        cpu = thread_cpu()
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            if line.startswith("R"):
                TOTALS.clear()
                CPU.clear()
                COUNTS.clear()
                cpu = thread_cpu()
            elif line.startswith("D"):
                _, calls, title = line.split(None, 2)
                print(table(f"VOLUNTEER {title.strip()}", int(calls)), file=sys.stderr, flush=True)
                print(cpu_table(f"VOLUNTEER {title.strip()}", int(calls), cpu), file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--receipts", default="on", choices=["on", "off"])
    parser.add_argument("--only", default="", help='one case, e.g. "h256 forward" or "h1024 fwd+bwd"')
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the volunteer process
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    if args.serve:
        import trio

        install(VOLUNTEER)
        trio.run(serve, args.receipts == "on")
        return
    install(TRAINER)
    from _measure import forward, forward_backward
    from experts import Client
    from volunteer import RemoteExpert
    from volunteer.experts.layers import FeedForward

    server = subprocess.Popen([sys.executable, __file__, "--serve", "--receipts", args.receipts],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    addr = server.stdout.readline().split()[1]
    client = Client()
    try:
        for hidden, batch in ((256, 16), (1024, 64)):
            expert, local, x = RemoteExpert(f"ffn{hidden}.0", addr, client), FeedForward(hidden), torch.randn(batch, hidden)
            for name, call in (("forward", forward), ("fwd+bwd", forward_backward)):
                if args.only and args.only != f"h{hidden} {name}":
                    continue
                for _ in range(30):  # warm-up: connection, ranges, kept graphs
                    call(expert, x)
                TOTALS.clear()
                CPU.clear()
                COUNTS.clear()
                server.stdin.write("R\n")
                server.stdin.flush()
                remote, here = [], []
                local_cpu = 0  # ns of the main thread's local calls: not the remote call's cost
                cpu = thread_cpu()
                for _ in range(args.calls):
                    started = time.perf_counter()
                    call(expert, x)
                    remote.append(time.perf_counter() - started)
                    started, started_cpu = time.perf_counter(), time.thread_time_ns()
                    call(local, x)
                    here.append(time.perf_counter() - started)
                    local_cpu += time.thread_time_ns() - started_cpu
                title = f"h{hidden} b{batch} {name}"
                print(f"== {title}: remote median {statistics.median(remote) * 1e6:.0f} us, local "
                      f"{statistics.median(here) * 1e6:.0f} us", flush=True)
                print(table(f"TRAINER {title}", args.calls), flush=True)
                print(cpu_table(f"TRAINER {title}", args.calls, cpu, {threading.current_thread().name: local_cpu}), flush=True)
                server.stdin.write(f"D {args.calls} {title}\n")
                server.stdin.flush()
                time.sleep(1.0)  # its table, printed to our stderr, before the next case's
    finally:
        client.close()
        server.stdin.close()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
