"""`volunteer id`, `volunteer ping`, `volunteer perf` run as a user would."""

from __future__ import annotations

import json
import os
import stat

from volunteer.net.identity import KeyPair

from .conftest import run_cli


def test_id_creates_key_once_with_safe_permissions(tmp_path, cli_env):
    key = tmp_path / "me.key"
    first = run_cli("id", "--identity", str(key), env=cli_env)
    assert first.returncode == 0, first.stderr
    peer = first.stdout.strip()
    assert peer.startswith("12D3KooW")
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    again = run_cli("id", "--identity", str(key), env=cli_env)
    assert again.stdout.strip() == peer
    cid = run_cli("id", "--identity", str(key), "--cid", env=cli_env)
    assert cid.stdout.strip().startswith("b")
    # Default location comes from the environment.
    default = run_cli("id", env=cli_env)
    assert default.returncode == 0 and os.path.exists(cli_env["VOLUNTEER_IDENTITY"])


def test_id_refuses_world_readable_key(tmp_path, cli_env):
    key = tmp_path / "open.key"
    assert run_cli("id", "--identity", str(key), env=cli_env).returncode == 0
    os.chmod(key, 0o644)
    result = run_cli("id", "--identity", str(key), env=cli_env)
    assert result.returncode != 0
    assert "chmod" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_ping_a_node(node, cli_env):
    result = run_cli("ping", "-c", "3", "-i", "0.05", node, env=cli_env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sum("rtt=" in line and "path=direct" in line for line in lines) == 3
    assert "3 sent, 3 received, 0% lost" in result.stdout


def test_ping_failures_are_one_line(node, cli_env):
    impostor = KeyPair.generate().peer_id
    wrong = node.rsplit("/p2p/", 1)[0] + f"/p2p/{impostor}"
    result = run_cli("ping", "-c", "1", wrong, env=cli_env)
    assert result.returncode == 1
    assert "peer" in result.stderr.lower() and "Traceback" not in result.stderr

    result = run_cli("ping", "-c", "1", "-W", "3", "/ip4/127.0.0.1/tcp/1", env=cli_env)
    assert result.returncode == 1 and "unreachable" in result.stderr

    result = run_cli("ping", "/ip4/999.1.1.1/tcp/1", env=cli_env)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "999.1.1.1" in result.stderr


def test_perf_json_exact_bytes(node, cli_env):
    result = run_cli("perf", "--json", "--upload", "3MiB", "--download", "5MiB", "--streams", "2", node, env=cli_env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["upload_bytes"] == 2 * 3 * 2**20 and report["download_bytes"] == 2 * 5 * 2**20
    assert report["path"] == "direct" and report["download_MBps"] > 0


def test_help_has_examples(cli_env):
    top = run_cli("--help", env=cli_env)
    assert top.returncode == 0 and "examples" in top.stdout
    for command in ("id", "ping", "perf"):
        result = run_cli(command, "--help", env=cli_env)
        assert result.returncode == 0 and "examples" in result.stdout, command
    bad = run_cli("ping", env=cli_env)
    assert bad.returncode == 2 and "MULTIADDR" in bad.stderr
