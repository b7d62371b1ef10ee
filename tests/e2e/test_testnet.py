"""`volunteer testnet` starts a relay and N volunteers, and stopping it (Ctrl-C, or even killing
it) leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import run_cli


def start_testnet(tmp_path, env, n=2, *extra):
    proc = subprocess.Popen([sys.executable, "-m", "volunteer", "testnet", "-n", str(n), "--dir", str(tmp_path / "net"),
                             "--name", "t", "--no-dashboard", "--experts", "ffn:expert.[0:2].[0:2]", "--hidden-dim", "8", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "volunteers ready" in line:
            break
    assert any("volunteers ready" in l for l in lines), "".join(lines)
    pids = []
    for i in range(n):
        status = json.loads(run_cli("status", "--json", "--control", str(tmp_path / "net" / f"v{i}.sock"), env=env).stdout)
        pids.append(status["pid"])
    return proc, pids


def gone(pids, timeout=20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("how", ["ctrl-c", "kill -9"])
def test_testnet_leaves_no_process_behind(tmp_path, cli_env, how):
    env = {**os.environ, **cli_env, "VOLUNTEER_CONFIG_DIR": str(tmp_path / "cfg")}
    proc, pids = start_testnet(tmp_path, env)
    try:
        listed = json.loads(run_cli("experts", "t", "--json", env=env).stdout)  # the swarm file was written
        assert sorted({row["uid"] for row in listed}) == ["expert.0.0", "expert.0.1", "expert.1.0", "expert.1.1"]
        # each volunteer keeps its state (its event log, contributions, history) in the testnet's
        # directory, not in the user's state dir, nor in one another's
        status = json.loads(run_cli("status", "--json", "--control", str(tmp_path / "net" / "v1.sock"), env=env).stdout)
        assert status["log_file"] == str(tmp_path / "net" / "state-v1" / "logs" / "volunteer.log")
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0
            assert "testnet stopped" in proc.stdout.read()
        else:
            proc.kill()  # no chance to clean up: the children must notice and leave
            proc.wait(timeout=10)
        assert gone(pids), f"left behind: {pids}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.slow
def test_a_donor_joins_a_testnet_by_automatic_placement_on_its_grid(tmp_path, cli_env):
    from volunteer.swarmfile import GridSpec, load_swarm_file

    from .test_donor_cli import Joined
    from .test_metrics_and_paths import stop

    import socket
    import urllib.request

    env = {**os.environ, **cli_env, "VOLUNTEER_CONFIG_DIR": str(tmp_path / "cfg"), "PYTHONUNBUFFERED": "1"}
    with socket.socket() as probe:  # a free port for the relay's health page
        probe.bind(("127.0.0.1", 0))
        web = f"127.0.0.1:{probe.getsockname()[1]}"
    proc, _ = start_testnet(tmp_path, env, 2, "--web", web)
    donor = None
    try:
        spec = load_swarm_file(tmp_path / "net" / "swarm.toml")
        assert spec.grids == [GridSpec("expert", (2, 2), "ffn", 8)]  # the testnet's experts are its [[grid]]
        for i in range(2):  # the testnet's volunteers speak the replica protocols: they see the grid's coverage
            status = json.loads(run_cli("status", "--json", "--control", str(tmp_path / "net" / f"v{i}.sock"), env=env).stdout)
            assert status["coverage"]["grids"][0]["prefix"] == "expert", status.get("coverage")
        # a donor names no expert: placement picks them on the grid, caught up from the testnet's replicas
        donor = Joined("t", "--yes", "--no-mdns", "--device", "cpu", "--max-experts", "2",
                       "--identity", str(tmp_path / "donor.key"), "--checkpoints", str(tmp_path / "donor-ckpt"),
                       env=env, control=tmp_path / "run" / "donor.sock")
        status = donor.wait_for(lambda s: len(s["experts"]) == 2, "the donor hosts two grid experts")
        assert {e["uid"] for e in status["experts"]} <= set(spec.grids[0].uids())
        assert not any("hosts nothing" in line or "no experts" in line for line in donor.lines), donor.lines
        # the testnet's relay maps the grid on its health page: the donor's two experts now have 2 replicas

        def replicas() -> dict:
            with urllib.request.urlopen(f"http://{web}/api/health", timeout=10) as reply:
                cells = json.loads(reply.read())["swarms"][0]["grids"][0]["cells"]
            return {c["uid"]: c["replicas"] for c in cells}

        deadline = time.monotonic() + 60
        while sorted(replicas().values()) != [1, 1, 2, 2]:
            assert time.monotonic() < deadline, replicas()
            time.sleep(1.0)
    finally:
        if donor is not None:
            donor.stop()
        stop(proc)
