"""The language model over home links: `examples/train_lm.py` trained through the NAT rig, with
`compression="auto"`, beside the same model trained on one machine (root).

    sudo .venv/bin/python benchmarks/wan_lm.py [--profiles cable,fibre] [--size small]
                                               [--steps 300] [--eval-every 100] [--json FILE]

Per profile (tests/nat/lines.py, as benchmarks/wan.py): a relay in the datacenter and four
volunteers, each in its own home behind its own NAT router on the profile's line with port 4001
forwarded, and the trainer in a fifth home. The volunteers host the model's experts
(``ffn:lm<layer>.<i>``: volunteer i hosts expert i of every layer) and resume from the local run's
first expert weights (examples/lm_parts.write_checkpoints), so the swarm run and the local run
(`train_lm.py --local`, same seed, same batches, run here first) differ only in what the links'
encodings do to the tensors: `auto` picks per call what each measured link calls for. Prints, per
profile: validation bits per byte at every evaluation for both runs and their gap, the swarm's
step time, the trainer's share of the step spent waiting on the calls and the volunteers'
compute utilisation (train_lm's own end summary), then one line per profile:
``wan_lm: <profile> step N swarm X bpb vs local Y: +Z.ZZ %``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples"))

from lm_parts import SIZES, Curve, expert_uids, initial_experts, write_checkpoints  # noqa: E402
from train_lm import EXPERT_CLASS, EXPERTS_SEED_OFFSET, all_uids, prefix  # noqa: E402
from tests.nat import rig as rigmod  # noqa: E402
from volunteer.cli.control import compute_seconds  # noqa: E402
from wan import PORT, PY, RELAY_ADDR, Procs, _env, _relay_multiaddr  # noqa: E402

PROFILES = ("cable", "dsl", "fibre", "far")
VOLUNTEERS = 4
HOMES = ["trainer"] + [f"vol{i}" for i in range(VOLUNTEERS)]
TRAIN_LM = ROOT / "examples" / "train_lm.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profiles", default="cable,fibre", help=f"comma-separated, of {', '.join(PROFILES)}")
    p.add_argument("--size", default="small", choices=sorted(SIZES), help="train_lm's size (default small)")
    p.add_argument("--steps", type=int, default=300, help="training steps of both runs")
    p.add_argument("--eval-every", type=int, default=100, help="validate every this many steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write every figure to this file")
    a = p.parse_args(argv)
    a.profiles = [x.strip() for x in a.profiles.split(",") if x.strip()]
    unknown = [x for x in a.profiles if x not in PROFILES]
    if unknown or not a.profiles:
        p.error(f"unknown profiles {unknown}; choose from {', '.join(PROFILES)}")
    if a.steps < 1 or a.eval_every < 1 or a.eval_every > a.steps:
        p.error("--steps and --eval-every must be >= 1, and --eval-every at most --steps")
    return a


def layer_uids(size, volunteer: int) -> list[str]:
    """The experts volunteer ``volunteer`` hosts: expert ``volunteer`` (mod the grid) of every layer."""
    out = []
    for layer in range(size.layers):
        uids = expert_uids(prefix(layer), size.grid)
        out += [uid for i, uid in enumerate(uids) if i % VOLUNTEERS == volunteer]
    return out


def train_lm_argv(args, *extra: str) -> list[str]:
    return [PY, str(TRAIN_LM), "--size", args.size, "--steps", str(args.steps), "--eval-every", str(args.eval_every),
            "--seed", str(args.seed), "--sample-bytes", "0", "--threads", "1", *extra]


def run_swarm(rig: rigmod.Rig, args, size, workdir: Path) -> tuple[Curve, str]:
    """The relay, four volunteers resuming from the local run's first experts, and train_lm
    joining them from the trainer's home; its curve and its output."""
    first = initial_experts(EXPERT_CLASS, size.width, all_uids(size), args.seed + EXPERTS_SEED_OFFSET)
    procs = Procs(rig, workdir)
    try:
        line = procs.start("relay", [PY, "-m", "volunteer", "relay", "--no-dashboard", "--identity",
                                     str(workdir / "relay.key"), "--listen", f"/ip4/0.0.0.0/tcp/{PORT}",
                                     "--announce", f"/ip4/{RELAY_ADDR}/tcp/{PORT}", "--swarm", "wanlm"], "relay ")
        swarm = workdir / "swarm.toml"
        swarm.write_text(f'name = "wanlm"\nid = "wanlm"\nrelays = ["{_relay_multiaddr(procs, line)}"]\n')
        handles = []
        for i in range(VOLUNTEERS):
            home = workdir / f"vol{i}"
            write_checkpoints(first, EXPERT_CLASS, size.width, home / "ckpt")
            handles.append(procs.launch(f"vol{i}", [
                PY, "-m", "volunteer", "join", str(swarm), "--yes", "--no-dashboard", "--no-mdns",
                "--experts", f"{EXPERT_CLASS}:" + ",".join(layer_uids(size, i)), "--hidden-dim", str(size.width),
                "--device", "cpu", "--listen", f"/ip4/0.0.0.0/tcp/{PORT}", "--listen",
                f"/ip4/0.0.0.0/udp/{PORT}/quic-v1", "--identity", str(home / "id.key"),
                "--control", str(home / "ctl.sock"), "--checkpoints", str(home / "ckpt")]))
        for handle in handles:
            procs.wait(handle, "control socket")
        curve_file = workdir / "swarm.json"
        controls = [str(workdir / f"vol{i}" / "ctl.sock") for i in range(VOLUNTEERS)]
        before, started = compute_seconds(controls), time.monotonic()
        result = rig.run("trainer", train_lm_argv(args, "--swarm", str(swarm), "--compression", "auto",
                                                  "--save-curve", str(curve_file)),
                         timeout=600 + 30 * args.steps, env=_env())
        if result.returncode != 0 or not curve_file.exists():
            raise RuntimeError(f"train_lm through the rig failed ({result.returncode}):\n"
                               f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        wall = time.monotonic() - started
        used = [None if a is None or b is None else (a - b) / wall for a, b in zip(compute_seconds(controls), before)]
        shown = ", ".join("?" if u is None else f"{u:.0%}" for u in used)
        return Curve.load(curve_file), result.stdout + (
            f"\nvolunteers' compute utilisation (runtime compute time over the trainer's wall time, {wall:.0f} s): "
            f"{shown}\n")
    finally:
        procs.stop()


def run_local(args, workdir: Path) -> Curve:
    import subprocess

    curve_file = workdir / "local.json"
    result = subprocess.run(train_lm_argv(args, "--local", "--save-curve", str(curve_file)), capture_output=True,
                            text=True, timeout=600 + 10 * args.steps, env=_env(), cwd=ROOT)
    if result.returncode != 0 or not curve_file.exists():
        raise RuntimeError(f"train_lm --local failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return Curve.load(curve_file)


def summary_lines(output: str) -> list[str]:
    """train_lm's end summary: where the time went (the step, the calls, the volunteers)."""
    return [x.strip() for x in output.splitlines() if x.startswith(("time:", "calls:", "mixtures:", "volunteers'"))]


def gap(swarm: float, local: float) -> float:
    return (swarm / local - 1.0) * 100.0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = rigmod.unusable_reason()
    if reason:
        print(f"wan_lm: cannot run: {reason}", file=sys.stderr)
        return 2
    rigmod.cleanup_stale()
    size = SIZES[args.size]
    results = {}
    with tempfile.TemporaryDirectory(prefix="wan-lm-") as tmp:
        local = run_local(args, Path(tmp))
        print(f"local: {', '.join(f'step {s} {b:.4f}' for s, b in zip(local.steps, local.bpb))}", flush=True)
        for profile in args.profiles:
            print(f"--- {profile}", flush=True)
            workdir = Path(tmp) / profile
            workdir.mkdir()
            with rigmod.Rig(rigmod.line_homes(profile, HOMES, nat="eim")) as rig:
                for i in range(VOLUNTEERS):
                    rig.forward_port(f"nat_vol{i}", PORT, f"vol{i}")
                    rig.forward_port(f"nat_vol{i}", PORT, f"vol{i}", proto="udp")
                curve, output = run_swarm(rig, args, size, workdir)
            for step, bpb in zip(curve.steps, curve.bpb):
                mine = dict(zip(local.steps, local.bpb)).get(step)
                print(f"{profile}: step {step} swarm {bpb:.4f} local {mine:.4f} ({gap(bpb, mine):+.2f} %)"
                      if mine else f"{profile}: step {step} swarm {bpb:.4f}", flush=True)
            for line in summary_lines(output):
                print(f"{profile}: {line}", flush=True)
            results[profile] = {"swarm": curve.bpb, "local": local.bpb, "steps": curve.steps, "summary": summary_lines(output)}
    for profile, r in results.items():
        print(f"wan_lm: {profile} step {r['steps'][-1]} swarm {r['swarm'][-1]:.4f} bpb vs local "
              f"{r['local'][-1]:.4f}: {gap(r['swarm'][-1], r['local'][-1]):+.2f} %", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
