"""What starting one ``volunteer join`` daemon costs: CPU seconds and wall time until its control
socket answers (the point a testnet counts it started), next to a running testnet (a relay and
one daemon), for a daemon hosting an expert nobody else hosts (no catch-up).

    python benchmarks/daemon_start.py --runs 3

CPU is the process's user + system time from ``/proc`` when the socket first answers: on a
shared machine it moves far less than the wall time. Compare trees by running this from each,
alternating. Last line: ``daemon_start: median CPU C s, wall W s over R runs``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.scale_processes import cpu_seconds  # noqa: E402
from volunteer.cli.control import ControlError, request  # noqa: E402
from volunteer.cli.testnet import open_testnet  # noqa: E402
from volunteer.net.identity import KeyPair, save_keypair  # noqa: E402

ANSWER_TIMEOUT = 300.0


async def one_start(net, workdir: Path, i: int) -> tuple[float, float]:
    """(CPU s, wall s) of daemon ``i`` until its control socket answers; then it is stopped."""
    save_keypair(workdir / f"s{i}.key", KeyPair.generate())
    control = workdir / f"s{i}.sock"
    args = [sys.executable, "-m", "volunteer", "join", str(net.swarm_file), "--yes", "--listen", "/ip4/127.0.0.1/tcp/0",
            "--no-dashboard", "--identity", str(workdir / f"s{i}.key"), "--control", str(control),
            "--checkpoints", str(workdir / f"ck{i}"), *net.join_args, "--experts", f"ffn:solo.{i}"]
    env = dict(net.env, VOLUNTEER_STATE_DIR=str(workdir / f"state-s{i}"))
    with open(workdir / f"s{i}.log", "wb") as log:
        t0 = time.perf_counter()
        proc = await trio.lowlevel.open_process(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        with trio.fail_after(ANSWER_TIMEOUT):
            while True:
                try:
                    await request(control, "status")
                    break
                except ControlError:
                    await trio.sleep(0.05)
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(proc.pid) or float("nan")
    finally:
        proc.terminate()
        with trio.move_on_after(20):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
    return cpu, wall


async def main(runs: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="daemon-start-"))
    cpus, walls = [], []
    async with open_testnet(1, "ffn:ffn.[0:1].[0:2]", hidden_dim=8, swarm_id="start", workdir=workdir) as net:
        for i in range(runs):
            cpu, wall = await one_start(net, workdir, i)
            cpus.append(cpu)
            walls.append(wall)
            print(f"  run {i + 1}: control socket answered after {wall:.2f} s, {cpu:.2f} s of CPU", flush=True)
    print(f"daemon_start: median CPU {statistics.median(cpus):.2f} s, wall {statistics.median(walls):.2f} s over {runs} runs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    trio.run(main, parser.parse_args().runs)
