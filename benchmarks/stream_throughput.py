"""Stream throughput, connection setup and ping RTT: ours vs raw trio TCP vs py-libp2p, in one run.

    .venv/bin/python benchmarks/stream_throughput.py [--size-mib 64] [--skip-pylibp2p]

Rows without "one process" are a client and a server in two processes on loopback (as two
real peers would be); "one process" rows put both hosts in one process (py-libp2p's pair-bench,
and ours the same way). Ratios compare like with like. Run `bash .ci/install_peers.sh` first for the py-libp2p rows. Echo throughput counts both directions. Ratios are
what to read: this machine is shared and noisy, so absolute figures drift between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from volunteer.net.host import HostConfig, open_host  # noqa: E402
from volunteer.net.perf import PERF, PerfLimits, perf_stream  # noqa: E402
from volunteer.net.ping import PING, Pinger  # noqa: E402

ECHO = "/echo/1.0.0"
INTEROP = Path(os.environ.get("VOLUNTEER_INTEROP_DIR", ROOT / ".interop"))
PYLIBP2P_PYTHON = INTEROP / "pylibp2p" / "bin" / "python"
PEER_SCRIPT = ROOT / "tests" / "interop" / "peers" / "pylibp2p_peer.py"


class Subprocess:
    """A server process that prints `READY <addr>` and exits when stdin closes."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.close()
            raise RuntimeError(f"{argv} did not start: {line!r}")
        self.addr = line.split()[1]

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            self.proc.wait()


async def echo_through(stream, size: int) -> float:
    """Send ``size`` bytes and read them back concurrently; returns seconds."""
    payload = memoryview(os.urandom(1 << 20))
    started = trio.current_time()
    received = 0

    async def writer():
        left = size
        while left:
            chunk = payload[: min(left, len(payload))]
            await stream.send_all(chunk)
            left -= len(chunk)
        await stream.send_eof()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        while data := await stream.receive_some(1 << 20):
            received += len(data)
    if received != size:
        raise RuntimeError(f"echo returned {received} of {size} bytes")
    return trio.current_time() - started


async def bench_raw_tcp(size: int) -> dict:
    server = Subprocess([sys.executable, "-c", RAW_TCP_SERVER])
    try:
        port = int(server.addr)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        seconds = await echo_through(stream, size)
        await stream.aclose()
    finally:
        server.close()
    return {"echo_MBps": 2 * size / seconds / 1e6}


RAW_TCP_SERVER = """
import sys, trio
async def serve(stream):
    while data := await stream.receive_some(1 << 20):
        await stream.send_all(data)
    await stream.send_eof()
async def main():
    async with trio.open_nursery() as n:
        listeners = await n.start(trio.serve_tcp, serve, 0)
        print("READY", listeners[0].socket.getsockname()[1], flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        n.cancel_scope.cancel()
trio.run(main)
"""


async def bench_ours_against(addr: str, size: int, setups: int = 30, pings: int = 500) -> dict:
    """Our client against a server at ``addr`` (ours or py-libp2p)."""
    result: dict = {}
    times = []
    for _ in range(setups):
        # A fresh client each time: TCP + Noise + yamux from nothing, as a new peer would.
        async with open_host() as client:
            started = trio.current_time()
            await client.connect(addr)
            times.append(trio.current_time() - started)
    result["setup_ms_p50"] = statistics.median(times) * 1000
    async with open_host() as client:
        conn = await client.connect(addr)
        pinger = Pinger(await conn.new_stream([PING]))
        rtts = sorted([await pinger.ping() for _ in range(pings)])
        result["ping_ms_p50"] = rtts[len(rtts) // 2] * 1000
        result["ping_ms_p99"] = rtts[int(len(rtts) * 0.99)] * 1000
        stream = await conn.new_stream([ECHO])
        result["echo_MBps"] = 2 * size / await echo_through(stream, size) / 1e6
        try:
            stream = await conn.new_stream([PERF])
            up, down = await perf_stream(stream, size, size)
            result["perf_MBps"] = 2 * size / (up + down) / 1e6
        except Exception as exc:  # a peer without perf: report, don't fail the whole table
            result["perf_error"] = repr(exc)
    return result


async def bench_ours_in_process(size: int) -> dict:
    """Both of our hosts in this one process: the same setting as py-libp2p's pair-bench."""
    async def echo(stream):
        while data := await stream.receive_some(1 << 20):
            await stream.send_all(data)
        await stream.send_eof()

    unlimited = HostConfig(perf_limits=PerfLimits(max_bytes_per_minute_per_peer=1 << 40, max_bytes_per_minute_total=1 << 40))
    async with open_host(listen=["/ip4/127.0.0.1/tcp/0"], config=unlimited) as server, open_host() as client:
        server.set_handler(ECHO, echo)
        started = trio.current_time()
        conn = await client.connect(server.full_addrs()[0])
        result = {"setup_ms_p50": (trio.current_time() - started) * 1000}
        pinger = Pinger(await conn.new_stream([PING]))
        rtts = sorted([await pinger.ping() for _ in range(200)])
        result["ping_ms_p50"] = rtts[len(rtts) // 2] * 1000
        result["ping_ms_p99"] = rtts[int(len(rtts) * 0.99)] * 1000
        result["echo_MBps"] = 2 * size / await echo_through(await conn.new_stream([ECHO]), size) / 1e6
        up, down = await perf_stream(await conn.new_stream([PERF]), size, size)
        result["perf_MBps"] = 2 * size / (up + down) / 1e6
    return result


def run_pylibp2p_two_processes(size: int) -> dict:
    """py-libp2p client and server in two processes, like our two-process row."""
    server = Subprocess([str(PYLIBP2P_PYTHON), str(PEER_SCRIPT), "serve"])
    row: dict = {}
    try:
        for command, key in (("dial-echo", "echo_MBps"), ("dial-perf", "perf_MBps")):
            args = [str(PYLIBP2P_PYTHON), str(PEER_SCRIPT), command, server.addr]
            args += ["--size", str(size)] if command == "dial-echo" else ["--upload", str(size), "--download", str(size)]
            out = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=ROOT)
            report = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
            if report.get("ok"):
                row[key] = 2 * size / report["seconds"] / 1e6
    finally:
        server.close()
    return row


def run_pylibp2p_pair(size: int) -> dict | None:
    """py-libp2p ↔ py-libp2p figures, measured by py-libp2p itself (tests/interop/peers)."""
    if not PYLIBP2P_PYTHON.exists():
        return None
    out = subprocess.run([str(PYLIBP2P_PYTHON), str(PEER_SCRIPT), "pair-bench", "--size-mib", str(size >> 20)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        print(f"py-libp2p benchmark failed: {out.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


async def main_async(args) -> None:
    size = args.size_mib << 20
    rows: dict[str, dict] = {}
    rows["raw trio TCP"] = await bench_raw_tcp(size)
    rows["ours ↔ ours, one process"] = await bench_ours_in_process(size)
    ours = Subprocess([sys.executable, str(ROOT / "benchmarks" / "_our_node.py")])
    try:
        rows["ours ↔ ours"] = await bench_ours_against(ours.addr, size)
    finally:
        ours.close()
    if not args.skip_pylibp2p and PYLIBP2P_PYTHON.exists():
        peer = Subprocess([str(PYLIBP2P_PYTHON), str(PEER_SCRIPT), "serve"])
        try:
            rows["ours → py-libp2p"] = await bench_ours_against(peer.addr, size, setups=10, pings=200)
        finally:
            peer.close()
        pair = run_pylibp2p_pair(size)
        if pair:
            rows["py-libp2p ↔ py-libp2p, one process"] = pair
        rows["py-libp2p ↔ py-libp2p"] = run_pylibp2p_two_processes(size)
    print_table(rows, args.size_mib)


def print_table(rows: dict[str, dict], size_mib: int) -> None:
    base = rows.get("py-libp2p ↔ py-libp2p", {})
    one_process_base = rows.get("py-libp2p ↔ py-libp2p, one process", {})
    cols = [("echo_MBps", "echo MB/s"), ("perf_MBps", "perf MB/s"), ("setup_ms_p50", "setup ms"),
            ("ping_ms_p50", "ping p50 ms"), ("ping_ms_p99", "ping p99 ms")]
    print(f"\n{size_mib} MiB over one stream, loopback, both directions counted")
    print(f"{'':36}" + "".join(f"{title:>14}" for _, title in cols))
    for name, row in rows.items():
        print(f"{name:36}" + "".join(f"{row[k]:14.2f}" if k in row else f"{'-':>14}" for k, _ in cols))
    ours = rows.get("ours ↔ ours", {})
    for name, reference in (("ours ↔ ours", base), ("ours ↔ ours, one process", one_process_base)):
        if reference and name in rows:
            print(f"\nratios, {name} over the same setting with py-libp2p (throughput: higher is better; time: lower is better):")
            for key, title in cols:
                if key in rows[name] and key in reference and reference[key]:
                    print(f"  {title:12} {rows[name][key] / reference[key]:6.2f}x")
    if "raw trio TCP" in rows and "echo_MBps" in ours:
        print(f"ours echo / raw TCP echo: {ours['echo_MBps'] / rows['raw trio TCP']['echo_MBps']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--skip-pylibp2p", action="store_true")
    trio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
