"""Reach on a rig of real homes: which pairs of volunteers end direct, how, and how soon.

    sudo .venv/bin/python benchmarks/reach.py [--wait 15] [--delay-ms 0] [--pair easy-symmetric]

One rig holds every kind of home (``tests/nat/specs.py`` ``all_homes``: easy, symmetric, double
(CGNAT), rst, upnp (symmetric, with miniupnpd), v6a and v6b (dual-stack behind stateful
firewalls)), a relay on TCP and QUIC and a STUN responder for miniupnpd. Each home keeps a
listener reserved on the relay; for every pair of homes a fresh dialer in the first home connects
to the second's circuit address, DCUtR runs, and the dialer reports the path it ended on. The
matrix is printed twice, from the same run: with everything on (TCP and QUIC, port mapping, IPv6,
birthday probing), and with QUIC and port mapping switched off (TCP only, as before QUIC).

Columns: pair, transport of the final path, direct or relayed, DCUtR attempts (of the attempt
that succeeded, or all made), seconds from the dial to the direct connection. The last line is
``reach: N of M pairs direct (P %), first attempt K of M`` for the full configuration. Needs root
(network namespaces) and miniupnpd; the machine's load shows in the seconds (compare the two
matrices side by side, never across runs on a loaded machine).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.nat.rig import Rig, read_line  # noqa: E402
from tests.nat.specs import HOMES, all_homes  # noqa: E402

PY = sys.executable
RUNNER = [PY, "-m", "tests.nat.node_runner"]
LISTEN_PORT = 4001
FIRST_DIAL_PORT = 4101


@dataclass(frozen=True)
class Mode:
    """One configuration of the product to measure."""

    name: str
    quic: bool
    port_mapping: bool


FULL = Mode("TCP+QUIC, port mapping", quic=True, port_mapping=True)
TODAY = Mode("TCP only, no port mapping", quic=False, port_mapping=False)


def listen_args(mode: Mode, ipv6: bool, port: int) -> list[str]:
    """--listen flags for one node: TCP (and QUIC) on IPv4, and on IPv6 in a dual-stack home."""
    families = ["ip4", "ip6"] if ipv6 else ["ip4"]
    wildcard = {"ip4": "0.0.0.0", "ip6": "::"}
    argv: list[str] = []
    for family in families:
        argv += ["--listen", f"/{family}/{wildcard[family]}/tcp/{port}"]
        if mode.quic:
            argv += ["--listen", f"/{family}/{wildcard[family]}/udp/{port}/quic-v1"]
    return argv


def mode_flags(mode: Mode) -> list[str]:
    return (["--port-mapping"] if mode.port_mapping else []) + ([] if mode.quic else ["--no-quic"])


def start_relay(rig: Rig) -> str:
    ip = rig.addr("relay")
    proc = rig.popen("relay", [PY, "-m", "volunteer", "relay", "--no-dashboard", "--identity", f"/tmp/{rig.tag}-relay.key",
                               "--listen", "/ip4/0.0.0.0/tcp/4001", "--listen", "/ip4/0.0.0.0/udp/4001/quic-v1",
                               "--announce", f"/ip4/{ip}/tcp/4001", "--announce", f"/ip4/{ip}/udp/4001/quic-v1"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if not read_line(proc, timeout=30).startswith("relay "):
        raise RuntimeError("the relay did not start")
    return read_line(proc, timeout=30).split()[-1]


def start_listeners(rig: Rig, relay_addr: str, mode: Mode, port: int) -> dict[str, str]:
    """One listener per home, reserved on the relay; returns home -> circuit address. A home with
    port mapping waits (up to 20 s) for its mapping to be confirmed before it counts as ready, as
    a volunteer's DHT record would only then carry it."""
    circuits: dict[str, str] = {}
    procs = {}
    for home in HOMES:
        extra = ["--wait-mapped", "20"] if mode.port_mapping and home == "upnp" else []
        procs[home] = rig.popen(home, [*RUNNER, "listen-via-relay", relay_addr,
                                       *listen_args(mode, bool(rig.addrs6(home)), port), *mode_flags(mode), *extra],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for home, proc in procs.items():
        line = read_line(proc, timeout=40)
        if not line.startswith("READY "):
            raise RuntimeError(f"listener in {home}: {line!r}")
        circuits[home] = line.split()[1]
        if "--wait-mapped" in proc.args:
            mapped = read_line(proc, timeout=40)
            print(f"# {home} ({mode.name}): {mapped[:160]}", flush=True)
    return circuits


def dial(rig: Rig, mode: Mode, dialer: str, target: str, port: int, wait: float) -> dict:
    """A fresh dialer in ``dialer``'s home reaches ``target``; returns its row of the matrix."""
    argv = [*RUNNER, "echo-client", target, "--size", "100000", "--wait-direct", str(wait),
            *listen_args(mode, bool(rig.addrs6(dialer)), port), *mode_flags(mode)]
    result = rig.run(dialer, argv, timeout=wait + 90)
    if result.returncode != 0:
        return {"ok": False, "direct": False, "transport": "-", "attempts": 0, "seconds": None,
                "error": (result.stderr or result.stdout).strip().splitlines()[-1:]}
    report = json.loads(result.stdout.strip().splitlines()[-1])
    direct = not report["path"].startswith("relayed")
    outcomes = report.get("outcomes", [])
    succeeded = [o for o in outcomes if o["success"]]
    if succeeded:
        attempts = succeeded[-1]["attempts"]
    elif direct:
        attempts = 0  # dialled straight in (a confirmed mapping or an IPv6 address)
    else:
        attempts = max((o["attempts"] for o in outcomes), default=0)
    return {"ok": report["ok"], "direct": direct, "transport": report["transport"], "attempts": attempts,
            "seconds": report.get("seconds_to_direct") if direct else None, "remote": report["remote_addr"],
            "birthday": report.get("birthday", {}), "report": report}


def run_mode(rig: Rig, relay_addr: str, mode: Mode, pairs: list[tuple[str, str]], listen_port: int,
             first_port: int, wait: float) -> dict[tuple[str, str], dict]:
    circuits = start_listeners(rig, relay_addr, mode, listen_port)
    rows = {}
    for index, (dialer, listener) in enumerate(pairs):
        rows[(dialer, listener)] = dial(rig, mode, dialer, circuits[listener], first_port + index, wait)
        row = rows[(dialer, listener)]
        print(f"#   {mode.name}: {dialer}->{listener}: {'direct' if row['direct'] else 'relayed'}"
              f" {row['transport']} attempts={row['attempts']}", flush=True)
    return rows


def describe(row: dict) -> str:
    if not row["ok"]:
        return f"{'FAILED':<10}{'':<9}{'':>3}  {'':>6}"
    how = "direct" if row["direct"] else "relayed"
    if row["direct"] and row.get("birthday"):
        how = "direct*"  # by birthday probing
    seconds = f"{row['seconds']:6.2f}" if row["seconds"] is not None else f"{'-':>6}"
    return f"{row['transport']:<6}{how:<10}{row['attempts']:>3}  {seconds}"


def summary(rows: dict) -> tuple[int, int, int]:
    direct = sum(1 for r in rows.values() if r["ok"] and r["direct"])
    first = sum(1 for r in rows.values() if r["ok"] and r["direct"] and r["attempts"] <= 1)
    return direct, len(rows), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wait", type=float, default=15.0, help="seconds each dialer gives DCUtR to go direct")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay on each home router's WAN link")
    parser.add_argument("--raw", type=Path, metavar="FILE.jsonl", help="also write each dialer's full report here")
    parser.add_argument("--pair", action="append", metavar="DIALER-LISTENER",
                        help=f"only these pairs (repeatable; homes: {', '.join(HOMES)})")
    args = parser.parse_args()
    pairs = list(itertools.combinations(HOMES, 2))
    if args.pair:
        pairs = [tuple(p.split("-", 1)) for p in args.pair]  # type: ignore[misc]
        unknown = {h for p in pairs for h in p} - set(HOMES)
        if unknown:
            parser.error(f"no such home: {', '.join(sorted(unknown))}")
    with Rig(all_homes(delay_ms=args.delay_ms)) as rig:
        relay_addr = start_relay(rig)
        full = run_mode(rig, relay_addr, FULL, pairs, LISTEN_PORT, FIRST_DIAL_PORT, args.wait)
        today = run_mode(rig, relay_addr, TODAY, pairs, LISTEN_PORT + 1000, FIRST_DIAL_PORT + 1000, args.wait)
    if args.raw:
        with args.raw.open("w") as out:
            for mode, rows in ((FULL, full), (TODAY, today)):
                for (dialer, listener), row in rows.items():
                    out.write(json.dumps({"mode": mode.name, "dialer": dialer, "listener": listener, **row}) + "\n")
    header = f"{'via':<6}{'path':<10}{'att':>3}  {'sec':>6}"
    print(f"\n{'pair':<20}| {FULL.name:<27}| {TODAY.name}")
    print(f"{'':<20}| {header:<27}| {header}")
    for pair in pairs:
        print(f"{pair[0] + ' -> ' + pair[1]:<20}| {describe(full[pair]):<27}| {describe(today[pair])}")
    print("(direct*: by birthday probing; att: DCUtR attempts, 0 = dialled straight in; sec: dial to direct)")
    for mode, rows in ((TODAY, today), (FULL, full)):
        direct, total, first = summary(rows)
        share = 100.0 * direct / total if total else 0.0
        print(f"{mode.name}: {direct} of {total} pairs direct ({share:.0f} %), first attempt {first} of {total}")
    direct, total, first = summary(full)
    print(f"reach: {direct} of {total} pairs direct ({100.0 * direct / total if total else 0.0:.0f} %), first attempt {first} of {total}")


if __name__ == "__main__":
    main()
