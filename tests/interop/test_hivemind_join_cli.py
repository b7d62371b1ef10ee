"""The real CLI on a hivemind swarm file, against real hivemind 1.1.12 (its own venv, its p2pd):
``volunteer join SWARMFILE`` (a subprocess) joins through a hivemind DHT peer, an unmodified
hivemind trainer trains on its experts, ``volunteer experts SWARMFILE`` lists them with null for
what hivemind does not declare, and ``volunteer doctor SWARMFILE`` checks the hivemind peer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import trio

from ..e2e.conftest import run_cli
from .test_hivemind_dht import hivemind_peer
from .test_hivemind_experts import run_trainer

pytestmark = pytest.mark.interop

HIDDEN = 16


@pytest.fixture
def cli_env(tmp_path) -> dict:
    """A private config, state and runtime dir for the CLI (as tests/e2e uses)."""
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
            "XDG_RUNTIME_DIR": str(tmp_path / "run"), "VOLUNTEER_IDENTITY": str(tmp_path / "config" / "volunteer" / "identity.key")}


def start_join(swarm_file: str, control: str, env: dict) -> subprocess.Popen:
    """``volunteer join`` in its own process group; returns once its control socket is up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "volunteer", "join", swarm_file, "--yes", "--listen", "/ip4/127.0.0.1/tcp/0", "--no-dashboard",
         "--control", control, "--experts", "ffn:ffn.[0:4]", "--hidden-dim", str(HIDDEN), "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
    )
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "control socket" in line:
            return proc
    stop_join(proc)
    raise AssertionError("volunteer join did not start:\n" + "".join(lines))


def stop_join(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    proc.stdout.close()
    return code


async def in_thread(fn, *args):
    return await trio.to_thread.run_sync(lambda: fn(*args))


@pytest.mark.trio_timeout(300)
async def test_volunteer_join_serves_a_hivemind_trainer_and_experts_doctor_see_the_swarm(tmp_path, cli_env):
    env = {**os.environ, **cli_env}
    control = str(tmp_path / "run" / "hm.sock")
    async with hivemind_peer() as peer:
        swarm_file = tmp_path / "hm.toml"
        swarm_file.write_text(f'name = "hm"\nkind = "hivemind"\nbootstrap = ["{peer.addr}"]\n')
        proc = await in_thread(start_join, str(swarm_file), control, env)
        try:
            # the trainer knows only the hivemind peer: our experts are found through hivemind's DHT
            result = await run_trainer(peer.addr, "--hidden", str(HIDDEN), "--grid", "4", "--steps", "60")
            assert result["last"] < result["first"], result
            assert "ExpertInputError" in result["wrong_shape_error"], result

            status = json.loads((await in_thread(lambda: run_cli("status", "--json", "--control", control, env=cli_env))).stdout)
            assert sum(e["requests"] for e in status["experts"]) >= 60

            listed = await in_thread(lambda: run_cli("experts", str(swarm_file), "--prefix", "ffn.", "--json", env=cli_env))
            assert listed.returncode == 0, listed.stderr
            rows = json.loads(listed.stdout)
            assert sorted(r["uid"] for r in rows) == ["ffn.0", "ffn.1", "ffn.2", "ffn.3"]
            assert {r["peer_id"] for r in rows} == {status["peer_id"]}
            assert all(r["load"] is None and r["heartbeat_age_s"] is None and r["expires_in_s"] > 0 for r in rows)
            table = await in_thread(lambda: run_cli("experts", str(swarm_file), "--prefix", "ffn.", env=cli_env))
            assert "hivemind swarm 'hm'" in table.stdout and "–" in table.stdout

            doctor = await in_thread(lambda: run_cli(
                "doctor", str(swarm_file), "--json", "--listen", "/ip4/127.0.0.1/tcp/0", env=cli_env, timeout=120))
            checks = {c["name"]: c for c in json.loads(doctor.stdout)}
            hivemind_check = next(c for name, c in checks.items() if name.startswith("hivemind "))
            assert hivemind_check["status"] == "OK" and "kad peer routing answers" in hivemind_check["detail"], checks
        finally:
            assert await in_thread(stop_join, proc) == 0
