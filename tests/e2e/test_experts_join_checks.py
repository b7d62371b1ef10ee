"""`volunteer join` checks what experts need before it joins: an unwritable checkpoint directory
is one line on stderr and exit 1 (not a traceback at leave time); --share-tracebacks reaches the
experts' configuration."""

from __future__ import annotations

import os
import stat

from volunteer.cli.joincmd import build_options
from volunteer.cli.main import build_parser
from volunteer.net.identity import KeyPair

from .conftest import run_cli
from .test_join_cli import one_line_error, unreachable_swarm


def test_an_unwritable_checkpoint_directory_is_one_line_and_exit_1(tmp_path, cli_env):
    swarm = unreachable_swarm(tmp_path)
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        # root ignores permissions: then only the file in the way can stop us
        cases = [in_the_way / "checkpoints"] + ([] if os.access(locked, os.W_OK) else [locked])
        for directory in cases:
            result = run_cli("join", swarm, "--experts", "ffn:e.[0:2]", "--device", "cpu", "--no-dashboard",
                             "--checkpoints", str(directory), env=cli_env)
            assert result.returncode == 1
            line = one_line_error(result)
            assert f"checkpoint directory {directory} is not writable" in line
    finally:
        locked.chmod(stat.S_IRWXU)


def test_share_tracebacks_flag_reaches_the_daemon_options(tmp_path):
    swarm = unreachable_swarm(tmp_path)
    parser = build_parser()
    base = ["join", swarm, "--identity", str(tmp_path / "key")]
    assert build_options(parser.parse_args(base)).node.share_tracebacks == "redacted"
    assert build_options(parser.parse_args([*base, "--share-tracebacks", "none"])).node.share_tracebacks == "none"


def test_share_tracebacks_refuses_unknown_policies(tmp_path, cli_env):
    result = run_cli("join", unreachable_swarm(tmp_path), "--share-tracebacks", "some", env=cli_env)
    assert result.returncode == 2 and "--share-tracebacks" in result.stderr


def test_join_without_experts_places_on_the_swarm_files_grid(tmp_path):
    swarm = tmp_path / "grid.toml"
    swarm.write_text(
        f'name = "grid"\nbootstrap = ["/ip4/127.0.0.1/tcp/9/p2p/{KeyPair.generate().peer_id}"]\n'
        '[[grid]]\nprefix = "expert"\nsize = [4]\nexpert = "ffn"\nhidden_dim = 8\nreplicas = 2\n'
    )
    parser = build_parser()
    base = ["join", str(swarm), "--identity", str(tmp_path / "key")]
    placed = build_options(parser.parse_args(base)).node
    assert placed.place and placed.uids == [] and placed.max_experts is None and placed.hosts_experts
    assert build_options(parser.parse_args([*base, "--max-experts", "3"])).node.max_experts == 3
    named = build_options(parser.parse_args([*base, "--experts", "ffn:expert.[0:2]"])).node
    assert not named.place and named.uids == ["expert.0", "expert.1"]


def test_port_mapping_is_on_by_default_and_off_by_flag_or_config_key(tmp_path, monkeypatch):
    monkeypatch.delenv("VOLUNTEER_NO_PORT_MAPPING", raising=False)
    swarm = unreachable_swarm(tmp_path)
    parser = build_parser()
    base = ["join", swarm, "--identity", str(tmp_path / "key")]
    default = build_options(parser.parse_args(base)).node
    assert default.stack is None or default.stack.port_mapping  # the standard stack: PortMapper included
    assert not build_options(parser.parse_args([*base, "--no-port-mapping"])).node.stack.port_mapping
    config = tmp_path / "config.toml"
    config.write_text("[join]\nport_mapping = false\n")
    assert not build_options(parser.parse_args([*base, "--config", str(config)])).node.stack.port_mapping
    config.write_text("[join]\nport_mapping = true\n")
    assert build_options(parser.parse_args([*base, "--config", str(config)])).node.stack is None
    monkeypatch.setenv("VOLUNTEER_NO_PORT_MAPPING", "1")
    assert not build_options(parser.parse_args(base)).node.stack.port_mapping


def test_a_port_mapping_key_of_the_wrong_type_is_one_line(tmp_path, cli_env):
    config = tmp_path / "config.toml"
    config.write_text('[join]\nport_mapping = "no"\n')
    result = run_cli("join", unreachable_swarm(tmp_path), "--config", str(config), env=cli_env)
    assert result.returncode == 1
    assert "port_mapping has the wrong type: expected true or false" in one_line_error(result)
