"""`volunteer join` and its companions run as a user would: errors are one line and a non-zero
exit; a running daemon answers `status` (--json and the rendered dashboard), pause and resume;
Ctrl-C / SIGTERM leaves gracefully with exit 0."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from volunteer.net.identity import KeyPair

from .conftest import JoinProcess, run_cli


def one_line_error(result) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [l for l in result.stderr.strip().splitlines() if l]
    assert len(lines) == 1, result.stderr
    return lines[0]


def unreachable_swarm(tmp_path) -> str:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now: connection refused
    path = tmp_path / "dead.toml"
    path.write_text(f'name = "dead"\nbootstrap = ["/ip4/127.0.0.1/tcp/{port}/p2p/{KeyPair.generate().peer_id}"]\n')
    return str(path)


def test_join_refuses_bad_input_with_one_line(tmp_path, cli_env):
    swarm = unreachable_swarm(tmp_path)
    line = one_line_error(run_cli("join", "nosuchswarm", env=cli_env))
    assert "unknown swarm 'nosuchswarm'" in line
    line = one_line_error(run_cli("join", swarm, "--experts", "bogus", env=cli_env))
    assert "CLASS:PATTERN" in line
    # --yes: without consent nothing is dialled (the daemon waits for `volunteer fold`)
    line = one_line_error(run_cli("join", swarm, "--yes", "--listen", "/ip4/127.0.0.1/tcp/0", "--no-dashboard", env=cli_env))
    assert "cannot reach swarm 'dead'" in line
    line = one_line_error(run_cli("join", swarm, "--device", "cuda:7", "--experts", "ffn:e.[0:2]", env=cli_env))
    assert "no CUDA device cuda:7" in line and "--device cpu" in line
    result = run_cli("join", swarm, "--max-gpu-memory", "2", env=cli_env)
    assert result.returncode == 2 and "fraction" in result.stderr
    # config.toml's [join] settings are defaults for the flags
    config = tmp_path / "settings.toml"
    config.write_text('[join]\ndevice = "cuda:3"\nexperts = "ffn:e.[0:2]"\n')
    line = one_line_error(run_cli("join", swarm, "--config", str(config), env=cli_env))
    assert "no CUDA device cuda:3" in line
    config.write_text('[join]\nwho = 1\n')
    assert "unknown setting join.who" in one_line_error(run_cli("join", swarm, "--config", str(config), env=cli_env))


def test_join_on_a_busy_port(tmp_path, cli_env):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        for consent in ([], ["--yes"]):  # waiting for consent, a busy port is said at once all the same
            line = one_line_error(run_cli("join", unreachable_swarm(tmp_path), *consent, "--listen", f"/ip4/127.0.0.1/tcp/{port}",
                                          env=cli_env))
            assert "address already in use" in line, consent
    finally:
        holder.close()


def test_status_without_daemon(cli_env):
    line = one_line_error(run_cli("status", env=cli_env))
    assert "no daemon running" in line and "volunteer join" in line
    assert "no daemon running" in one_line_error(run_cli("pause", env=cli_env))


class Daemon(JoinProcess):
    """`volunteer join --yes ARGS` in a subprocess, stdout captured."""

    def __init__(self, *args: str, env: dict) -> None:
        super().__init__(["join", "--yes", *args], env=env)


@pytest.fixture
def relay(tmp_path, cli_env):
    proc = subprocess.Popen([sys.executable, "-m", "volunteer", "relay", "--listen", "/ip4/127.0.0.1/tcp/0", "--no-dashboard",
                             "--swarm", "e2e", "--identity", str(tmp_path / "relay.key")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**__import__("os").environ, **cli_env})
    try:
        for line in proc.stdout:
            if line.startswith("listening on /ip4/127.0.0.1/"):
                addr = line.split()[2]
                break
        swarm = tmp_path / "e2e.toml"
        swarm.write_text(f'name = "e2e"\nrelays = ["{addr}"]\n')
        yield str(swarm)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_daemon_status_pause_resume_and_graceful_leave(relay, tmp_path, cli_env):
    import os

    env = {**os.environ, **cli_env}
    control = str(tmp_path / "run" / "d.sock")
    daemon = Daemon(relay, "--listen", "/ip4/127.0.0.1/tcp/0", "--no-dashboard", "--control", control,
                    "--experts", "ffn:expert.[0:2].[0:2]", "--hidden-dim", "16", "--device", "cpu", env=env)
    try:
        assert any("hosting 4 ffn experts" in l for l in daemon.lines), daemon.lines
        deadline = time.monotonic() + 30
        while True:
            status = json.loads(run_cli("status", "--json", "--control", control, env=cli_env).stdout)
            if status["dht"]["last_declared_age_s"] is not None or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status["swarm"] == "e2e" and status["peer_id"].startswith("12D3KooW")
        assert [e["uid"] for e in status["experts"]] == ["expert.0.0", "expert.0.1", "expert.1.0", "expert.1.1"]
        assert status["dht"]["routing_table"] >= 1 and status["dht"]["last_declared_age_s"] is not None
        assert status["connections"] and status["connections"][0]["path"].startswith("direct ")
        assert any(c["bytes_in"] > 0 and c["bytes_out"] > 0 for c in status["connections"])  # DHT traffic at least
        listed = run_cli("experts", relay, "--json", env=cli_env)
        assert listed.returncode == 0, listed.stderr
        assert sorted({r["uid"] for r in json.loads(listed.stdout)}) == ["expert.0.0", "expert.0.1", "expert.1.0", "expert.1.1"]
        rendered = run_cli("status", "--control", control, env=cli_env)
        assert rendered.returncode == 0
        for title in ("Identity", "Reachability", "Connections", "DHT", "Experts", "Compute"):
            assert title in rendered.stdout
        # a trainer calls an expert (forward and backward): the expert learns, counts show it
        import torch

        from volunteer import RemoteExpert, Swarm

        with Swarm.join(relay) as swarm:
            host = swarm.get_experts(["expert.1.0"])["expert.1.0"][0]
            expert = RemoteExpert("expert.1.0", host.peer, swarm, addrs=host.addrs)
            x = torch.randn(4, 16, requires_grad=True)
            expert(x).sum().backward()
            assert x.grad is not None and x.grad.shape == (4, 16)
        served = json.loads(run_cli("status", "--json", "--control", control, env=cli_env).stdout)
        assert {e["uid"]: e["requests"] for e in served["experts"]}["expert.1.0"] == 2
        assert run_cli("pause", "--control", control, env=cli_env).returncode == 0
        assert json.loads(run_cli("status", "--json", "--control", control, env=cli_env).stdout)["paused"] is True
        assert json.loads(run_cli("experts", relay, "--json", env=cli_env).stdout) == []  # gone at once
        assert run_cli("resume", "--control", control, env=cli_env).returncode == 0
        deadline = time.monotonic() + 10
        while not json.loads(run_cli("experts", relay, "--json", env=cli_env).stdout):
            assert time.monotonic() < deadline, "experts not re-declared after resume"
            time.sleep(0.3)
    finally:
        code = daemon.stop(signal.SIGINT)
    assert code == 0, "".join(daemon.lines)
    assert any("left the swarm" in l for l in daemon.lines)
    assert json.loads(run_cli("experts", relay, "--json", env=cli_env).stdout) == []  # tombstoned on leave
    # the expert that learned was checkpointed on the way out
    assert (tmp_path / "state" / "volunteer" / "checkpoints" / "e2e" / "expert.1.0.pt").is_file()
    assert not (tmp_path / "run" / "d.sock").exists()
