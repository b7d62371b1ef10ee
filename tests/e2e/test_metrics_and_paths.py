"""The metrics endpoints (the relay's and `join --metrics`) read with prometheus_client's own
parser, and VOLUNTEER_CONFIG_DIR honoured by every command."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import trio
from prometheus_client.parser import text_string_to_metric_families

from .conftest import run_cli
from .test_relay_cli import start_relay


async def http_get(url: str, path: str = "/metrics") -> tuple[str, str]:
    """(status code, body) of one GET, sent as a scraper sends it (with the Host it dialled)."""
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    head, _, body = data.decode().partition("\r\n\r\n")
    return head.splitlines()[0].split()[1], body


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe:
            pipe.close()


async def test_relay_metrics_parse_and_other_paths_are_404(tmp_path):
    proc, _addr, url = start_relay(tmp_path)
    try:
        with trio.fail_after(30):
            status, body = await http_get(url)
            assert status == "200"
            found = families(body)
            assert found["volunteer_relay_open_circuits"].type == "gauge"
            assert found["volunteer_relay_circuits"].type == "counter"  # no clash with the gauge any more
            directions = {s.labels["direction"] for s in found["volunteer_relay_bytes"].samples}
            assert directions == {"to_target", "to_source"}
            assert found["volunteer_build_info"].samples[0].labels["component"] == "relay"
            assert "process_cpu_seconds" in found and "python_info" in found
            assert [s.labels["swarm"] for s in found["volunteer_dht_routing_table_peers"].samples] == ["default"]
            assert (await http_get(url, "/"))[0] == "404"
            assert (await http_get(url, "/favicon.ico"))[0] == "404"
    finally:
        stop(proc)


async def test_join_metrics_parse(tmp_path, cli_env):
    relay, relay_addr, _ = start_relay(tmp_path)
    swarm = tmp_path / "local.toml"
    swarm.write_text(f'name = "local"\nrelays = ["{relay_addr}"]\n')
    join = subprocess.Popen(
        [sys.executable, "-m", "volunteer", "join", str(swarm), "--yes", "--no-dashboard", "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0",
         "--metrics", "127.0.0.1:0", "--control", str(tmp_path / "d.sock")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **cli_env, "PYTHONUNBUFFERED": "1"},
    )
    try:
        lines: list[str] = []
        while not any(line.startswith("  metrics on") for line in lines) and len(lines) < 20:
            line = join.stdout.readline()
            assert line, (lines, join.stderr.read())
            lines.append(line)
        url = next(line for line in lines if line.startswith("  metrics on")).split()[-1]
        with trio.fail_after(30):
            status, body = await http_get(url)
            assert status == "200"
            found = families(body)
            assert found["volunteer_build_info"].samples[0].labels["component"] == "volunteer"
            assert {s.labels["status"] for s in found["volunteer_reachability"].samples} == {"public", "private", "unknown"}
            assert found["volunteer_refusals"].type == "counter"
            assert [s.labels["swarm"] for s in found["volunteer_dht_routing_table_peers"].samples] == ["local"]
            assert (await http_get(url, "/status"))[0] == "404"
    finally:
        stop(join)
        stop(relay)


def test_every_command_honours_volunteer_config_dir(tmp_path):
    config = tmp_path / "moved"
    env = {"VOLUNTEER_CONFIG_DIR": str(config), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "run"), "VOLUNTEER_IDENTITY": "",
           "VOLUNTEER_RELAY_IDENTITY": ""}
    key = config / "identity.key"
    peer_id = run_cli("id", env=env).stdout.strip()
    assert key.exists() and peer_id.startswith("12D3KooW")
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    target = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id}"
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        busy = f"127.0.0.1:{holder.getsockname()[1]}"
        for args in (["ping", "-c", "1", "-W", "2", target], ["perf", "--timeout", "2", target],
                     ["doctor", "--perf-size", "0", target], ["relay", "--no-dashboard", "--listen", "/ip4/127.0.0.1/tcp/0", "--metrics", busy]):
            used = config / ("relay.key" if args[0] == "relay" else "identity.key")  # a relay has its own key
            used.unlink(missing_ok=True)
            result = run_cli(*args, env=env)
            assert result.returncode == 1 and "Traceback" not in result.stderr, (args, result.stderr)
            assert used.exists(), f"{args[0]} did not use {used}"
    finally:
        holder.close()
    # join and testnet find named swarm files there too
    (config / "swarms").mkdir()
    (config / "swarms" / "mine.toml").write_text(f'name = "mine"\nbootstrap = ["{target}"]\n')
    result = run_cli("join", "mine", "--yes", "--no-dashboard", "--listen", "/ip4/127.0.0.1/tcp/0", env=env)
    assert "cannot reach swarm 'mine'" in result.stderr, result.stderr
    result = run_cli("testnet", "--name", "mine", "-n", "1", env=env)
    assert result.returncode == 1
    assert f"{config / 'swarms' / 'mine.toml'} is a swarm file that no testnet wrote" in result.stderr
    assert (config / "swarms" / "mine.toml").read_text().startswith('name = "mine"')  # untouched
    assert not (tmp_path / "xdg").exists()  # nothing went to the XDG default
