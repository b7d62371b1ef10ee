"""Hole punching on the namespace NAT rig: success rate, time to direct, relayed vs direct.

    sudo .venv/bin/python benchmarks/holepunch.py [--attempts 50] [--delay-ms 20] [--size-mib 4] [--pairing easy]

For each NAT pairing (both endpoint-independent; one symmetric; one behind carrier-grade NAT)
a relay runs on the rig's internet, peer_b keeps a reservation, and peer_a makes ``attempts``
fresh dials through the relay (new identity and port each time), each followed by DCUtR.
Prints success rate, time from the relayed connection to the direct one (seconds and relayed
RTTs), throughput/RTT relayed vs direct, and the relay's CPU per relayed MiB: the relay
process's CPU time (/proc/PID/stat) over the whole run divided by the MiB it carried in the
relayed echo (``--size-mib`` each way), so an upper bound that includes the run's handshakes and
reservation (small beside a transfer of a few MiB or more). Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.nat.rig import Rig, double_nat_pair, easy_pair, read_line, symmetric_pair  # noqa: E402

from _procstat import process_cpu_seconds  # noqa: E402

PY = sys.executable
MiB = 1 << 20


def run_pairing(name: str, spec, attempts: int, size: int, profile_relay: str | None = None) -> dict:
    # with ``profile_relay``, the relay runs under cProfile and writes its profile there at the end
    launcher = [PY, str(ROOT / "benchmarks" / "_profiled.py"), profile_relay] if profile_relay else [PY, "-m"]
    with Rig(spec) as rig:
        relay = rig.popen("relay", [*launcher, "volunteer", "relay", "--no-dashboard", "--identity", f"/tmp/{rig.tag}-relay.key",
                                    "--listen", "/ip4/0.0.0.0/tcp/4001", "--announce", f"/ip4/{rig.addr('relay')}/tcp/4001"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        read_line(relay, timeout=20)
        relay_addr = read_line(relay, timeout=5).split()[-1]
        listener = rig.popen("peer_b", [PY, "-m", "tests.nat.node_runner", "listen-via-relay", relay_addr],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        circuit = read_line(listener, timeout=30).split()[1]
        relay_cpu_before = process_cpu_seconds(relay.pid)
        out = rig.run("peer_a", [PY, "-m", "tests.nat.node_runner", "punch-loop", circuit, "--count", str(attempts),
                                 "--size", str(size)], timeout=60 + attempts * 15)
        relay_cpu = process_cpu_seconds(relay.pid) - relay_cpu_before
        results = json.loads(out.stdout.strip().splitlines()[-1])["results"]
    successes = [r for r in results if r["direct"]]
    row = {"pairing": name, "attempts": len(results), "success_rate": len(successes) / len(results)}
    if successes:
        seconds = [r["seconds"] for r in successes]
        rtts = [r["seconds"] / r["relay_rtt"] for r in successes if r["relay_rtt"]]
        row["to_direct_ms_p50"] = statistics.median(seconds) * 1000
        row["to_direct_rtts_p50"] = statistics.median(rtts) if rtts else None
    first = results[0]
    row["relay_rtt_ms"] = first["relay_rtt"] * 1000 if first.get("relay_rtt") else None
    row["direct_rtt_ms"] = first["direct_rtt"] * 1000 if first.get("direct_rtt") else None
    row["MBps_final_path"] = first.get("throughput")
    row["MBps_relayed"] = first.get("relayed_throughput")
    if row["MBps_relayed"] and row["MBps_final_path"]:
        row["relayed/direct"] = row["MBps_relayed"] / row["MBps_final_path"]
        # the relayed echo carried ``size`` bytes each way through the relay
        row["relay_cpu_ms/MiB"] = relay_cpu * 1000 / (2 * size / MiB)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=50)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay on each home router's WAN link")
    parser.add_argument("--size-mib", type=float, default=4.0, help="echo size each way for the throughput rows")
    parser.add_argument("--pairing", choices=["easy", "symmetric", "cgnat"], action="append",
                        help="run only these pairings (repeatable; default all)")
    parser.add_argument("--profile-relay", metavar="OUT.prof", help="run the relay under cProfile (one pairing)")
    args = parser.parse_args()
    pairings = [
        ("easy", "EIM ↔ EIM", easy_pair(delay_ms=args.delay_ms)),
        ("symmetric", "symmetric ↔ EIM", symmetric_pair(delay_ms=args.delay_ms)),
        ("cgnat", "CGNAT+EIM ↔ EIM", double_nat_pair(delay_ms=args.delay_ms)),
    ]
    size = int(args.size_mib * MiB)
    rows = [run_pairing(name, spec, args.attempts, size, args.profile_relay) for key, name, spec in pairings if not args.pairing or key in args.pairing]
    cols = ["attempts", "success_rate", "to_direct_ms_p50", "to_direct_rtts_p50", "relay_rtt_ms", "direct_rtt_ms",
            "MBps_relayed", "MBps_final_path", "relayed/direct", "relay_cpu_ms/MiB"]
    print(f"\nhole punching on the rig, {args.attempts} fresh dials per pairing, WAN delay {args.delay_ms} ms each way,"
          f" {args.size_mib:g} MiB echoed each way")
    print(f"{'pairing':18}" + "".join(f"{c:>20}" for c in cols))
    for row in rows:
        cells = []
        for c in cols:
            value = row.get(c)
            cells.append(f"{value:20.2f}" if isinstance(value, float) else f"{str(value if value is not None else '-'):>20}")
        print(f"{row['pairing']:18}" + "".join(cells))


if __name__ == "__main__":
    main()
