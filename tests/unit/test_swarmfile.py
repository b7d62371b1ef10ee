"""Swarm files, XDG paths with their overrides, and the --experts grid syntax."""

from __future__ import annotations

import pytest

from volunteer.net.identity import KeyPair
from volunteer.swarmfile import (
    SwarmFileError,
    SwarmSpec,
    config_dir,
    identity_path,
    load_swarm_file,
    parse_experts_spec,
    resolve_swarm,
    runtime_dir,
    state_dir,
)

PEER = KeyPair.generate().peer_id
ADDR = f"/ip4/203.0.113.7/tcp/4001/p2p/{PEER}"


def test_experts_spec_expands_grids_and_lists():
    cls, uids = parse_experts_spec("ffn:expert.[0:2].[0:3]")
    assert cls == "ffn" and uids == [f"expert.{i}.{j}" for i in range(2) for j in range(3)]
    assert parse_experts_spec("transformer:block.[0:2]") == ("transformer", ["block.0", "block.1"])
    assert parse_experts_spec("ffn:e.1.2,e.3.[4:6]")[1] == ["e.1.2", "e.3.4", "e.3.5"]
    for bad in ("ffn", "ffn:", ":e.1", "ffn:e", "ffn:e.[3:3]", "ffn:e.x", "ffn:e.[0:100].[0:100]", "ffn:bad name.1"):
        with pytest.raises(SwarmFileError):
            parse_experts_spec(bad)


def test_swarm_file_round_trip_and_errors(tmp_path):
    spec = SwarmSpec("demo", "demo-1", [], [ADDR and __import__("volunteer.net.multiaddr", fromlist=["Multiaddr"]).Multiaddr(ADDR)],
                     {"experts": "ffn:expert.[0:4]", "hidden_dim": 32})
    path = tmp_path / "demo.toml"
    path.write_text(spec.to_toml())
    loaded = load_swarm_file(path)
    assert (loaded.name, loaded.id, [str(a) for a in loaded.relays]) == ("demo", "demo-1", [ADDR])
    assert loaded.experts == {"experts": "ffn:expert.[0:4]", "hidden_dim": 32}
    assert [str(a) for a in loaded.entry_points] == [ADDR]
    for text, fragment in (
        ("name = ", "not valid TOML"),
        ('bootstrap = "x"', "list of multiaddr"),
        ('bootstrap = ["/ip4/1.2.3.4/tcp/1"]', "/p2p/"),
        ('bootstrap = ["nonsense"]', "bad bootstrap"),
        ('id = "a/b"', "id must be"),
    ):
        path.write_text(text)
        with pytest.raises(SwarmFileError, match=fragment):
            load_swarm_file(path)


def test_resolve_swarm_by_name_path_and_multiaddr(tmp_path, monkeypatch):
    monkeypatch.setenv("VOLUNTEER_CONFIG_DIR", str(tmp_path / "cfg"))
    (tmp_path / "cfg" / "swarms").mkdir(parents=True)
    (tmp_path / "cfg" / "swarms" / "mine.toml").write_text(f'bootstrap = ["{ADDR}"]\n')
    assert resolve_swarm("mine").id == "mine"
    assert resolve_swarm(str(tmp_path / "cfg" / "swarms" / "mine.toml")).name == "mine"
    bare = resolve_swarm(ADDR, swarm_id="lab")
    assert bare.id == "lab" and [str(a) for a in bare.bootstrap] == [ADDR]
    with pytest.raises(SwarmFileError, match="unknown swarm 'nope'"):
        resolve_swarm("nope")
    with pytest.raises(SwarmFileError, match="/p2p/"):
        resolve_swarm("/ip4/203.0.113.7/tcp/4001")
    with pytest.raises(SwarmFileError, match="no swarm file"):
        resolve_swarm(str(tmp_path / "missing.toml"))


def test_xdg_paths_and_overrides(tmp_path, monkeypatch):
    for var in ("VOLUNTEER_CONFIG_DIR", "VOLUNTEER_STATE_DIR", "VOLUNTEER_RUNTIME_DIR", "VOLUNTEER_IDENTITY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "c"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "s"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "r"))
    assert config_dir() == tmp_path / "c" / "volunteer"
    assert state_dir() == tmp_path / "s" / "volunteer"
    assert runtime_dir() == tmp_path / "r" / "volunteer"
    assert identity_path() == tmp_path / "c" / "volunteer" / "identity.key"
    monkeypatch.setenv("VOLUNTEER_STATE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("VOLUNTEER_IDENTITY", str(tmp_path / "k"))
    assert state_dir() == tmp_path / "elsewhere" and identity_path() == tmp_path / "k"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert runtime_dir() == tmp_path / "elsewhere" / "run"


def test_config_file_defaults_and_errors(tmp_path, monkeypatch):
    from volunteer.swarmfile import load_config

    monkeypatch.setenv("VOLUNTEER_CONFIG_DIR", str(tmp_path))
    assert load_config() == {}  # no config.toml: fine
    (tmp_path / "config.toml").write_text('[join]\ndevice = "cuda:0"\nmax_batch = 256\nlisten = ["/ip4/0.0.0.0/tcp/4001"]\n')
    assert load_config() == {"device": "cuda:0", "max_batch": 256, "listen": ["/ip4/0.0.0.0/tcp/4001"]}
    (tmp_path / "other.toml").write_text('[join]\nmax_batch = "lots"\n')
    with pytest.raises(SwarmFileError, match="wrong type"):
        load_config(tmp_path / "other.toml")
    (tmp_path / "other.toml").write_text('[join]\ngpus = 2\n')
    with pytest.raises(SwarmFileError, match="unknown setting join.gpus"):
        load_config(tmp_path / "other.toml")
    with pytest.raises(SwarmFileError, match="no config file"):
        load_config(tmp_path / "missing.toml")


def test_swarm_file_grids_are_parsed_and_their_errors_are_swarm_file_errors(tmp_path):
    from volunteer.swarmfile import GridSpec, GridSpecError

    path = tmp_path / "grid.toml"
    path.write_text(
        'name = "g"\n[[grid]]\nprefix = "expert"\nsize = [4, 8]\nexpert = "ffn"\nhidden_dim = 1024\nreplicas = 2\n'
        '[[grid]]\nprefix = "block"\nsize = [2]\nexpert = "ffn"\nhidden_dim = 16\nsync_period = 5\n'
    )
    spec = load_swarm_file(path)
    assert spec.grids == [GridSpec("expert", (4, 8), "ffn", 1024, replicas=2), GridSpec("block", (2,), "ffn", 16, sync_period=5.0)]
    assert spec.grids[0].sync_period == 30.0
    assert load_swarm_file(_write(tmp_path, 'name = "none"\n')).grids == []
    bad = _write(tmp_path, 'name = "bad"\n[[grid]]\nprefix = "expert"\nsize = [4]\nexpert = "ffn"\n')
    with pytest.raises(SwarmFileError, match="missing 'hidden_dim'") as info:
        load_swarm_file(bad)
    assert isinstance(info.value, GridSpecError) and str(bad) in str(info.value)


def _write(tmp_path, text: str):
    path = tmp_path / f"s{abs(hash(text))}.toml"
    path.write_text(text)
    return path


def test_swarm_and_config_files_are_validated_alike(tmp_path):
    from volunteer.swarmfile import SWARM_KEYS, load_config

    path = tmp_path / "s.toml"
    path.write_text('name = "s"\nkind = "hivemind"\n[[grid]]\nprefix = "ffn"\nsize = [2]\nexpert = "ffn"\n'
                    'hidden_dim = 8\n[testnet]\npid = 1\n')
    spec = load_swarm_file(path)  # grid and kind are known keys (parse_grids checks a grid's contents)
    assert spec.testnet_pid == 1 and {"grid", "kind"} <= set(SWARM_KEYS)
    for text, fragment in (
        ('relay = []', r"unknown setting relay \(did you mean relays\? known: name, id, bootstrap, relays, experts, grid, kind, testnet, trainers, organiser, forwards, receipts\)"),
        ('[experts]\nhiden_dim = 3', r"unknown setting experts.hiden_dim \(did you mean experts.hidden_dim\?"),
        ('[experts]\nmdns = 1', "experts.mdns has the wrong type: expected true or false, got an integer"),
        ('experts = 3', r"experts has the wrong type: expected a table \[experts\], got an integer"),
        ('kind = 1', "kind has the wrong type: expected a string"),
        ('[testnet]\npid = "x"', "testnet.pid has the wrong type: expected an integer"),
    ):
        path.write_text(text)
        with pytest.raises(SwarmFileError, match=fragment):
            load_swarm_file(path)
    path.write_text('[join]\nmax_batch = true\n')
    with pytest.raises(SwarmFileError, match="join.max_batch has the wrong type: expected an integer, got true or false"):
        load_config(path)
    path.write_text('[jion]\n')
    with pytest.raises(SwarmFileError, match=r"unknown setting jion \(did you mean join\? known: join, limits, run\)"):
        load_config(path)


def test_to_toml_quotes_what_it_must(tmp_path):
    from volunteer.net.multiaddr import Multiaddr

    spec = SwarmSpec('we "quote"', "q", [], [Multiaddr(ADDR)], {"experts": "ffn:e.[0:2]", "hidden_dim": 8}, testnet_pid=42)
    path = tmp_path / "q.toml"
    path.write_text(spec.to_toml())
    loaded = load_swarm_file(path)
    assert (loaded.name, loaded.experts, loaded.testnet_pid) == ('we "quote"', {"experts": "ffn:e.[0:2]", "hidden_dim": 8}, 42)


def test_testnet_swarm_file_is_written_only_where_no_real_swarm_is(tmp_path):
    import os

    from volunteer.cli.testnet import remove_named_swarm_file, write_named_swarm_file
    from volunteer.errors import VolunteerError

    path = tmp_path / "swarms" / "t.toml"
    mine = SwarmSpec("t", "t", testnet_pid=os.getpid()).to_toml()
    write_named_swarm_file(path, mine, "t")
    assert load_swarm_file(path).testnet_pid == os.getpid()
    remove_named_swarm_file(path)
    assert not path.exists()
    path.write_text('name = "t"\n')  # a real swarm's file: never overwritten, never removed
    with pytest.raises(VolunteerError, match="no testnet wrote"):
        write_named_swarm_file(path, mine, "t")
    remove_named_swarm_file(path)
    assert path.read_text() == 'name = "t"\n'
    path.write_text(SwarmSpec("t", "t", testnet_pid=os.getppid()).to_toml())  # a live testnet's
    with pytest.raises(VolunteerError, match="already running"):
        write_named_swarm_file(path, mine, "t")
    path.write_text(SwarmSpec("t", "t", testnet_pid=2**22 + 12345).to_toml())  # a dead one's: replaced
    write_named_swarm_file(path, mine, "t")
    assert load_swarm_file(path).testnet_pid == os.getpid()
