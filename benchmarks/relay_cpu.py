"""Relayed vs direct echo on loopback, with the CPU each process spends per MiB: where a relayed
byte's cost goes, and the throughput ratio that cost allows.

    .venv/bin/python benchmarks/relay_cpu.py [--size-mib 32] [--runs 3] [--relay-buffer 256KiB]

Three processes, as on the NAT rig but without namespaces (no root needed): a relay
(`volunteer relay`), peer B holding a reservation and serving /echo/1.0.0 (tests/nat/node_runner),
and peer A (this process), which echoes ``--size-mib`` each way once over a circuit through the
relay and once over a direct connection to B, with hole punching off so the relayed connection
stays relayed. Figures are medians over ``--runs``; MB/s and CPU count both directions.

"cpu ms/MiB" is each process's user+system CPU time (/proc, and this process's own) during the
echo over the MiB moved. A relayed byte is encrypted and decrypted twice by each peer (the
end-to-end Noise session inside the hop's) and once more each way by the relay, so the relayed
path needs several times the CPU of the direct one; where every process shares the same few
cores (this machine, the rig), the throughput ratio cannot beat the CPU ratio, which is printed
as "CPU-bound ceiling".
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from volunteer.net.stack import StackOptions, open_stack  # noqa: E402

from _procstat import process_cpu_seconds  # noqa: E402

ECHO = "/echo/1.0.0"
MiB = 1 << 20


def launch(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


async def echo_once(conn, size: int, pids: tuple[int, int]) -> tuple[float, list[float]]:
    """Echo ``size`` bytes each way on a new stream of ``conn``: (MB/s, cpu ms/MiB of A, B, relay)."""
    stream = await conn.new_stream([ECHO])
    payload = bytes(size)
    received = 0
    before = [time.process_time(), *(process_cpu_seconds(pid) for pid in pids)]
    started = trio.current_time()

    async def send() -> None:
        await stream.send_all(payload)
        await stream.send_eof()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        while data := await stream.receive_some(MiB):
            received += len(data)
    seconds = trio.current_time() - started
    after = [time.process_time(), *(process_cpu_seconds(pid) for pid in pids)]
    if received != size:
        raise RuntimeError(f"echo returned {received} of {size} bytes")
    moved_mib = 2 * size / MiB
    return 2 * size / seconds / 1e6, [(b - a) * 1000 / moved_mib for a, b in zip(before, after)]


async def measure(size: int, runs: int, relay_pid: int, b_pid: int, circuit: str, direct: str) -> dict[str, list]:
    rows: dict[str, list] = {"relayed": [], "direct": []}
    # No hole punching: the relayed connection must stay relayed for the whole echo.
    options = StackOptions(hole_punching=False)
    for _ in range(runs):
        for kind, addr in (("relayed", circuit), ("direct", direct)):
            async with open_stack(options=options) as host:
                conn = await host.connect(addr)
                if conn.describe_path().startswith("relayed") != (kind == "relayed"):
                    raise RuntimeError(f"{kind} echo went {conn.describe_path()}")
                rows[kind].append(await echo_once(conn, size, (b_pid, relay_pid)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=32, help="echoed each way")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, default=4701, help="the relay's port; B listens on the next one")
    parser.add_argument("--relay-buffer", metavar="SIZE", help="the relay's --buffer-size (default: its own)")
    args = parser.parse_args()
    extra = ["--buffer-size", args.relay_buffer] if args.relay_buffer else []
    relay = launch(["volunteer", "relay", "--no-dashboard", "--identity", f"/tmp/relay-cpu-{os.getpid()}.key",
                    "--listen", f"/ip4/127.0.0.1/tcp/{args.port}", "--announce", f"/ip4/127.0.0.1/tcp/{args.port}", *extra])
    peer_b = None
    try:
        relay.stdout.readline()
        relay_addr = relay.stdout.readline().split()[-1]
        peer_b = launch(["tests.nat.node_runner", "listen-via-relay", relay_addr, "--listen", f"/ip4/127.0.0.1/tcp/{args.port + 1}"])
        circuit = peer_b.stdout.readline().split()[1]
        direct = f"/ip4/127.0.0.1/tcp/{args.port + 1}/p2p/{circuit.rsplit('/p2p/', 1)[1]}"
        rows = trio.run(measure, args.size_mib * MiB, args.runs, relay.pid, peer_b.pid, circuit, direct)
    finally:
        for process in (peer_b, relay):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=10)
    print(f"\n{args.size_mib} MiB echoed each way on loopback, median of {args.runs}")
    print(f"{'path':10}{'MB/s':>10}{'A cpu ms/MiB':>16}{'B cpu ms/MiB':>16}{'relay ms/MiB':>16}{'total ms/MiB':>16}")
    medians = {}
    for kind, results in rows.items():
        mbps = statistics.median(r[0] for r in results)
        cpu = [statistics.median(r[1][i] for r in results) for i in range(3)]
        medians[kind] = (mbps, sum(cpu))
        print(f"{kind:10}{mbps:10.1f}" + "".join(f"{c:16.2f}" for c in cpu) + f"{sum(cpu):16.2f}")
    print(f"relayed/direct throughput {medians['relayed'][0] / medians['direct'][0]:.2f}; "
          f"CPU-bound ceiling (direct / relayed CPU per MiB) {medians['direct'][1] / medians['relayed'][1]:.2f}")


if __name__ == "__main__":
    main()
