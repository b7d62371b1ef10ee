"""One daemon per control path and one per listening port, decided as a user meets it: two
``volunteer join`` started in the same instant (Unix-socket or TCP control), and a second daemon
asked to listen on a port another process listens on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from .conftest import JoinProcess, run_cli


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.strip().splitlines() if line]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("control", ["unix", "tcp"])
def test_two_joins_started_together_one_runs_and_the_other_says_so(tmp_path, cli_env, control):
    swarm = tmp_path / "solo.toml"
    swarm.write_text('name = "solo"\n')  # the first node of a new swarm: nothing to reach
    env = {**os.environ, **cli_env}
    os.makedirs(cli_env["XDG_RUNTIME_DIR"], mode=0o700)  # as the login session makes it
    if control == "tcp":
        env["VOLUNTEER_CONTROL"] = "tcp"
    args = [sys.executable, "-m", "volunteer", "join", "--yes", str(swarm), "--listen", "/ip4/127.0.0.1/tcp/0",
            "--no-dashboard"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        # the loser exits at once; the winner runs until stopped
        loser = None
        while loser is None:
            for proc in procs:
                try:
                    proc.wait(timeout=0.2)
                    loser = proc
                    break
                except subprocess.TimeoutExpired:
                    pass
        winner = procs[1] if loser is procs[0] else procs[0]
        out, err = loser.communicate(timeout=30)
        assert loser.returncode == 1, (out, err)
        line = _one_line(err)
        assert "another daemon is already running" in line and "--control" in line, line
        assert winner.poll() is None, winner.communicate()
        # the loser's exit left the winner's socket (or port file) alone: status reaches it
        status = run_cli("status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["pid"] == winner.pid
        assert run_cli("stop", env=env).returncode == 0
        winner.communicate(timeout=60)
        assert winner.returncode == 0
        # the lock went with the winner: a new daemon starts
        again = JoinProcess(["join", "--yes", str(swarm), "--listen", "/ip4/127.0.0.1/tcp/0", "--no-dashboard"], env=env)
        assert again.stop() == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="the platform has no SO_REUSEPORT to share ports with")
def test_join_on_a_port_another_daemon_listens_on(tmp_path, cli_env):
    holder = socket.socket()  # as another daemon's listener: SO_REUSEPORT set
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    swarm = tmp_path / "solo.toml"
    swarm.write_text('name = "solo"\n')
    try:
        result = run_cli("join", "--yes", str(swarm), "--listen", f"/ip4/127.0.0.1/tcp/{port}", "--no-dashboard",
                         env=cli_env)
        assert result.returncode == 1
        line = _one_line(result.stderr)
        assert f"cannot listen on /ip4/127.0.0.1/tcp/{port}: address already in use" in line, line
    finally:
        holder.close()
