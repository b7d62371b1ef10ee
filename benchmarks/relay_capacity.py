"""How many volunteers one relay process serves: memory and CPU per reservation and per open circuit.

    .venv/bin/python benchmarks/relay_capacity.py [--reservations 60] [--circuits 30] [--idle 20]

A real relay (`volunteer relay`, limits raised so the benchmark, not the limits, decides how far it
goes; all clients come from 127.0.0.1, so the per-IP limit of 8 is lifted too) and, in this
process, ``--reservations`` hosts that each hold a reservation on it (Noise + yamux connection,
RESERVE), then ``--circuits`` relayed connections between pairs of them (each a splice in the
relay, idle after one ping). Between steps it reads the relay's resident memory (/proc) and CPU
time, and over ``--idle`` seconds the CPU the relay spends just holding everything.

Prints per reservation and per circuit: KiB of relay memory, ms of relay CPU to set it up, the
idle CPU share per 1,000 held, and what one GiB and one core hold at those rates, beside the
limits the relay enforces by default (relay/limits.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from relay.limits import RelayLimits  # noqa: E402
from volunteer.net.nat.relay_client import reserve  # noqa: E402
from volunteer.net.stack import StackOptions, open_stack  # noqa: E402

from _procstat import process_cpu_seconds  # noqa: E402

QUIET = StackOptions(quic=None, perf=None, hole_punching=False, port_mapping=False, lossy_path_repair=False)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def hold(n_res: int, n_circ: int, idle: float, relay_pid: int, relay_addr: str) -> dict:
    out: dict = {"steps": []}

    def sample(label: str, count: int) -> None:
        out["steps"].append((label, count, rss_kib(relay_pid), process_cpu_seconds(relay_pid), time.monotonic()))

    async with trio.open_nursery() as nursery:
        hosts = []
        circuit_addrs = []
        await trio.sleep(1.0)
        sample("start", 0)

        async def one_host(task_status=trio.TASK_STATUS_IGNORED):
            async with open_stack(listen=[], options=QUIET) as host:
                reservation = await reserve(host, relay_addr)
                task_status.started((host, reservation))
                await trio.sleep_forever()

        batch = max(1, n_res // 4)
        for i in range(n_res):
            host, reservation = await nursery.start(one_host)
            hosts.append(host)
            circuit_addrs.append(f"{relay_addr}/p2p-circuit/p2p/{host.peer_id}")
            if (i + 1) % batch == 0 or i + 1 == n_res:
                sample("reservations", i + 1)
        t0 = time.monotonic()
        cpu0 = process_cpu_seconds(relay_pid)
        await trio.sleep(idle)
        out["idle_res"] = (process_cpu_seconds(relay_pid) - cpu0) / (time.monotonic() - t0)
        # circuits: host i dials host n-1-i through the relay (distinct pairs)
        conns = []
        n_circ = min(n_circ, n_res // 2)
        for i in range(n_circ):
            conn = await hosts[i].connect(circuit_addrs[n_res - 1 - i])
            conns.append(conn)
            if (i + 1) % max(1, n_circ // 4) == 0 or i + 1 == n_circ:
                sample("circuits", i + 1)
        t0 = time.monotonic()
        cpu0 = process_cpu_seconds(relay_pid)
        await trio.sleep(idle)
        out["idle_all"] = (process_cpu_seconds(relay_pid) - cpu0) / (time.monotonic() - t0)
        out["circuits"] = len(conns)
        out["relayed"] = sum(1 for c in conns if c.describe_path().startswith("relayed"))
        nursery.cancel_scope.cancel()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # every client here is 127.0.0.1, and the relay takes 60 RESERVEs a minute per IP (not a flag)
    parser.add_argument("--reservations", type=int, default=60)
    parser.add_argument("--circuits", type=int, default=30)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds to measure idle CPU at each stage")
    parser.add_argument("--port", type=int, default=4711)
    args = parser.parse_args()
    big = str(max(4096, 4 * args.reservations))
    relay = subprocess.Popen(
        [sys.executable, "-m", "volunteer", "relay", "--no-dashboard", "--identity", f"/tmp/relay-cap-{os.getpid()}.key",
         "--listen", f"/ip4/127.0.0.1/tcp/{args.port}", "--announce", f"/ip4/127.0.0.1/tcp/{args.port}",
         "--max-reservations", big, "--max-reservations-per-ip", big, "--max-circuits", big],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        relay.stdout.readline()
        relay_addr = relay.stdout.readline().split()[-1]
        out = trio.run(hold, args.reservations, args.circuits, args.idle, relay.pid, relay_addr)
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.wait(timeout=15)
    steps = out["steps"]
    start = steps[0]
    res = [s for s in steps if s[0] == "reservations"][-1]
    circ = [s for s in steps if s[0] == "circuits"][-1] if out["circuits"] else res
    kib_res = (res[2] - start[2]) / res[1]
    ms_res = (res[3] - start[3]) * 1000 / res[1]
    n_circ = out["circuits"]
    kib_circ = (circ[2] - res[2]) / n_circ if n_circ else float("nan")
    ms_circ = (circ[3] - res[3]) * 1000 / n_circ if n_circ else float("nan")
    limits = RelayLimits()
    print(f"relay process: {start[2] / 1024:.0f} MiB resident at start")
    for label, count, kib, cpu, _ in steps:
        print(f"  {label:13}{count:6}  rss {kib / 1024:7.1f} MiB  cpu {cpu:6.2f} s")
    print(f"per reservation: {kib_res:.1f} KiB of relay memory, {ms_res:.1f} ms of relay CPU to set up "
          f"(connection, Noise, yamux, identify, RESERVE)")
    print(f"per open circuit ({out['relayed']}/{n_circ} relayed): {kib_circ:.1f} KiB, {ms_circ:.1f} ms of relay CPU to open")
    per_k_res = out["idle_res"] * 1000 / res[1]
    per_k_all = out["idle_all"] * 1000 / res[1]
    print(f"idle: {out['idle_res']:.1%} of a core holding {res[1]} reservations ({per_k_res:.1%} per 1,000), "
          f"{out['idle_all']:.1%} with {n_circ} circuits open too")
    gib = 1024 * 1024
    print(f"one GiB holds ~{gib / kib_res:,.0f} reservations, or ~{gib / (kib_res + kib_circ):,.0f} volunteers "
          f"each with one open circuit (memory only; Python's own {start[2] / 1024:.0f} MiB aside)")
    print(f"one core: ~{1000 / ms_res:,.0f} reservations set up per second; holding 1,000 costs "
          f"{per_k_res:.1%} of it; relayed bytes cost ~1.25 ms per MiB (benchmarks/relay_cpu.py)")
    print(f"limits enforced by default: {limits.max_reservations} reservations ({limits.max_reservations_per_ip} per IP), "
          f"{limits.max_circuits} circuits ({limits.max_circuits_per_peer} per peer), "
          f"circuits {limits.circuit_duration / 60:.0f} min / {limits.circuit_data >> 20} MiB per direction, "
          f"reservations {limits.reservation_ttl / 60:.0f} min, RESERVE {limits.reserve_rate_per_peer}/min per peer and "
          f"{limits.reserve_rate_per_ip}/min per IP, CONNECT {limits.connect_rate_per_peer}/min per peer")


if __name__ == "__main__":
    main()
