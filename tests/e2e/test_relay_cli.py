"""`volunteer relay` run as a stranger would: addresses printed, reservations work, /metrics, clean exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import trio

from volunteer.net.stack import open_stack
from volunteer.net.nat.relay_client import reserve


def start_relay(tmp_path, *extra):
    env = {**os.environ, "VOLUNTEER_RELAY_IDENTITY": str(tmp_path / "relay.key")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "volunteer", "relay", "--listen", "/ip4/127.0.0.1/tcp/0", "--metrics", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    lines = [proc.stdout.readline().strip()]
    assert lines[0].startswith("relay 12D3KooW"), (lines, proc.stderr.read() if proc.poll() is not None else "")
    while not lines[-1].startswith("metrics on") and len(lines) < 10:
        lines.append(proc.stdout.readline().strip())
    addr = next(line for line in lines if line.startswith("listening on")).split()[-1]
    metrics = lines[-1].split()[-1]
    assert metrics.startswith("http://"), lines
    return proc, addr, metrics


async def http_get(url: str) -> str:
    host_port = url.split("//")[1].split("/")[0]
    host, port = host_port.split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(b"GET /metrics HTTP/1.0\r\n\r\n")
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    return data.decode()


async def test_relay_serves_reservations_and_metrics_and_exits_cleanly(tmp_path):
    proc, addr, metrics_url = start_relay(tmp_path, "--max-reservations", "5")
    try:
        with trio.fail_after(30):
            async with open_stack() as client:
                reservation = await reserve(client, addr)
                assert str(reservation.relay) == addr.rsplit("/", 1)[1]
                text = await http_get(metrics_url)
                assert text.split(None, 2)[1] == "200", text[:200]
                assert "volunteer_relay_reservations 1" in text and "# TYPE volunteer_relay_bytes_total counter" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert "relay stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_relay_port_in_use_is_one_line(tmp_path):
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "volunteer", "relay", "--no-dashboard", "--listen", f"/ip4/127.0.0.1/tcp/{port}"],
            capture_output=True, text=True, timeout=30, env={**os.environ, "VOLUNTEER_RELAY_IDENTITY": str(tmp_path / "k")},
        )
    finally:
        sock.close()
    assert result.returncode == 1
    assert "address already in use" in result.stderr and "Traceback" not in result.stderr


def test_relay_dashboard_renders_headless():
    from rich.console import Console

    from relay.dashboard import render
    from relay.node import open_relay_node
    from volunteer.net.identity import KeyPair

    def draw(node, width, height):
        with open(os.devnull, "w") as sink:
            console = Console(width=width, height=height, record=True, file=sink)
            console.print(render(node, 3723, height=height))
            return console.export_text()

    async def main():
        async with open_relay_node(KeyPair.generate(), ["/ip4/127.0.0.1/tcp/0"]) as node:
            quiet = draw(node, 80, 24)
            # a busy relay: more circuits and refusal reasons than an 80x24 terminal has rows for
            peers = [KeyPair.generate().peer_id for _ in range(40)]
            for i in range(20):
                node.hop.active[10_000 + i] = (peers[2 * i], peers[2 * i + 1], [1 << 20, 1 << 10])
            for i, reason in enumerate(("RESOURCE_LIMIT_EXCEEDED", "NO_RESERVATION", "PERMISSION_DENIED", "[odd]")):
                node.hop.resources.refusals[reason] += i + 1
            return quiet, draw(node, 80, 24), draw(node, 120, 50)

    quiet, busy, tall = trio.run(main)
    for section in ("Relay", "Load", "Circuits", "Refusals", "reservations", "up 1h02m", "no circuits"):
        assert section in quiet
    assert "+17 more" in busy and "1.0 MiB" in busy and "[odd]" in busy
    for text, width, height in ((quiet, 80, 24), (busy, 80, 24), (tall, 120, 50)):
        lines = text.rstrip("\n").splitlines()
        assert len(lines) <= height and max(len(line) for line in lines) <= width, text
    assert tall.count("MiB") > busy.count("MiB")  # a taller terminal lists more circuits


def test_doctor_against_a_relay(tmp_path):
    proc, addr, _ = start_relay(tmp_path)
    env = {**os.environ, "VOLUNTEER_IDENTITY": str(tmp_path / "doctor.key")}
    try:
        result = subprocess.run([sys.executable, "-m", "volunteer", "doctor", addr], capture_output=True, text=True, timeout=90, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        for name in ("reach", "reachability", "NAT mapping", "relay", "perf"):
            assert any(line.split(None, 1)[1].startswith(name) for line in lines if line[:4] in ("OK  ", "WARN")), (name, result.stdout)
        assert any(line.startswith("OK    perf") and "MB/s up" in line for line in lines)
        bad = subprocess.run([sys.executable, "-m", "volunteer", "doctor", "/ip4/127.0.0.1/tcp/1/p2p/" + addr.rsplit("/", 1)[1]],
                             capture_output=True, text=True, timeout=90, env=env)
        assert bad.returncode == 1 and "FAIL" in bad.stdout and "→" in bad.stdout
        # a swarm file works too: its relays are what gets checked
        swarm = tmp_path / "mine.toml"
        swarm.write_text(f'name = "mine"\nrelays = ["{addr}"]\n')
        by_swarm = subprocess.run([sys.executable, "-m", "volunteer", "doctor", "--perf-size", "0", str(swarm)],
                                  capture_output=True, text=True, timeout=90, env=env)
        assert by_swarm.returncode == 0, by_swarm.stdout + by_swarm.stderr
        assert "reach" in by_swarm.stdout and "relay" in by_swarm.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        proc.stdout.close()
        proc.stderr.close()


def test_relay_takes_resource_limits_from_config(tmp_path):
    from relay.node import open_relay_node
    from volunteer.cli.relaycmd import resource_limits
    from volunteer.net.identity import KeyPair
    from volunteer.swarmfile import load_limits

    path = tmp_path / "config.toml"
    path.write_text("[limits]\nsystem_memory = 536870912\naddress_connections = 16\nbackward_window = 600\n")
    limits = resource_limits(load_limits(path))
    assert (limits.system_memory, limits.address_connections) == (512 * 1024 * 1024, 16)

    async def main():
        async with open_relay_node(KeyPair.generate(), ["/ip4/127.0.0.1/tcp/0"], resources=limits) as node:
            return node.host.resources.limits

    assert trio.run(main) is limits


def test_a_relay_and_a_donor_on_one_machine_have_their_own_keys(tmp_path, cli_env):
    """`volunteer relay` once took the donor's key: one peer ID for two nodes, and a donor
    'reserved on a relay' that was itself."""
    from .conftest import run_cli

    env = {**os.environ, **cli_env}
    env.pop("VOLUNTEER_RELAY_IDENTITY", None)
    proc = subprocess.Popen([sys.executable, "-m", "volunteer", "relay", "--listen", "/ip4/127.0.0.1/tcp/0", "--no-dashboard"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        first = proc.stdout.readline().split()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert first[0] == "relay", first
    donor = run_cli("id", env=cli_env).stdout.split()[-1]
    assert first[1] != donor and donor.startswith("12D3KooW")
    assert (tmp_path / "config" / "volunteer" / "relay.key").exists()
