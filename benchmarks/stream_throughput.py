"""Stream throughput, connection setup and ping RTT: ours vs raw trio TCP vs py-libp2p, in one run.

    .venv/bin/python benchmarks/stream_throughput.py [--size-mib 64] [--runs 3] [--quick] [--skip-pylibp2p]

Rows without "one process" are a client and a server in two processes on loopback (as two
real peers would be); "one process" rows put both hosts in one process (py-libp2p's pair-bench,
and ours the same way). "over QUIC" rows are ours on QUIC v1 (aioquic; TLS 1.3 and QUIC's own
streams instead of Noise and yamux); there is no py-libp2p QUIC row, because py-libp2p 0.8.1's QUIC
stream drops bytes past 2 MiB unread (see tests/interop/test_quic_interop.py). Ratios compare like with like. Run `bash .ci/install_peers.sh` first for the py-libp2p rows. Echo throughput counts both directions. Ratios are
what to read: this machine is shared and noisy, so absolute figures drift between runs; with
``--runs N`` every figure is the median of N runs. "cpu ms/MiB" is the CPU time both processes
spent per MiB of echo (robust to other load on the machine, unlike MB/s).

The "whole command" rows time a command line as a user runs it, process start to exit:
``volunteer perf --upload S --download S ADDR`` against our node, and py-libp2p's own perf client
(``libp2p.perf.PerfService``) against py-libp2p's perf server; MB/s counts both directions.
``--quick`` moves 16 MiB instead of 64 and makes fewer connections and pings. Before those rows
our package is byte-compiled (``compileall``, as ``pip install`` does for py-libp2p's): with
PYTHONDONTWRITEBYTECODE set, an editable checkout would otherwise compile every module from
source at each start, a cost no installed copy pays and py-libp2p's rows do not pay either.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from volunteer.net.stack import StackOptions, open_stack  # noqa: E402
from volunteer.net.perf import PERF, PerfLimits, perf_stream  # noqa: E402
from volunteer.net.ping import PING, Pinger  # noqa: E402

from _procstat import process_cpu_seconds  # noqa: E402

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


async def bench_ours_against(addr: str, size: int, setups: int = 30, pings: int = 500, server_pid: int | None = None) -> dict:
    """Our client against a server at ``addr`` (ours or py-libp2p); with ``server_pid``, the
    echo's CPU time of both processes too."""
    result: dict = {}
    times = []
    for _ in range(setups):
        # A fresh client each time: TCP + Noise + yamux (or QUIC + TLS) from nothing, as a new peer would.
        async with open_stack() as client:
            started = trio.current_time()
            await client.connect(addr)
            times.append(trio.current_time() - started)
    result["setup_ms_p50"] = statistics.median(times) * 1000
    async with open_stack() as client:
        conn = await client.connect(addr)
        pinger = Pinger(await conn.new_stream([PING]))
        rtts = sorted([await pinger.ping() for _ in range(pings)])
        result["ping_ms_p50"] = rtts[len(rtts) // 2] * 1000
        result["ping_ms_p99"] = rtts[int(len(rtts) * 0.99)] * 1000
        stream = await conn.new_stream([ECHO])
        client_cpu = time.process_time()
        server_cpu = process_cpu_seconds(server_pid) if server_pid else 0.0
        result["echo_MBps"] = 2 * size / await echo_through(stream, size) / 1e6
        if server_pid:
            spent = time.process_time() - client_cpu + process_cpu_seconds(server_pid) - server_cpu
            result["echo_cpu_ms_per_MiB"] = spent * 1000 / (2 * size / (1 << 20))
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

    unlimited = StackOptions(perf=PerfLimits(max_bytes_per_minute_per_peer=1 << 40, max_bytes_per_minute_total=1 << 40))
    async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=unlimited) as server, open_stack() as client:
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


def whole_command_MBps(argv: list[str], size: int) -> float | None:
    """2 * size bytes over the wall-clock time of a perf command, process start to exit."""
    started = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
    seconds = time.perf_counter() - started
    if out.returncode != 0:
        print(f"{argv[:4]} failed: {out.stderr[-1000:]}", file=sys.stderr)
        return None
    return 2 * size / seconds / 1e6


def byte_compile_ours() -> None:
    """Byte-compile volunteer/ as an install would (py-libp2p's site-packages already are)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "volunteer")], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)


def run_whole_commands(size: int, with_pylibp2p: bool) -> dict[str, dict]:
    """`volunteer perf` against our node, py-libp2p's perf client against py-libp2p's server."""
    rows: dict[str, dict] = {}
    byte_compile_ours()
    for name, flags in (("volunteer perf, whole command", []), ("volunteer perf over QUIC, whole command", ["--quic"])):
        ours = Subprocess([sys.executable, str(ROOT / "benchmarks" / "_our_node.py"), *flags])
        try:
            figure = whole_command_MBps([sys.executable, "-m", "volunteer", "perf", "--json", "--upload", str(size),
                                         "--download", str(size), ours.addr], size)
            if figure:
                rows[name] = {"perf_MBps": figure}
        finally:
            ours.close()
    if with_pylibp2p:
        peer = Subprocess([str(PYLIBP2P_PYTHON), str(PEER_SCRIPT), "serve"])
        try:
            figure = whole_command_MBps([str(PYLIBP2P_PYTHON), str(PEER_SCRIPT), "dial-perf", peer.addr,
                                         "--upload", str(size), "--download", str(size)], size)
            if figure:
                rows["py-libp2p perf, whole command"] = {"perf_MBps": figure}
        finally:
            peer.close()
    return rows


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


async def one_run(args) -> dict[str, dict]:
    """Every row once, side by side."""
    size = args.size_mib << 20
    setups, pings = (5, 100) if args.quick else (30, 500)
    rows: dict[str, dict] = {}
    rows["raw trio TCP"] = await bench_raw_tcp(size)
    rows["ours ↔ ours, one process"] = await bench_ours_in_process(size)
    ours = Subprocess([sys.executable, str(ROOT / "benchmarks" / "_our_node.py")])
    try:
        rows["ours ↔ ours"] = await bench_ours_against(ours.addr, size, setups, pings, server_pid=ours.proc.pid)
    finally:
        ours.close()
    ours = Subprocess([sys.executable, str(ROOT / "benchmarks" / "_our_node.py"), "--quic"])
    try:
        rows["ours ↔ ours over QUIC"] = await bench_ours_against(ours.addr, size, setups, pings, server_pid=ours.proc.pid)
    finally:
        ours.close()
    with_pylibp2p = not args.skip_pylibp2p and PYLIBP2P_PYTHON.exists()
    if with_pylibp2p:
        peer = Subprocess([str(PYLIBP2P_PYTHON), str(PEER_SCRIPT), "serve"])
        try:
            rows["ours → py-libp2p"] = await bench_ours_against(peer.addr, size, setups=min(setups, 10), pings=min(pings, 200))
        finally:
            peer.close()
        pair = run_pylibp2p_pair(size)
        if pair:
            rows["py-libp2p ↔ py-libp2p, one process"] = pair
        rows["py-libp2p ↔ py-libp2p"] = run_pylibp2p_two_processes(size)
    rows.update(run_whole_commands(size, with_pylibp2p))
    return rows


def median_rows(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """Each figure's median over the runs that have it."""
    merged: dict[str, dict] = {}
    for rows in runs:
        for name, row in rows.items():
            for key, value in row.items():
                if isinstance(value, (int, float)):
                    merged.setdefault(name, {}).setdefault(key, []).append(value)
    return {name: {key: statistics.median(values) for key, values in row.items()} for name, row in merged.items()}


async def main_async(args) -> None:
    if args.quick:
        args.size_mib = min(args.size_mib, 16)
    runs = []
    for _ in range(args.runs):
        runs.append(await one_run(args))
    print_table(median_rows(runs), args.size_mib, args.runs)


def print_table(rows: dict[str, dict], size_mib: int, runs: int = 1) -> None:
    base = rows.get("py-libp2p ↔ py-libp2p", {})
    one_process_base = rows.get("py-libp2p ↔ py-libp2p, one process", {})
    cols = [("echo_MBps", "echo MB/s"), ("perf_MBps", "perf MB/s"), ("setup_ms_p50", "setup ms"),
            ("ping_ms_p50", "ping p50 ms"), ("ping_ms_p99", "ping p99 ms"), ("echo_cpu_ms_per_MiB", "cpu ms/MiB")]
    print(f"\n{size_mib} MiB over one stream, loopback, both directions counted" + (f"; median of {runs} runs" if runs > 1 else ""))
    print(f"{'':42}" + "".join(f"{title:>14}" for _, title in cols))
    for name, row in rows.items():
        print(f"{name:42}" + "".join(f"{row[k]:14.2f}" if k in row else f"{'-':>14}" for k, _ in cols))
    ours = rows.get("ours ↔ ours", {})
    for name, reference in (("ours ↔ ours", base), ("ours ↔ ours, one process", one_process_base)):
        if reference and name in rows:
            print(f"\nratios, {name} over the same setting with py-libp2p (throughput: higher is better; time: lower is better):")
            for key, title in cols:
                if key in rows[name] and key in reference and reference[key]:
                    print(f"  {title:12} {rows[name][key] / reference[key]:6.2f}x")
    whole, whole_base = rows.get("volunteer perf, whole command", {}), rows.get("py-libp2p perf, whole command", {})
    if whole.get("perf_MBps") and whole_base.get("perf_MBps"):
        print(f"volunteer perf / py-libp2p perf, whole command: {whole['perf_MBps'] / whole_base['perf_MBps']:.2f}x")
    if "raw trio TCP" in rows and "echo_MBps" in ours:
        print(f"ours echo / raw TCP echo: {ours['echo_MBps'] / rows['raw trio TCP']['echo_MBps']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--skip-pylibp2p", action="store_true")
    parser.add_argument("--runs", type=int, default=1, help="repeat every row and print medians")
    parser.add_argument("--quick", action="store_true", help="16 MiB, fewer connections and pings")
    trio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
