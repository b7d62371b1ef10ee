"""Every bad input a user can type: a bad flag is the sub-command's own usage and one
error line, exit 2; anything else is one line on stderr, exit 1, saying what to do; a broken pipe
is silent. Run as a user runs the command: a subprocess, its exit code and its lines."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from volunteer import __version__
from volunteer.net.identity import KeyPair

from .conftest import run_cli
from .test_join_cli import one_line_error, unreachable_swarm


def usage_error(result, command: str) -> str:
    """Exit 2, the sub-command's usage, one error line; returns that line."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"usage: volunteer {command} "), result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith(f"volunteer {command}: error:")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr
    return errors[0]


def test_a_bad_flag_shows_the_subcommands_usage(cli_env):
    for command, *positional in (["join", "demo"], ["status"], ["ping", "/ip4/127.0.0.1/tcp/1"], ["relay"], ["testnet"]):
        line = usage_error(run_cli(command, *positional, "--frobnicate", env=cli_env), command)
        assert "unrecognized arguments: --frobnicate" in line
    assert "required: SWARM" in usage_error(run_cli("join", "--frobnicate", env=cli_env), "join")


def test_version_and_verbose_after_the_command(cli_env):
    result = run_cli("--version", env=cli_env)
    assert result.returncode == 0 and result.stdout.strip() == f"volunteer {__version__}"
    quiet, verbose = run_cli("id", env=cli_env), run_cli("id", "-v", env=cli_env)
    assert verbose.returncode == 0 and verbose.stdout == quiet.stdout  # -v after the command is taken
    assert run_cli("-v", "id", "-vv", env=cli_env).stdout == quiet.stdout


def test_a_gpu_device_name_is_one_line(tmp_path, cli_env):
    line = one_line_error(run_cli("join", unreachable_swarm(tmp_path), "--device", "gpu", "--experts", "ffn:e.[0:2]", env=cli_env))
    assert line == "volunteer join: unknown device 'gpu': use auto, cpu, cuda or cuda:N (e.g. cuda:0), or mps"


def test_an_unreachable_relay_is_one_short_line_pointing_to_doctor(tmp_path, cli_env):
    swarm = unreachable_swarm(tmp_path)
    line = one_line_error(run_cli("join", swarm, "--yes", "--no-dashboard", env=cli_env))  # consent: it dials
    assert line.startswith("volunteer join: cannot reach swarm 'dead': its bootstrap peer 127.0.0.1:")
    assert "did not answer (Connection refused)" in line and line.endswith(f"; run `volunteer doctor {swarm}` to see why")
    assert "12D3KooW" not in line and len(line) - len(swarm) < 150, line  # no peer id repeated, short


def test_a_misspelt_swarm_file_key_is_one_line_naming_the_known_ones(tmp_path, cli_env):
    path = tmp_path / "typo.toml"
    path.write_text(f'name = "typo"\nbootstap = ["/ip4/127.0.0.1/tcp/1/p2p/{KeyPair.generate().peer_id}"]\n')
    line = one_line_error(run_cli("join", str(path), env=cli_env))
    assert "unknown setting bootstap (did you mean bootstrap?" in line
    assert "known: name, id, bootstrap, relays, experts, grid, kind, testnet" in line
    path.write_text('name = "typo"\n[experts]\nhidden_dim = "wide"\n')
    line = one_line_error(run_cli("join", str(path), env=cli_env))
    assert "experts.hidden_dim has the wrong type: expected an integer, got a string" in line


def test_unknown_swarm_says_where_a_swarm_comes_from(cli_env):
    line = one_line_error(run_cli("join", "demo", env=cli_env))
    assert "unknown swarm 'demo'" in line and "organiser" in line and "volunteer testnet --name demo" in line


def test_relay_metrics_on_a_busy_port_is_one_line(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        result = run_cli("relay", "--no-dashboard", "--listen", "/ip4/127.0.0.1/tcp/0", "--metrics", f"127.0.0.1:{port}",
                         env={"VOLUNTEER_RELAY_IDENTITY": str(tmp_path / "relay.key")})
    finally:
        holder.close()
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"volunteer relay: cannot serve metrics on 127.0.0.1:{port}: the port is in use; choose another --metrics HOST:PORT"
    ]


def test_join_metrics_on_a_busy_port_is_one_line(tmp_path, cli_env):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        line = one_line_error(run_cli("join", unreachable_swarm(tmp_path), "--metrics", f"127.0.0.1:{port}", env=cli_env))
    finally:
        holder.close()
    assert "the port is in use; choose another --metrics HOST:PORT" in line


def test_a_broken_pipe_is_silent(cli_env):
    # `volunteer id | head -0`: the reader is gone before anything is written
    for args in (["id"], ["--version"], ["status", "--help"]):
        proc = subprocess.Popen([sys.executable, "-m", "volunteer", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={**os.environ, **cli_env})
        proc.stdout.close()
        _, err = proc.communicate(timeout=60)
        assert err == b"", (args, err)
        assert proc.returncode in (0, 141), (args, proc.returncode)


def test_a_stale_testnet_swarm_file_is_one_line(tmp_path, cli_env):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # that process has exited
    path = tmp_path / "old.toml"
    path.write_text(f'name = "old"\nrelays = ["/ip4/127.0.0.1/tcp/1/p2p/{KeyPair.generate().peer_id}"]\n[testnet]\npid = {pid}\n')
    line = one_line_error(run_cli("join", str(path), env=cli_env))
    assert f"belongs to a testnet that is no longer running (pid {pid})" in line and "volunteer testnet --name old" in line


def test_testnet_dir_naming_a_file_is_one_line(tmp_path, cli_env):
    occupied = tmp_path / "afile"
    occupied.write_text("not a directory")
    line = one_line_error(run_cli("testnet", "-n", "1", "--dir", str(occupied), "--no-dashboard", env=cli_env))
    assert f"cannot use {occupied} as the testnet's directory" in line


def test_trainer_cert_mistakes_are_one_line(tmp_path, cli_env):
    for args, fragment in (
        (["trainer-cert", "12D3", "--swarm", "demo"], "peer ID"),
        (["trainer-cert", str(KeyPair.generate().peer_id)], "--swarm"),
        (["trainer-cert", str(KeyPair.generate().peer_id), "--swarm", "demo", "--key", str(tmp_path / "none.key")],
         "trainer-cert --init"),
        (["trainer-cert", str(KeyPair.generate().peer_id), "--swarm", "demo", "--days", "0"], "--days"),
    ):
        assert fragment in one_line_error(run_cli(*args, env=cli_env)), args


def test_a_web_token_that_cannot_be_read_or_written_is_one_line_before_joining(tmp_path, cli_env):
    config = tmp_path / "config" / "volunteer"
    (config / "web-token").mkdir(parents=True)  # a directory where the token file goes
    line = one_line_error(run_cli("join", unreachable_swarm(tmp_path), "--web", "127.0.0.1:0", "--no-dashboard",
                                  env=cli_env))
    assert "--web needs its token file" in line and "web-token" in line


def test_a_swarm_whose_relay_is_this_donor_is_one_line(tmp_path, cli_env):
    """A relay started with the donor's own key (``volunteer relay --identity identity.key``) is
    the same peer: joining through it would reserve on ourselves and call that reachable."""
    me = run_cli("id", env=cli_env).stdout.split()[0]
    path = tmp_path / "self.toml"
    path.write_text(f'name = "self"\nrelays = ["/ip4/127.0.0.1/tcp/4001/p2p/{me}"]\n')
    line = one_line_error(run_cli("join", str(path), "--yes", "--no-dashboard", env=cli_env))
    assert line.startswith("volunteer join: swarm 'self' names this donor's own peer ID as a relay"), line
    assert "relay.key" in line
