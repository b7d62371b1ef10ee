"""What the trainer does between two remote calls changes what the next one takes.

    .venv/bin/python benchmarks/call_gaps.py [--calls 300] [--hidden 256] [--batch 16]

Times a remote ffn forward (our server in a second process on loopback, as
``benchmarks/experts.py`` runs it) back to back, and after each of: a sleep of 0.5, 2 and 10 ms
(the machine idles), a 2 ms busy loop (one core stays busy), and a local forward+backward of the
same expert (what a training step does between its calls). Medians of ``--calls`` calls each.

Beside each remote call, the same gap is put before three floors: a round trip of the same
payload between this process and an echo process over plain blocking sockets (two wake-ups and
the kernel's loopback, no Python to speak of), a walk over 4,000 small Python dicts (what an
interpreter whose caches went cold pays), and the same forward done locally.

Why: what a call costs after a gap is mostly its code running in cold caches, not its wake-ups.
On the 2-core machine of the README (one run, medians of 300), a 16 KiB echo round trip took
18 us back to back and 94 us after a local forward+backward, but the walk took 361 and 691 us and
our remote forward 1,527 and 2,335 us: a remote call is mostly Python on three threads (the
caller's, the trainer's event loop, the volunteer's), and a forward+backward's tensors push
that Python's objects and code out of the caches. After a 10 ms sleep the walk took 749 us and
the local forward 840 (312 back to back). ``benchmarks/experts.py``'s alternation puts a local
forward+backward before every remote call, ours and hivemind's alike.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# An echo process: plain blocking sockets, what two processes' wake-ups and the kernel cost
ECHO = """
import socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buffer = bytearray(1 << 20)
while (n := conn.recv_into(buffer)):
    conn.sendall(memoryview(buffer)[:n])
"""
WALKED = [{"a": i, "b": str(i), "c": [i, i + 1]} for i in range(12000)]


def walk() -> int:
    """Reads 4,000 small dicts: a working set of Python objects, as a call's code has."""
    total = 0
    for item in WALKED[::3]:
        total += item["a"] + len(item["b"]) + item["c"][1]
    return total


class Echo:
    """A round trip of ``size`` bytes to the echo process."""

    def __init__(self, size: int) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
        port = int(self.process.stdout.readline())
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.message = bytes(size)
        self.buffer = bytearray(size)

    def __call__(self) -> None:
        self.sock.sendall(self.message)
        view, got = memoryview(self.buffer), 0
        while got < len(self.message):
            got += self.sock.recv_into(view[got:])

    def close(self) -> None:
        self.sock.close()
        self.process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=256, choices=[256, 1024])
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # as benchmarks/experts.py: one torch thread per process

    import torch

    from _measure import forward, forward_backward
    from experts import served
    from volunteer import RemoteExpert
    from volunteer.experts.layers import FeedForward

    torch.set_num_threads(1)
    with served() as (addr, client):
        expert = RemoteExpert(f"ffn{args.hidden}.0", addr, client)
        local = FeedForward(args.hidden)
        x = torch.randn(args.batch, args.hidden)
        for _ in range(50):  # warm-up: connection, first batches, the server's lazy imports
            forward(expert, x)

        def busy(seconds: float) -> None:
            started = time.perf_counter()
            while time.perf_counter() - started < seconds:
                pass

        gaps = [
            ("back to back", None),
            ("after sleeping 0.5 ms", lambda: time.sleep(0.0005)),
            ("after sleeping 2 ms", lambda: time.sleep(0.002)),
            ("after sleeping 10 ms", lambda: time.sleep(0.01)),
            ("after a 2 ms busy loop", lambda: busy(0.002)),
            ("after a local fwd+bwd", lambda: forward_backward(local, x)),
        ]
        echo = Echo(x.nelement() * x.element_size())
        try:
            measured = [("our remote forward", lambda: forward(expert, x)), ("echo round trip", echo),
                        ("Python walk", walk), ("local forward", lambda: forward(local, x))]
            print(f"ffn h{args.hidden} b{args.batch} forward on loopback and its floors after each gap, "
                  f"median us of {args.calls} calls each")
            print(f"  {'gap before each':<26}" + "".join(f"{name:>20}" for name, _ in measured))
            for gap, between in gaps:
                row = []
                for _, fn in measured:
                    times = []
                    for _ in range(args.calls):
                        if between is not None:
                            between()
                        started = time.perf_counter()
                        fn()
                        times.append(time.perf_counter() - started)
                    row.append(statistics.median(times) * 1e6)
                print(f"  {gap:<26}" + "".join(f"{value:>20.0f}" for value in row))
        finally:
            echo.close()

if __name__ == "__main__":
    main()
