"""Training over home links: our trainer vs hivemind's, side by side, on the NAT rig (root).

    sudo .venv/bin/python benchmarks/wan.py [--quick] [--profiles cable,dsl,...] [--steps 50]
                                            [--warmup 5] [--skip-hivemind] [--json FILE]
                                            [--quic-congestion ours|cubic]
                                            [--expert-class ffn|transformer]

One trainer and four volunteers, each in its own home behind its own NAT router on the same
kind of line (tests/nat/lines.py: ``cable`` 50/10 Mbit/s 20 ms one way, ``dsl`` 16/2 35 ms,
``fibre`` 300/100 8 ms, ``far`` 100/20 75 ms with 0.5 % loss; ``relayed``: cable, with every
volunteer behind a symmetric NAT and reached only through a relay in a datacenter 10 ms off the
internet). The volunteers of the direct profiles have forwarded port 4001 (TCP and UDP) on their routers.
Volunteer i hosts the ffn experts ``expert.i.0`` to ``expert.i.3`` (hidden 1024); the trainer
trains a RemoteMixtureOfExperts over the 4x4 grid with k_best 4 on batches of 64, default
settings otherwise. ``--expert-class transformer``: the volunteers host ``transformer`` blocks
(hidden 256, 4x wide feed-forward) and the trainer sends them batches of 8 sequences of 128
positions, whole (a per-sample mixture, gated on each sequence's mean, as hivemind's is);
hivemind's side serves its own ``transformer`` (its TransformerEncoderLayer, 16 heads); the rows
are labelled ``<profile>/tfm``. Then hivemind 1.1.12 does the same in the same homes over the same links:
its own Servers, DHT, p2pd (TCP, defaults) and RemoteMixtureOfExperts (benchmarks/setup_hivemind.sh);
not on ``relayed``, where its p2pd would not take a relay slot (HIVEMIND_NOT_RELAYED).

Per profile and trainer: median and p95 step time over the measured steps (after warm-up),
samples/s, bytes per step on the trainer's line (frames, both ways), round trips per step
(counted on the trainer's wire, see _wan_figures), the physical limit of the step and the
ratio; and our samples/s over hivemind's. The limit: 2 RTT + the bytes the step's tensors need
each way (their payload in the encoding our trainer's calls used) over the slowest link they
cross + the experts' compute, measured locally (_wan_compute: the four volunteers' shares
computed at once, one fresh process each, as a step makes them compute on this machine's cores;
one share alone is printed beside it). The limit counts no loss; on a lossy profile the line
below the profile also gives what even an ideal reliable transport spends per step resending
lost packets (_wan_figures.loss_recovery_seconds) and our step over the limit plus that.
Between the two, raw TCP moves our step's payload in the same two exchanges between the same
homes (_wan_rawtcp; not on ``relayed``): ``vs tcp`` is our median step over that plus the
compute, a floor measured on the rig rather than computed. Below each profile, where the time
goes: the share of our calls' time spent on the network (the rest on the volunteers) and each
volunteer's compute utilisation (its runtime's compute seconds over the measured steps' wall
time, read from its control socket). Every process runs torch with one thread. The last line reads
``wan: limit ratio worst X.XX, vs hivemind worst Y.YY×``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _wan_compute import measure as measure_compute  # noqa: E402
from _wan_figures import (HEADER, Line, StepBytes, format_row, last_line, limit_seconds,  # noqa: E402
                          loss_recovery_seconds, row_from_steps, tcp_floor)
from hivemind_runner import VENV as HIVEMIND_VENV  # noqa: E402
from tests.nat import lines  # noqa: E402
from tests.nat import rig as rigmod  # noqa: E402

PROFILES = ("cable", "dsl", "fibre", "far", "relayed")
QUICK_PROFILES = ("cable", "fibre")
VOLUNTEERS = 4
EXPERTS_PER_VOLUNTEER = 4
HIDDEN, BATCH, K_BEST = 1024, 64, 4
# per expert class: (hidden, samples per step, positions per sample; 0: vectors); hivemind's
# transformer expert declares sequences of 128
CLASSES = {"ffn": (HIDDEN, BATCH, 0), "transformer": (256, 8, 128)}
HIVEMIND_STEPS = 20  # hivemind's steps take ten times ours: this many are measured unless asked
PORT = 4001
RAW_TCP_PORT = 4002  # benchmarks/_wan_rawtcp.py's volunteers (forwarded like PORT)
RELAY_ADDR = "203.0.113.10"
START_TIMEOUT = 120.0
PY = sys.executable
# Why hivemind's trainer has no relayed row (what was tried on this rig):
HIVEMIND_NOT_RELAYED = ("hivemind 1.1.12's p2pd, behind a symmetric NAT with auto-relay, the bootstrap node as "
                        "trusted relay (told it is public) and private reachability forced, took no relay slot "
                        "within 5 minutes, and its client encodes /p2p/ in circuit addresses as CIDs p2pd rejects")
SWARM_ID = "wan"
HOMES = ["trainer"] + [f"vol{i}" for i in range(VOLUNTEERS)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options; ``--quick`` means two profiles, 20 steps after 2 warm-up (hivemind: 3 after 1)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profiles", default=",".join(PROFILES), help=f"comma-separated, of {', '.join(PROFILES)}")
    p.add_argument("--steps", type=int, default=50, help="measured steps per trainer and profile")
    p.add_argument("--warmup", type=int, default=5, help="at least this many steps before measuring")
    p.add_argument("--quick", action="store_true", help=f"{' and '.join(QUICK_PROFILES)}, 20 steps, 2 warm-up")
    p.add_argument("--skip-hivemind", action="store_true")
    p.add_argument("--hivemind-steps", type=int, help=f"measured steps of hivemind's trainer (default: "
                   f"--steps, at most {HIVEMIND_STEPS}; --quick: 3 after 1 warm-up): its steps take ten times ours")
    p.add_argument("--expert-class", choices=sorted(CLASSES), default="ffn",
                   help="what the volunteers host: ffn (vectors) or transformer (sequences)")
    p.add_argument("--hidden", type=int, help="the experts' width (default: the class's; smaller only for smoke runs)")
    p.add_argument("--compute-repeats", type=int, default=8, help="rounds of the local compute measurement")
    p.add_argument("--json", help="also write every figure to this file")
    p.add_argument("--quic-congestion", choices=("ours", "cubic"),
                   help="our QUIC congestion control for every process (QuicLimits.congestion; default: the library's)")
    a = p.parse_args(argv)
    if a.quick:
        a.profiles, a.steps, a.warmup, a.compute_repeats = ",".join(QUICK_PROFILES), 20, 2, 4
        a.hivemind_steps = a.hivemind_steps or 3
    a.hivemind_warmup = 1 if a.quick else a.warmup
    a.hivemind_steps = a.hivemind_steps or min(a.steps, HIVEMIND_STEPS)
    hidden, a.batch, a.seq = CLASSES[a.expert_class]
    a.hidden = hidden if a.hidden is None else a.hidden
    a.label = "" if a.expert_class == "ffn" else "/tfm"  # on the rows' profile names
    a.profiles = [x.strip() for x in a.profiles.split(",") if x.strip()]
    unknown = [x for x in a.profiles if x not in PROFILES]
    if unknown or not a.profiles:
        p.error(f"unknown profiles {unknown}; choose from {', '.join(PROFILES)}")
    if a.steps < 1 or a.warmup < 0 or a.hivemind_steps < 1 or a.hidden < 1:
        p.error("--steps, --hivemind-steps and --hidden must be >= 1 and --warmup >= 0")
    return a


def line_of(profile: str) -> tuple[Line, str]:
    """The rates and round trip a profile's step crosses, and the line profile its homes use."""
    relayed = profile == "relayed"
    base = lines.PROFILES["cable" if relayed else profile]
    one_way = 2 * base.delay_ms + (2 * lines.DATACENTER.delay_ms if relayed else 0.0)
    rates = [r * 1e6 for r in (base.up_mbit, base.down_mbit, base.up_mbit, base.down_mbit)]
    loss = 1 - (1 - base.loss_pct / 100) ** 2  # the trainer's line and a volunteer's (a relay's loses nothing)
    return Line(*rates, rtt=2 * one_way / 1000, loss=loss), base.name


# ---------------------------------------------------------------- processes in the rig


class Procs:
    """Processes started in the rig for one trainer's run; each one's output goes to a file
    (hivemind's p2pd children would hold a pipe open); ``stop()`` ends their process groups."""

    def __init__(self, rig: rigmod.Rig, workdir: Path) -> None:
        self.rig, self.workdir = rig, workdir
        self.started: list[tuple[subprocess.Popen, Path]] = []

    def start(self, node: str, argv: list[str], ready: str, timeout: float = START_TIMEOUT,
              env: dict | None = None) -> str:
        """Start ``argv`` in ``node``; return its first output line holding ``ready`` (from there)."""
        return self.wait(self.launch(node, argv, env), ready, timeout)

    def launch(self, node: str, argv: list[str], env: dict | None = None) -> int:
        """Start ``argv`` in ``node`` without waiting; a handle for ``wait``."""
        out = self.workdir / f"{node}-{len(self.started)}.log"
        with open(out, "w") as handle:
            proc = self.rig.popen(node, argv, stdin=subprocess.PIPE, stdout=handle, stderr=subprocess.STDOUT,
                                  env=env or _env())
        self.started.append((proc, out))
        return len(self.started) - 1

    def wait(self, handle: int, ready: str, timeout: float = START_TIMEOUT) -> str:
        """The first output line of a launched process holding ``ready`` (from there on)."""
        proc, out = self.started[handle]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in out.read_text(errors="replace").splitlines():
                if ready in line:
                    return line[line.index(ready):]
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        tail = out.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{out.name}: {proc.args[4:8]} did not print {ready!r} (exit {proc.poll()}):\n{tail}")

    def stop(self) -> None:
        for proc, _ in reversed(self.started):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if proc.poll() is not None:
                    break
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    continue
            if proc.stdin:
                proc.stdin.close()
        self.started.clear()


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", VOLUNTEER_NO_MDNS="1", PYTHONUNBUFFERED="1")


class Wire:
    """The trainer's sends on its line (_wan_wire), recorded while a trainer runs."""

    def __init__(self, rig: rigmod.Rig) -> None:
        ifname = rig.run("trainer", ["ls", "/sys/class/net"]).stdout.split()
        self.proc = rig.popen("trainer", [PY, str(ROOT / "benchmarks" / "_wan_wire.py"),
                                          next(n for n in ifname if n != "lo")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if rigmod.read_line(self.proc, 10).strip() != "ready":
            raise RuntimeError("wire recorder did not start")

    def finish(self) -> list[tuple[float, int]]:
        out, _ = self.proc.communicate(timeout=60)
        return [tuple(r) for r in json.loads(out.strip().splitlines()[-1])]


def _trainer(rig: rigmod.Rig, argv: list[str], timeout: float) -> tuple[dict, list]:
    wire = Wire(rig)
    try:
        result = rig.run("trainer", argv, timeout=timeout, env=_env())
    finally:
        sends = wire.finish()
    lines_out = [x for x in result.stdout.splitlines() if x.startswith("{")]
    if result.returncode != 0 or not lines_out:
        raise RuntimeError(f"trainer failed ({result.returncode}): {result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    report = json.loads(lines_out[-1])
    if "error" in report:
        raise RuntimeError(f"trainer: {report['error']}")
    return report, sends


def run_ours(rig: rigmod.Rig, args, relayed: bool, workdir: Path) -> tuple[dict, list]:
    """Relay (the swarm's bootstrap), four volunteers, our trainer; its report and its sends."""
    procs = Procs(rig, workdir)
    try:
        line = procs.start("relay", [PY, "-m", "volunteer", "relay", "--no-dashboard", "--identity",
                                     str(workdir / "relay.key"), "--listen", f"/ip4/0.0.0.0/tcp/{PORT}",
                                     "--announce", f"/ip4/{RELAY_ADDR}/tcp/{PORT}", "--swarm", SWARM_ID],
                           "relay ")
        relay_addr = _relay_multiaddr(procs, line)
        swarm = workdir / "swarm.toml"
        swarm.write_text(f'name = "wan"\nid = "{SWARM_ID}"\nrelays = ["{relay_addr}"]\n')
        volunteers = []
        for i in range(VOLUNTEERS):
            home = workdir / f"vol{i}"
            volunteers.append(procs.launch(f"vol{i}", [
                PY, "-m", "volunteer", "join", str(swarm), "--yes", "--no-dashboard", "--no-mdns",
                "--experts", f"{args.expert_class}:expert.[{i}:{i + 1}].[0:{EXPERTS_PER_VOLUNTEER}]",
                "--hidden-dim", str(args.hidden),
                "--device", "cpu", "--listen", f"/ip4/0.0.0.0/tcp/{PORT}", "--listen", f"/ip4/0.0.0.0/udp/{PORT}/quic-v1", "--identity", str(home / "id.key"),
                "--control", str(home / "ctl.sock"), "--checkpoints", str(home / "ckpt")]))
        for handle in volunteers:
            procs.wait(handle, "control socket")
        argv = [PY, str(ROOT / "benchmarks" / "_wan_ours.py"), str(swarm), "--steps", str(args.steps),
                "--warmup", str(args.warmup), "--volunteers", str(VOLUNTEERS), "--hidden", str(args.hidden),
                "--expert-class", args.expert_class, "--seq", str(args.seq), "--batch", str(args.batch),
                "--controls", *(str(workdir / f"vol{i}" / "ctl.sock") for i in range(VOLUNTEERS))]
        argv += ["--relayed"] if relayed else []
        return _trainer(rig, argv, timeout=_trainer_timeout(args))
    finally:
        procs.stop()


def _relay_multiaddr(procs: Procs, first: str) -> str:
    # `volunteer relay` prints "relay <peer id>" and then a line ending in its multiaddr
    out = procs.started[-1][1]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [x for x in out.read_text().splitlines() if "/p2p/" in x and x.split()[-1].startswith("/ip4/")]
        if found:
            return found[0].split()[-1]
        time.sleep(0.2)
    raise RuntimeError(f"relay printed no multiaddr after {first!r}")


def run_hivemind(rig: rigmod.Rig, args, workdir: Path) -> tuple[dict, list] | None:
    """hivemind's bootstrap node, four Servers and trainer in the same homes (the volunteers'
    forwarded ports); None without its venv."""
    python = HIVEMIND_VENV / "bin" / "python"
    if not python.exists():
        print(f"hivemind: n/a (no {python}; run bash benchmarks/setup_hivemind.sh)")
        return None
    script = str(ROOT / "benchmarks" / "_wan_hivemind.py")
    procs = Procs(rig, workdir)
    try:
        line = procs.start("relay", [str(python), script, "bootstrap", "--announce", f"/ip4/{RELAY_ADDR}/tcp/{PORT}"],
                           "READY")
        peer = line.split()[1]
        known, servers = ["--peer", peer], []
        for i in range(VOLUNTEERS):
            uids = ",".join(f"expert.{i}.{j}" for j in range(EXPERTS_PER_VOLUNTEER))
            public = f"/ip4/{rig.addr(f'nat_vol{i}')}/tcp/{PORT}"
            servers.append((public, procs.launch(f"vol{i}", [str(python), script, "serve", "--uids", uids,
                                                             "--peer", peer, "--hidden", str(args.hidden),
                                                             "--expert-class", args.expert_class,
                                                             "--announce", public])))
        for public, handle in servers:
            known += ["--peer", f"{public}/p2p/{procs.wait(handle, 'READY').split()[1]}"]
        argv = [str(python), script, "train", *known, "--steps", str(args.hivemind_steps),
                "--warmup", str(args.hivemind_warmup), "--hidden", str(args.hidden),
                "--expert-class", args.expert_class, "--seq", str(args.seq), "--batch", str(args.batch)]
        return _trainer(rig, argv, timeout=START_TIMEOUT + 60.0 * (args.hivemind_steps + args.hivemind_warmup) + 300.0)
    finally:
        procs.stop()


def run_raw_tcp(rig: rigmod.Rig, args, need: StepBytes, workdir: Path) -> tuple[dict, list]:
    """Raw TCP moving our step's payload in its two exchanges between the same homes
    (_wan_rawtcp: the same volunteers' forwarded ports, no compute, no protocol)."""
    script = str(ROOT / "benchmarks" / "_wan_rawtcp.py")
    procs = Procs(rig, workdir)
    try:
        servers = [procs.launch(f"vol{i}", [PY, script, "serve", "--port", str(RAW_TCP_PORT)]) for i in range(VOLUNTEERS)]
        for handle in servers:
            procs.wait(handle, "READY")
        targets = [f"{rig.addr(f'nat_vol{i}')}:{RAW_TCP_PORT}" for i in range(VOLUNTEERS)]
        argv = [PY, script, "step", *targets, "--out", str(int(need.to_volunteers)), "--back", str(int(need.to_trainer)),
                "--steps", str(args.steps), "--warmup", str(args.warmup)]
        return _trainer(rig, argv, timeout=_trainer_timeout(args))
    finally:
        procs.stop()


def _trainer_timeout(args) -> float:
    return START_TIMEOUT + 60.0 * (args.steps + args.warmup) + 300.0


# ---------------------------------------------------------------- one profile


def _queue_drops(rig) -> str:
    """Packets the homes' modem queues (tbf) dropped so far, up and down: how much of a path's
    loss was queues overflowing rather than the line's own loss."""
    parts = []
    for home in HOMES:
        caps = rig.caps(f"nat_{home}")
        up, down = (sum(q["drops"] for q in caps[d]) for d in ("up", "down"))
        parts.append(f"{home} {up} up, {down} down")
    return "; ".join(parts)


def run_profile(profile: str, args, compute: float, workdir: Path) -> dict:
    """Both trainers on one profile's rig: rows and details."""
    line, base = line_of(profile)
    relayed = profile == "relayed"
    nat = {f"vol{i}": "symmetric" for i in range(VOLUNTEERS)} if relayed else "eim"
    result: dict = {"profile": profile, "rtt": line.rtt}
    with rigmod.Rig(rigmod.line_homes(base, HOMES, nat=nat)) as rig:
        if not relayed:
            for i in range(VOLUNTEERS):
                rig.forward_port(f"nat_vol{i}", PORT, f"vol{i}")
                rig.forward_port(f"nat_vol{i}", PORT, f"vol{i}", proto="udp")
                rig.forward_port(f"nat_vol{i}", RAW_TCP_PORT, f"vol{i}")
        (workdir / "ours").mkdir()
        ours, sends = run_ours(rig, args, relayed, workdir / "ours")
        print(f"{profile}: modem queues dropped, while ours ran: {_queue_drops(rig)}", flush=True)
        need = StepBytes(ours["payload_out"], ours["payload_in"])
        limit = limit_seconds(line, need, compute, VOLUNTEERS)
        result.update(limit=limit, paths=ours.get("paths"), stats=ours.get("stats"), need=need, loss=line.loss,
                      recovery=loss_recovery_seconds(line, need, VOLUNTEERS), utilisation=ours.get("utilisation"))
        label = profile + args.label
        result["ours"] = row_from_steps(label, "ours", ours["steps"], args.batch, limit, sends, line.rtt)
        if relayed:
            print(f"raw tcp on {profile}: n/a (the volunteers take no direct connection; a relay is no raw TCP)",
                  flush=True)
        else:
            (workdir / "rawtcp").mkdir()
            raw, raw_sends = run_raw_tcp(rig, args, need, workdir / "rawtcp")
            result["rawtcp"] = row_from_steps(label, "raw tcp", raw["steps"], args.batch, limit, raw_sends, line.rtt)
            result["floor"] = tcp_floor(result["rawtcp"], compute)
        if relayed and not args.skip_hivemind:
            print(f"hivemind on {profile}: n/a ({HIVEMIND_NOT_RELAYED})", flush=True)
        elif not args.skip_hivemind:
            (workdir / "hivemind").mkdir()
            try:
                theirs = run_hivemind(rig, args, workdir / "hivemind")
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"hivemind on {profile}: failed: {str(exc)[-1500:]}", flush=True)
                theirs = None
            if theirs is not None:
                result["hivemind"] = row_from_steps(label, "hivemind", theirs[0]["steps"], args.batch, limit,
                                                    theirs[1], line.rtt)
    return result


def where_the_time_goes(utilisation: list | None, stats: dict | None) -> str:
    """Where a step's time goes: the share of the expert calls' time spent on the network (the
    rest on the volunteers; the trainer's model is the mixture alone, so its step is these calls),
    and each volunteer's compute utilisation (its runtime's compute time over the wall time)."""
    network = server = 0.0
    for hosts in ((stats or {}).get("experts") or {}).values():
        for h in hosts:
            network += h["network_ms_per_call"] * h["calls"]
            server += h["server_ms_per_call"] * h["calls"]
    waiting = f"{network / (network + server):.0%}" if network + server > 0 else "n/a"
    shown = ", ".join("?" if u is None else f"{u:.0%}" for u in utilisation or []) or "n/a"
    return f"the trainer's calls spent {waiting} of their time on the network; volunteers' compute utilisation {shown}"


def _print_rows(res: dict) -> None:
    print(format_row(res["ours"], res.get("hivemind"), res.get("floor")))
    for other in ("hivemind", "rawtcp"):
        if res.get(other):
            print(format_row(res[other]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = rigmod.unusable_reason()
    if reason:
        print(f"wan: cannot run: {reason}", file=sys.stderr)
        return 2
    rigmod.cleanup_stale()
    if args.quic_congestion:
        os.environ["VOLUNTEER_QUIC_CONGESTION"] = args.quic_congestion  # _env() hands it to every process
    print(f"QUIC congestion control: {os.environ.get('VOLUNTEER_QUIC_CONGESTION', 'the default')}", flush=True)
    samples = max(1, args.batch * K_BEST // (VOLUNTEERS * EXPERTS_PER_VOLUNTEER))
    alone = measure_compute(1, EXPERTS_PER_VOLUNTEER, samples, args.hidden, args.compute_repeats,
                            args.expert_class, args.seq)
    together = measure_compute(VOLUNTEERS, EXPERTS_PER_VOLUNTEER, samples, args.hidden, args.compute_repeats,
                               args.expert_class, args.seq)
    compute = together["step"]
    print(f"experts' compute, measured locally: one volunteer's share ({EXPERTS_PER_VOLUNTEER} experts x {samples} "
          f"samples) alone: forward {alone['forward'] * 1e3:.0f} ms + backward {alone['backward'] * 1e3:.0f} ms; "
          f"the {VOLUNTEERS} volunteers' shares at once on {os.cpu_count()} cores: forward "
          f"{together['forward'] * 1e3:.0f} ms + backward {together['backward'] * 1e3:.0f} ms = {compute * 1e3:.0f} ms "
          f"per step", flush=True)
    results = []
    for profile in args.profiles:
        print(f"--- {profile}", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"wan-{profile}-") as tmp:
            res = run_profile(profile, args, compute, Path(tmp))
        results.append(res)
        print(f"{profile}: rtt {res['rtt'] * 1e3:.0f} ms; our tensors need {res['need'].to_volunteers / 1e6:.2f} MB "
              f"out + {res['need'].to_trainer / 1e6:.2f} MB back per step; limit {res['limit']:.3f} s; paths "
              f"{sorted(set(p.split(',')[0] for p in (res['paths'] or {}).values()))}", flush=True)
        for peer, path in sorted((res["paths"] or {}).items()):
            print(f"  to {peer[-8:]}: {path}", flush=True)
        print(f"{profile}: {where_the_time_goes(res.get('utilisation'), res.get('stats'))}", flush=True)
        if res["recovery"]:
            print(f"{profile}: {res['loss'] * 100:.1f} % of packets lost each way: an ideal reliable transport spends "
                  f"+{res['recovery']:.3f} s per step resending them (median); ours over the limit plus that: "
                  f"{res['ours'].step_median / (res['limit'] + res['recovery']):.2f}x", flush=True)
        print(HEADER)
        _print_rows(res)
    print()
    print(HEADER)
    for res in results:
        _print_rows(res)
    if args.json:
        Path(args.json).write_text(json.dumps({"compute": {"alone": alone, "together": together}, "results": [
            {**r, **{k: vars(r[k]) if r.get(k) else None for k in ("ours", "hivemind", "rawtcp")}}
            for r in results]}, indent=1, default=str))
    print(last_line([r["ours"] for r in results], [r["hivemind"] for r in results if r.get("hivemind")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
