"""Real processes beside the simulation: one relay and N ``volunteer join`` daemons on loopback.

    python benchmarks/scale_processes.py --quick          # 20 daemons, 1 minute of lookups
    python benchmarks/scale_processes.py -n 50            # the full run (about 10 GiB of memory)
    python benchmarks/scale_processes.py -n 50 --tally    # and the daemons' DHT requests by caller
    python benchmarks/scale_processes.py -n 4 --minutes 0.3 --kills 1 --json out.json

The swarm is ``volunteer testnet``'s (``cli/testnet.open_testnet``): a relay (DHT bootstrap) and N
daemons, each listening and dialing from a loopback alias of its own (127.0.0.2, 127.0.0.3, ...:
per-address limits then see one household per daemon, as on the internet), each hosting one
expert of an R x C grid (R x C = N; ``hidden_dim`` 8: the experts' compute is not measured). This
process is the trainer: a client-mode DHT node, as ``Swarm.join``'s, bootstrapped from the relay.

It measures, in this order:

- warm-up: until every expert is found (the swarm's declarations are in place);
- idle daemons (``--idle-seconds`` without lookups): CPU per daemon (``/proc/PID/stat``),
  memory (PSS and RSS, ``/proc/PID/smaps_rollup``), DHT traffic (heartbeats and upkeep only);
- ``--minutes`` of lookups as ``benchmarks/scale.py``'s trainers make them (expert lookups at
  quorum 3 every 0.5-1.5 s, grid lookups ``ffn.i.`` every 1-3 s, beam searches without cache
  every 2-6 s), while ``--kills`` daemons are killed (SIGKILL: a crash, no goodbye) and as many
  joiners start and host the same experts: how long the killed daemons' declarations take to
  vanish and the joiners' to appear (polled every second from here, as the simulation's
  trainer polls), and the DHT messages and bytes every peer sends per minute (``volunteer
  status``: requests sent and answered, ``bytes_out``); with ``--tally``, the requests each
  daemon sends, by caller and kind (``dht_tally.py``), idle and under lookups, and the traffic
  left once the callers the simulation does not model are taken out.

Then ``benchmarks/scale.py``'s simulator runs the same swarm (N volunteers, one relay, one
client-mode trainer, the same grid, kills and minutes; no churn, nobody behind NAT) twice: on a
loopback wire (0.25-1 ms one way, nothing lost) and on its emulated internet, and every figure
is printed three times in one format (``real``, ``sim lo``, ``sim wan``).

The machine bounds N: an idle daemon holds about 185 MiB (PSS; torch is most of it), so the
benchmark refuses to start what the memory available would not hold with ``RESERVE_GIB`` to
spare. Last line: ``scale_processes: N daemons, lookup p50 X ms p99 Y ms, success Z %,
vanished K/K, appeared K/K, idle daemon CPU C % PSS M MiB``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import dht_tally  # noqa: E402
from benchmarks.scale import steady, steady_lines, summary  # noqa: E402
from volunteer.cli.control import ControlError, request  # noqa: E402
from volunteer.cli.testnet import open_testnet  # noqa: E402
from volunteer.dht import DHTConfig  # noqa: E402
from volunteer.dht.beam import find_best_experts  # noqa: E402
from volunteer.dht.grid import EXPERT_QUORUM, expert_key, select_alive  # noqa: E402
from volunteer.dht.node import open_dht  # noqa: E402
from volunteer.net.identity import KeyPair, save_keypair  # noqa: E402
from volunteer.net.stack import open_stack  # noqa: E402
from volunteer.swarmfile import load_swarm_file  # noqa: E402

DAEMON_MIB = 200  # PSS of one idle daemon (measured: 183 MiB with 4; torch's import is most of it)
RESERVE_GIB = 3.0  # memory left to everything else on the machine
MAX_DAEMONS = 200  # loopback aliases 127.0.0.2 .. 127.0.0.201
HIDDEN_DIM = 8
TICKS = os.sysconf("SC_CLK_TCK")
DHT_TIMEOUT = 30.0  # one lookup's bound: a stuck lookup counts as a miss, it does not hang the run


def alias(i: int) -> str:
    """Volunteer ``i``'s loopback address (Linux routes all of 127.0.0.0/8 to lo)."""
    return f"127.0.{(i + 2) // 256}.{(i + 2) % 256}"


def grid_shape(n: int) -> tuple[int, int]:
    """R x C = n, as square as n allows (one expert per daemon)."""
    rows = max(d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0)
    return rows, n // rows


def mem_available_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15 of stat)


def memory_mib(pid: int) -> tuple[float, float] | None:
    """(PSS, RSS) of ``pid`` in MiB: PSS shares the pages daemons have in common (torch's code)."""
    got = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("Pss", "Rss"):
                    got[name] = int(rest.split()[0]) / 1024
    except OSError:
        return None
    return got.get("Pss", float("nan")), got.get("Rss", float("nan"))


async def statuses(net, attempts: int = 5) -> list[dict | None]:
    """Every volunteer's status, asking again those that did not answer (a loaded machine makes
    a control request run out now and then); None stays for one that is gone."""
    got = await net.statuses()
    for _ in range(attempts):
        if all(status is not None for status in got):
            break
        await trio.sleep(1.0)
        again = await net.statuses()
        got = [old if old is not None else new for old, new in zip(got, again)] + again[len(got):]
    return got


def traffic(snapshot: list[dict | None]) -> dict[str, tuple[int, int]]:
    """peer -> (DHT messages sent: requests and answers, bytes sent) from ``volunteer status``."""
    out = {}
    for status in snapshot:
        if status and status.get("dht"):
            dht = status["dht"]
            out[status["peer_id"]] = ((dht.get("requests") or 0) + (dht.get("answered") or 0), dht.get("bytes_out") or 0)
    return out


def traffic_per_minute(before: dict, after: dict, extra: list[tuple[int, int]], seconds: float,
                       joiners: frozenset[str] = frozenset()) -> tuple[float, float, float, float]:
    """(mean msgs, mean bytes, busiest msgs, busiest bytes) per peer per minute over the peers seen
    at both ends, and the ``joiners`` seen at the end (their counts start at zero); ``extra``:
    the trainer's."""
    rows = [(m - before[p][0], b - before[p][1]) if p in before else (m, b)
            for p, (m, b) in after.items() if p in before or p in joiners] + extra
    per_min = 60.0 / seconds
    msgs = [m * per_min for m, _ in rows]
    byts = [b * per_min for _, b in rows]
    return statistics.fmean(msgs), statistics.fmean(byts), max(msgs), max(byts)


async def run_real(args: argparse.Namespace, workdir: Path) -> dict:
    n = args.n
    rows, cols = grid_shape(n)
    rng = random.Random(args.seed)
    results: dict[str, list] = {"expert": [], "grid": [], "beam": [], "vanish": [], "appear": [], "ready": [], "stale": []}
    out: dict = {"results": results, "probes": args.kills, "n": n, "grid": (rows, cols)}
    tally_dir = workdir / "dht-tally"
    if args.tally:  # the daemons count their DHT requests by caller and kind (dht_tally.py)
        hook = dht_tally.write_sitecustomize(workdir / "dht-tally-hook")
        tally_dir.mkdir(exist_ok=True)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
        os.environ["VOLUNTEER_DHT_TALLY"] = str(tally_dir)
    wall = time.perf_counter()
    async with open_testnet(n, f"ffn:ffn.[0:{rows}].[0:{cols}]", hidden_dim=HIDDEN_DIM, swarm_id="scale-processes",
                            workdir=workdir, listen_host=alias, max_volunteers=MAX_DAEMONS,
                            start_timeout=120.0 + 90.0 * n, starting=args.starting) as net:
        out["start_s"] = time.perf_counter() - wall
        started = await statuses(net)
        host_of: dict[str, str] = {}  # uid -> the peer expected to host it now (absent: none)
        pid_of: dict[str, int] = {}
        for i, status in enumerate(started):
            if status is None:
                raise SystemExit(f"scale_processes: v{i} stopped answering on its control socket (see {workdir}/v{i}.log)")
            for uid in net.assignments[i]:
                host_of[uid] = status["peer_id"]
            pid_of[status["peer_id"]] = net.processes[i + 1].pid
        relay_pid = net.processes[0].pid
        spec = load_swarm_file(net.swarm_file)
        async with open_stack(KeyPair.generate()) as host:
            async with open_dht(host, DHTConfig.for_trainer(spec.id), bootstrap=spec.entry_points, client_mode=True) as dht:

                async def hosts(key_of: str) -> list[str]:
                    """Peers of the live declarations a lookup of ``key_of`` (a uid or prefix) finds."""
                    key = expert_key(key_of)
                    with trio.move_on_after(DHT_TIMEOUT):
                        found = await dht.get_many([key], quorum=EXPERT_QUORUM)
                        return [str(d.peer) for d in select_alive(found[key].values(), dht.clock(), dht.config)]
                    return []

                # --- warm-up: every expert found ----------------------------------------------------
                t0 = time.perf_counter()
                missing = set(host_of)
                while missing and time.perf_counter() - t0 < 60.0 + n:
                    for uid in list(missing):
                        if host_of[uid] in await hosts(uid):
                            missing.discard(uid)
                    await trio.sleep(0.5)
                out["warmup_s"] = time.perf_counter() - t0
                out["warmup_missing"] = len(missing)

                # --- idle: CPU, memory, heartbeat traffic --------------------------------------------
                pids = list(pid_of.values())
                cpu0 = {pid: cpu_seconds(pid) for pid in [*pids, relay_pid]}
                traffic0 = traffic(await statuses(net))
                tally0 = dht_tally.read(tally_dir) if args.tally else {}
                t0 = time.perf_counter()
                await trio.sleep(args.idle_seconds)
                idle = time.perf_counter() - t0
                traffic1 = traffic(await statuses(net))
                if args.tally:
                    out["idle_tally"] = dht_tally.rates(tally0, dht_tally.read(tally_dir), set(pids))
                cpu1 = {pid: cpu_seconds(pid) for pid in [*pids, relay_pid]}
                share = {pid: (cpu1[pid] - cpu0[pid]) / idle for pid in cpu0 if cpu0[pid] is not None and cpu1[pid] is not None}
                memory = {pid: memory_mib(pid) for pid in pids}
                daemons = [m for m in memory.values() if m is not None]
                out["idle"] = {
                    "seconds": idle,
                    "cpu_median": statistics.median(share[p] for p in pids if p in share),
                    "cpu_max": max(share[p] for p in pids if p in share),
                    "relay_cpu": share.get(relay_pid, float("nan")),
                    "pss_median": statistics.median(m[0] for m in daemons),
                    "rss_median": statistics.median(m[1] for m in daemons),
                    "pss_total": sum(m[0] for m in daemons),
                    "relay_pss": (memory_mib(relay_pid) or (float("nan"),))[0],
                    "mem_available_gib": mem_available_gib(),
                }
                out["idle"]["msgs"], out["idle"]["bytes"], _, _ = traffic_per_minute(traffic0, traffic1, [], idle)

                # --- lookups, kills and joiners ------------------------------------------------------
                duration = args.minutes * 60.0
                trainer0 = (dht.stats["requests"] + dht.stats["answered"], dht.stats["bytes_out"])
                traffic0 = traffic(await statuses(net))
                tally0 = dht_tally.read(tally_dir) if args.tally else {}
                start = time.perf_counter()
                finish = start + duration

                joiners: set[str] = set()
                killed_at: dict[str, float] = {}  # killed daemon -> when

                def note_stale(found: list[str]) -> None:
                    """A lookup just returned these hosts: one killed counts how long after its
                    kill a trainer could still be sent to it (scale.py's figure of the same name)."""
                    for peer in found:
                        if peer in killed_at:
                            results["stale"].append(time.perf_counter() - killed_at[peer])

                def live() -> list[str]:
                    return sorted(uid for uid, peer in host_of.items() if peer)

                async def expert_lookups() -> None:
                    while time.perf_counter() < finish:
                        uid = rng.choice(live())
                        want, t = host_of[uid], time.perf_counter()
                        found = await hosts(uid)
                        note_stale(found)
                        if host_of.get(uid) == want:  # not killed meanwhile
                            results["expert"].append((time.perf_counter() - t, want in found))
                        await trio.sleep(rng.uniform(0.5, 1.5))

                async def grid_lookups() -> None:
                    while time.perf_counter() < finish:
                        uid = rng.choice(live())
                        want, t = host_of[uid], time.perf_counter()
                        found = await hosts(uid.rsplit(".", 1)[0] + ".")
                        note_stale(found)
                        if host_of.get(uid) == want:
                            results["grid"].append((time.perf_counter() - t, want in found))
                        await trio.sleep(rng.uniform(1.0, 3.0))

                async def beams() -> None:
                    while time.perf_counter() < finish:
                        scores = [[rng.gauss(0, 1) for _ in range(side)] for side in (rows, cols)]
                        t = time.perf_counter()
                        with trio.move_on_after(DHT_TIMEOUT):
                            got = await find_best_experts(dht, "ffn", scores, 4, max_age=0)
                            results["beam"].append((time.perf_counter() - t, len(got) >= min(4, len(live()))))
                        await trio.sleep(rng.uniform(2.0, 6.0))

                async def poll(uid: str, peer: str, since: float, want: bool, kind: str) -> None:
                    """Every second, until ``peer`` is (``want``) or is not among ``uid``'s hosts."""
                    while time.perf_counter() - since < 120.0:
                        found = await hosts(uid)
                        note_stale(found)
                        if (peer in found) == want:
                            results[kind].append(time.perf_counter() - since)
                            return
                        await trio.sleep(1.0)

                async def ready(control: Path, since: float) -> None:
                    """How long a joiner's process takes to answer on its control socket (python,
                    torch, the Host): the part of its appearance the simulation has no share of."""
                    while time.perf_counter() - since < 120.0:
                        try:
                            await request(control, "status")
                        except ControlError:
                            await trio.sleep(0.2)
                            continue
                        results["ready"].append(time.perf_counter() - since)
                        return

                async def kill_and_replace(uid: str) -> None:
                    victim = host_of[uid]
                    host_of[uid] = ""  # no lookups of it while nobody hosts it
                    os.kill(pid_of[victim], 9)
                    killed_at[victim] = time.perf_counter()
                    await poll(uid, victim, time.perf_counter(), False, "vanish")
                    keypair = KeyPair.generate()
                    index = len(net.controls)
                    save_keypair(net.workdir / f"v{index}.key", keypair)
                    joiners.add(str(keypair.peer_id))
                    since = time.perf_counter()
                    await net.start_volunteer([uid], listen=f"/ip4/{alias(index)}/tcp/0")
                    async with trio.open_nursery() as both:
                        both.start_soon(ready, net.controls[index], since)
                        await poll(uid, str(keypair.peer_id), since, True, "appear")
                    host_of[uid] = str(keypair.peer_id)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(expert_lookups)
                    nursery.start_soon(grid_lookups)
                    nursery.start_soon(beams)
                    await trio.sleep(min(5.0, duration / 4))
                    for uid in rng.sample(live(), args.kills):
                        nursery.start_soon(kill_and_replace, uid)
                elapsed = time.perf_counter() - start
                traffic1 = traffic(await statuses(net))
                if args.tally:
                    out["busy_tally"] = dht_tally.rates(tally0, dht_tally.read(tally_dir), set(pids))
                trainer1 = (dht.stats["requests"] + dht.stats["answered"], dht.stats["bytes_out"])
                out["msgs"], out["bytes"], out["busiest_msgs"], out["busiest_bytes"] = traffic_per_minute(
                    traffic0, traffic1, [(trainer1[0] - trainer0[0], trainer1[1] - trainer0[1])], elapsed, frozenset(joiners))
                out["elapsed"] = elapsed
    return out


def run_sims(args: argparse.Namespace, rows: int, cols: int) -> dict[str, dict]:
    """The simulator's swarm of the same shape: ``args.n`` volunteers, one relay, one trainer."""
    return {
        wire: steady(args.n + 2, args.seed, 0.0, args.minutes, 1, 0.0, grid=(rows, cols), probes=args.kills,
                     wire=wire, relays=1, client_trainers=True, one_per_cell=True, silent_crashes=False)
        for wire in ("loopback", "internet")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=50, help="daemons (default 50: about 10 GiB of memory)")
    parser.add_argument("--quick", action="store_true", help="20 daemons, 1 minute, 2 kills")
    parser.add_argument("--minutes", type=float, default=2.0, help="minutes of lookups (with the kills and joiners)")
    parser.add_argument("--idle-seconds", type=float, default=30.0, help="window for idle CPU and traffic")
    parser.add_argument("--kills", type=int, default=3, help="daemons killed (and as many joiners)")
    parser.add_argument("--starting", type=int, default=max(1, (os.cpu_count() or 1)), metavar="K",
                        help="daemons starting at once (default: one per core; each imports torch)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-sim", action="store_true", help="only the real processes")
    parser.add_argument("--dir", type=Path, help="keep the testnet's keys and logs here (default: a temporary directory)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--tally", action="store_true",
                        help="the daemons count their DHT requests by caller and kind (benchmarks/dht_tally.py)")
    args = parser.parse_args()
    if args.quick:
        args.n, args.minutes, args.kills, args.idle_seconds = 20, 1.0, 2, 20.0
    if not 2 <= args.n <= MAX_DAEMONS:
        parser.error(f"-n must be between 2 and {MAX_DAEMONS}")
    args.kills = max(0, min(args.kills, args.n - 1))
    available = mem_available_gib()
    need = args.n * DAEMON_MIB / 1024
    if need + RESERVE_GIB > available:
        print(f"scale_processes: {args.n} daemons need about {need:.1f} GiB and {available:.1f} GiB is available "
              f"({RESERVE_GIB:g} GiB kept free): at most {int((available - RESERVE_GIB) * 1024 / DAEMON_MIB)} here; "
              "not starting", file=sys.stderr)
        sys.exit(2)
    rows, cols = grid_shape(args.n)
    print(f"[{args.n} daemons] 1 relay, {args.n} `volunteer join` daemons on loopback aliases (one expert each of a "
          f"{rows}x{cols} grid), 1 trainer (client-mode DHT); {args.minutes:g} min of lookups, {args.kills} killed "
          f"and replaced; memory available {available:.1f} GiB", flush=True)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="scale-processes-"))
    real = trio.run(run_real, args, workdir)
    idle = real["idle"]
    print(f"  started in {real['start_s']:.0f} s, every expert found {real['warmup_s']:.0f} s later "
          f"({real['warmup_missing']} missing)", flush=True)
    sims = {} if args.no_sim else run_sims(args, rows, cols)
    labelled = [steady_lines(real, "real")] + [steady_lines(sims[w], label) for w, label in
                                               (("loopback", "sim lo"), ("internet", "sim wan")) if w in sims]
    for group in zip(*labelled):
        for line in group:
            print(line)
    started = real["results"]["ready"]
    if started:
        print(f"  real joiners' processes answered on their control sockets after: median {statistics.median(started):.1f} s, "
              f"max {max(started):.1f} s (python, torch and the Host starting: part of their appearance above)")
    print(f"  idle daemon ({idle['seconds']:.0f} s without lookups): CPU median {idle['cpu_median']:.2%} of a core "
          f"(max {idle['cpu_max']:.2%}), memory PSS median {idle['pss_median']:.0f} MiB (RSS {idle['rss_median']:.0f} MiB), "
          f"{idle['pss_total'] / 1024:.1f} GiB for all {args.n}; relay CPU {idle['relay_cpu']:.2%}, PSS {idle['relay_pss']:.0f} MiB")
    print(f"  idle traffic per daemon per minute (heartbeats and upkeep): {idle['msgs']:.0f} msgs, {idle['bytes'] / 1024:.0f} KiB; "
          f"memory available after the start {idle['mem_available_gib']:.1f} GiB", flush=True)
    for window in ("idle_tally", "busy_tally"):
        if window in real:
            total = sum(real[window].values())
            print(f"  DHT requests sent per daemon per minute by caller and kind ({'idle' if window == 'idle_tally' else 'with lookups'}, "
                  f"{total:.0f} in all; each is answered by another peer or the relay):")
            for key, rate in real[window].items():
                if rate >= 0.5:
                    who, _, op = key.partition("|")
                    print(f"    {rate:7.1f}  {op:<10} {who}")
    if "busy_tally" in real:
        # each request is two messages (sent, and answered by a daemon: the relay's share is 1/(N+1))
        extra = 2 * dht_tally.unsimulated(real["busy_tally"]) * args.n / (args.n + 1)
        print(f"  real traffic without the readers the simulation does not model ({extra:.0f} msgs per daemon per "
              f"minute: self-care, proofs, replica sync): {real['msgs'] - extra:.0f} msgs per peer per minute")
    e = summary(real["results"]["expert"])
    r = real["results"]
    summary_line = (f"scale_processes: {args.n} daemons, lookup p50 {e[0]:.0f} ms p99 {e[1]:.0f} ms, success {e[2]:.1f} %, "
                    f"vanished {len(r['vanish'])}/{args.kills}, appeared {len(r['appear'])}/{args.kills}, "
                    f"idle daemon CPU {idle['cpu_median']:.2%} PSS {idle['pss_median']:.0f} MiB")
    if args.json:
        figures = {
            "n": args.n,
            "expert": {"p50_ms": e[0], "p99_ms": e[1], "success": e[2], "count": e[3]},
            "grid": dict(zip(("p50_ms", "p99_ms", "success", "count"), summary(r["grid"]))),
            "beam": dict(zip(("p50_ms", "p99_ms", "success", "count"), summary(r["beam"]))),
            "vanish_s": r["vanish"], "appear_s": r["appear"], "kills": args.kills,
            "warmup_missing": real["warmup_missing"], "idle": idle,
            "msgs_per_peer_min": real["msgs"], "bytes_per_peer_min": real["bytes"],
            "idle_tally": real.get("idle_tally"), "busy_tally": real.get("busy_tally"),
        }
        args.json.write_text(json.dumps(figures, indent=1, default=float))
    print(summary_line)


if __name__ == "__main__":
    main()
