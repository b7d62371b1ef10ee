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


def start_testnet(tmp_path, env, n=2):
    proc = subprocess.Popen([sys.executable, "-m", "volunteer", "testnet", "-n", str(n), "--dir", str(tmp_path / "net"),
                             "--name", "t", "--no-dashboard", "--experts", "ffn:expert.[0:2].[0:2]", "--hidden-dim", "8"],
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
