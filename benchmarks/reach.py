"""Reach on a rig of real homes: which pairs of volunteers end direct, how, and how soon.

    sudo .venv/bin/python benchmarks/reach.py [--wait 15] [--delay-ms 0] [--pair easy-symmetric]

One rig holds every kind of home (``tests/nat/specs.py`` ``all_homes``: easy, symmetric, double
(CGNAT), rst, upnp (symmetric, with miniupnpd), v6a and v6b (dual-stack behind stateful
firewalls), office (UDP dropped), forgetful (UDP mappings forgotten after 25 s), lan1 and lan2
(one LAN behind a router without hairpinning), shifted (endpoint-independent, never keeps a
port), pmp (a router mapping by NAT-PMP onto its 100.64 WAN address, behind a carrier NAT)), a
relay on TCP and QUIC and a STUN responder for miniupnpd. Each home keeps a
listener reserved on the relay; for every pair of homes a fresh dialer in the first home connects
to the second's circuit address, DCUtR runs, and the dialer reports the path it ended on. The
matrix is printed twice, from the same run: with everything on (TCP and QUIC, port mapping, IPv6,
birthday probing), and with QUIC and port mapping switched off (TCP only, as before QUIC).

Before the matrix, the whole daemon joins in each home, one home after another (``volunteer join``
with its defaults: DHT, NAT manager, mDNS, TCP and QUIC listens, port mapping; the relay is the
swarm's entry point and serves its DHT), and each reports how soon it was reachable: a relay
reservation or a public verdict, in seconds from the daemon's start (its own figure, as
``volunteer status`` shows it), and from the process's spawn (imports included).

Columns: pair, transport of the final path, direct or relayed, DCUtR attempts (of the attempt
that succeeded, or all made), seconds from the dial to the direct connection. With everything on,
each dialer also pings its target every 0.1 s from the relayed connection until 3 s after the
path went direct (``--ping-through``: across the switch and the relay's close), and the line
before the last two says how many pings were sent and lost. The last two lines
are ``reach: N of M pairs direct (P %), first attempt K of M`` for the full configuration and
``reachable: median X.X s, worst Y.Y s from join to a reservation or public verdict, over N
homes``. Needs root (network namespaces) and miniupnpd (either build: ``tests/nat/homes.py``);
the machine's load shows in the seconds (compare the two matrices side by side, never across runs
on a loaded machine). ``--reachable-only`` runs the daemons' part alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
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


def swarm_file(rig: Rig) -> Path:
    """The rig's swarm file (the relay, by its address, once ``start_relay`` knows it)."""
    return Path(f"/tmp/{rig.tag}-reach-swarm.toml")


def start_relay(rig: Rig) -> str:
    ip = rig.addr("relay")
    swarm = swarm_file(rig)
    swarm.write_text('name = "reach"\n')
    proc = rig.popen("relay", [PY, "-m", "volunteer", "relay", "--no-dashboard", "--identity", f"/tmp/{rig.tag}-relay.key",
                               "--listen", "/ip4/0.0.0.0/tcp/4001", "--listen", "/ip4/0.0.0.0/udp/4001/quic-v1",
                               "--announce", f"/ip4/{ip}/tcp/4001", "--announce", f"/ip4/{ip}/udp/4001/quic-v1",
                               "--swarm", str(swarm)],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if not read_line(proc, timeout=30).startswith("relay "):
        raise RuntimeError("the relay did not start")
    return read_line(proc, timeout=30).split()[-1]


REACHABLE_TIMEOUT = 60.0  # a daemon not reachable by then counts as this many seconds, and is named


@dataclass
class Joined:
    """One home's daemon: how soon it was reachable, and how."""

    home: str
    after_s: float | None  # the daemon's own figure, from its start
    spawn_s: float | None  # from the process's spawn (imports included)
    how: str


def join_home(rig: Rig, home: str, swarm: Path) -> tuple[subprocess.Popen, dict[str, str], Path]:
    """``volunteer join`` with its defaults in ``home`` (its own config, state and runtime dirs);
    its output goes to a file (a pipe nobody reads would stall it once full)."""
    base = f"/tmp/{rig.tag}-reach-{home}"
    env = {**os.environ, "VOLUNTEER_CONFIG_DIR": f"{base}-cfg", "VOLUNTEER_STATE_DIR": f"{base}-state",
           "VOLUNTEER_RUNTIME_DIR": f"{base}-run", "PYTHONUNBUFFERED": "1"}
    env.pop("VOLUNTEER_NO_PORT_MAPPING", None)  # the defaults: join maps ports
    log = Path(f"{base}.log")
    with log.open("w") as out:
        proc = rig.popen(home, [PY, "-m", "volunteer", "join", str(swarm), "--yes", "--no-dashboard"],
                         stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    return proc, env, log


def _wait_for(log: Path, proc: subprocess.Popen, marker: str, timeout: float) -> str | None:
    """The first line of ``log`` holding ``marker`` within ``timeout`` s; None (the process ended,
    or time ran out)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for line in log.read_text(errors="replace").splitlines():
            if marker in line:
                return line
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def reachable_phase(rig: Rig, relay_addr: str, homes: list[str]) -> list[Joined]:
    """The whole daemon joins in each home, one after another, each left running until all
    have joined (a later volunteer joins a swarm of the earlier ones); each one's time to
    reachable is its status's figure (from the daemon's start), and from spawn to its log line."""
    swarm = swarm_file(rig)
    swarm.write_text(f'name = "reach"\nrelays = ["{relay_addr}"]\n')
    procs: list[subprocess.Popen] = []
    joined: list[Joined] = []
    try:
        for home in homes:
            spawned = time.monotonic()
            proc, env, log = join_home(rig, home, swarm)
            procs.append(proc)
            line = _wait_for(log, proc, "reachable after", REACHABLE_TIMEOUT)
            reached_at = time.monotonic()
            if line is None:
                last = (log.read_text(errors="replace").strip().splitlines() or [""])[-1]
                joined.append(Joined(home, None, None, f"not reachable ({last[:100]!r})"))
            else:
                status = rig.run(home, [PY, "-m", "volunteer", "status", "--json", "--control",
                                        f"{env['VOLUNTEER_RUNTIME_DIR']}/daemon.sock"], timeout=30, env=env)
                try:
                    snap = json.loads(status.stdout)
                    after, how = snap.get("reachable_after_s"), snap.get("reachable_how", "")
                except json.JSONDecodeError:
                    after, how = None, line.strip()
                joined.append(Joined(home, after, round(reached_at - spawned, 2), how))
            row = joined[-1]
            print(f"#   join in {home}: reachable after {row.after_s} s (from spawn: {row.spawn_s} s): {row.how}",
                  flush=True)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    return joined


def reachable_line(joined: list[Joined]) -> str:
    """The second summary line: median and worst time to reachable, over the homes (one that
    never became reachable counts as REACHABLE_TIMEOUT and is named)."""
    times = [j.after_s if j.after_s is not None else REACHABLE_TIMEOUT for j in joined]
    never = [j.home for j in joined if j.after_s is None]
    median = statistics.median(times) if times else 0.0
    worst = max(times, default=0.0)
    line = (f"reachable: median {median:.1f} s, worst {worst:.1f} s from join to a reservation or public verdict, "
            f"over {len(joined)} homes")
    return line + (f" (never: {', '.join(never)})" if never else "")


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


def dial(rig: Rig, mode: Mode, dialer: str, target: str, port: int, wait: float, ping_through: float = 0.0) -> dict:
    """A fresh dialer in ``dialer``'s home reaches ``target``; returns its row of the matrix.
    ``ping_through``: ping the target across the punch until this long after it went direct."""
    argv = [*RUNNER, "echo-client", target, "--size", "100000", "--wait-direct", str(wait),
            *listen_args(mode, bool(rig.addrs6(dialer)), port), *mode_flags(mode)]
    if ping_through:
        argv += ["--ping-through", str(ping_through)]
    result = rig.run(dialer, argv, timeout=wait + 90)
    if result.returncode != 0:
        return {"ok": False, "direct": False, "transport": "-", "attempts": 0, "seconds": None,
                "error": (result.stderr or result.stdout).strip().splitlines()[-40:]}
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
            "birthday": report.get("birthday", {}), "pings": report.get("pings"), "report": report}


def run_mode(rig: Rig, relay_addr: str, mode: Mode, pairs: list[tuple[str, str]], listen_port: int,
             first_port: int, wait: float, ping_through: float = 0.0) -> dict[tuple[str, str], dict]:
    circuits = start_listeners(rig, relay_addr, mode, listen_port)
    rows = {}
    for index, (dialer, listener) in enumerate(pairs):
        rows[(dialer, listener)] = dial(rig, mode, dialer, circuits[listener], first_port + index, wait, ping_through)
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


def pings_line(rows: dict) -> str:
    """Pings sent across the punches (relayed, the switch, the relay's close) and those lost."""
    counted = {pair: r["pings"] for pair, r in rows.items() if r.get("pings")}
    sent = sum(p["sent"] for p in counted.values())
    lost = {pair: p["lost"] for pair, p in counted.items() if p["lost"]}
    slowest = max((p["slowest_ms"] for p in counted.values()), default=0.0)
    which = ", ".join(f"{a}->{b} {n}" for (a, b), n in lost.items())
    return (f"pings: {sent} sent across {len(counted)} punches, {sum(lost.values())} lost"
            f"{' (' + which + ')' if which else ''}, slowest {slowest:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wait", type=float, default=15.0, help="seconds each dialer gives DCUtR to go direct")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay on each home router's WAN link")
    parser.add_argument("--raw", type=Path, metavar="FILE.jsonl", help="also write each dialer's full report here")
    parser.add_argument("--pair", action="append", metavar="DIALER-LISTENER",
                        help=f"only these pairs (repeatable; homes: {', '.join(HOMES)})")
    parser.add_argument("--reachable-only", action="store_true", help="only the daemons' time to reachable")
    parser.add_argument("--ping-through", type=float, default=3.0, metavar="SECONDS",
                        help="with everything on, each dialer pings across its punch until this long after it "
                             "went direct (the relayed connection closes 2 s after); 0: no pings")
    args = parser.parse_args()
    pairs = list(itertools.combinations(HOMES, 2))
    if args.pair:
        pairs = [tuple(p.split("-", 1)) for p in args.pair]  # type: ignore[misc]
        unknown = {h for p in pairs for h in p} - set(HOMES)
        if unknown:
            parser.error(f"no such home: {', '.join(sorted(unknown))}")
    with Rig(all_homes(delay_ms=args.delay_ms)) as rig:
        relay_addr = start_relay(rig)
        joined = reachable_phase(rig, relay_addr, list(HOMES))
        if args.reachable_only:
            print("\n".join(f"{j.home:<10} {j.after_s if j.after_s is not None else '-':>6} s  {j.how}" for j in joined))
            print(reachable_line(joined))
            return
        full = run_mode(rig, relay_addr, FULL, pairs, LISTEN_PORT, FIRST_DIAL_PORT, args.wait, args.ping_through)
        today = run_mode(rig, relay_addr, TODAY, pairs, LISTEN_PORT + 1000, FIRST_DIAL_PORT + 1000, args.wait)
    if args.raw:
        with args.raw.open("w") as out:
            for mode, rows in ((FULL, full), (TODAY, today)):
                for (dialer, listener), row in rows.items():
                    out.write(json.dumps({"mode": mode.name, "dialer": dialer, "listener": listener, **row}) + "\n")
            for j in joined:
                out.write(json.dumps({"mode": "join", **vars(j)}) + "\n")
    header = f"{'via':<6}{'path':<10}{'att':>3}  {'sec':>6}"
    print(f"\n{'pair':<20}| {FULL.name:<27}| {TODAY.name}")
    print(f"{'':<20}| {header:<27}| {header}")
    for pair in pairs:
        print(f"{pair[0] + ' -> ' + pair[1]:<20}| {describe(full[pair]):<27}| {describe(today[pair])}")
    print("(direct*: by birthday probing; att: DCUtR attempts, 0 = dialled straight in; sec: dial to direct)")
    print("\n".join(f"join in {j.home:<10} reachable after {j.after_s if j.after_s is not None else '-'} s: {j.how}"
                    for j in joined))
    for mode, rows in ((TODAY, today), (FULL, full)):
        direct, total, first = summary(rows)
        share = 100.0 * direct / total if total else 0.0
        print(f"{mode.name}: {direct} of {total} pairs direct ({share:.0f} %), first attempt {first} of {total}")
    if args.ping_through:
        print(pings_line(full))
    direct, total, first = summary(full)
    print(f"reach: {direct} of {total} pairs direct ({100.0 * direct / total if total else 0.0:.0f} %), first attempt {first} of {total}")
    print(reachable_line(joined))


if __name__ == "__main__":
    main()
