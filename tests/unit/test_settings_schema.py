"""One schema for a setting wherever it is set: config.toml's [join] and [limits], a swarm
file's [experts] and the flag of the same name accept and refuse the same values, in the same
words, and mean the same thing ("5MiB" is 5 MiB/s in the file as on the command line)."""

from __future__ import annotations

import argparse

import pytest

from volunteer.cli.joincmd import _setting
from volunteer.errors import VolunteerError
from volunteer.swarmfile import load_limits, load_swarm_file, read_config

# (setting, TOML value, the flag's text): each refused alike
BAD = [
    ("max_gpu_memory", "2", "2", "expected a fraction in (0, 1]"),
    ("max_gpu_memory", "0", "0", "expected a fraction in (0, 1]"),
    ("max_experts", "-3", "-3", "a whole number of 0 or more"),
    ("hidden_dim", "0", "0", "a whole number of 1 or more"),
    ("max_batch", "-1", "-1", "a whole number of 1 or more"),
    ("cpu_threads", "0", "0", "a whole number of 1 or more"),
    ("max_upload", '"lots"', "lots", "not a size"),
    ("max_upload", "-5", "-5", "above 0"),
    ("max_upload", '"0.0"', "0", "expected bytes per second above 0 (e.g. 5MiB)"),
    ("max_ram", '"lots"', "lots", "not a size: 'lots' (e.g. 8GiB)"),
    ("max_ram", "-5", "-5", "expected bytes above 0 (e.g. 8GiB)"),  # a negative number, not text that is no size
    ("max_ram", '"0.5"', "0.5", "expected bytes above 0"),  # half a byte is no byte
    ("share_tracebacks", '"some"', "some", "expected one of full, redacted, none"),
]
GOOD = [
    ("max_gpu_memory", "0.5", "0.5", 0.5),
    ("max_experts", "0", "0", 0),
    ("hidden_dim", "16", "16", 16),
    ("cpu_threads", "2", "2", 2),
    ("max_upload", '"5MiB"', "5MiB", 5 * 2**20),
    ("max_upload", "1000", "1000", 1000.0),
    ("max_upload", '"1.5k"', "1.5k", 1500.0),
    ("max_ram", '"8GiB"', "8GiB", 8 << 30),
    ("max_ram", "4096", "4096", 4096),
    ("max_ram", '"1e9"', "1e9", 10**9),
]


def _flag(key: str, text: str):
    return _setting(key)(text)


@pytest.mark.parametrize("key, toml, text, words", BAD)
def test_a_value_refused_in_the_file_is_refused_as_a_flag_in_the_same_words(tmp_path, key, toml, text, words):
    config = tmp_path / "config.toml"
    config.write_text(f"[join]\n{key} = {toml}\n")
    with pytest.raises(VolunteerError, match=f"join.{key}: ") as in_file:
        read_config(config)
    assert words in str(in_file.value)
    swarm = tmp_path / "s.toml"
    swarm.write_text(f'name = "s"\n[experts]\n{key} = {toml}\n')
    with pytest.raises(VolunteerError, match=f"experts.{key}: "):
        load_swarm_file(swarm)
    with pytest.raises(argparse.ArgumentTypeError) as as_flag:
        _flag(key, text)
    assert words in str(as_flag.value)
    assert str(in_file.value).split(f"join.{key}: ", 1)[1].split(", got")[0] == str(as_flag.value).split(", got")[0]


@pytest.mark.parametrize("key, toml, text, value", GOOD)
def test_a_value_taken_in_the_file_means_what_the_flag_means(tmp_path, key, toml, text, value):
    config = tmp_path / "config.toml"
    config.write_text(f"[join]\n{key} = {toml}\n")
    assert read_config(config)["join"][key] == value == _flag(key, text)


@pytest.mark.parametrize("key", ["peer_memory", "system_connections", "max_request_bytes_total"])
def test_limits_are_above_zero(tmp_path, key):
    config = tmp_path / "config.toml"
    config.write_text(f"[limits]\n{key} = -1\n")
    with pytest.raises(VolunteerError, match=f"limits.{key}: expected a number of 1 or more, got -1"):
        load_limits(config)
    config.write_text(f"[limits]\n{key} = 4096\n")
    assert load_limits(config) == {key: 4096}


def test_a_device_is_checked_alike_in_the_file_and_the_flag(tmp_path):
    from volunteer.settings import JOIN_CHECKS

    config = tmp_path / "config.toml"
    config.write_text('[join]\ndevice = "gpu"\n')
    with pytest.raises(VolunteerError) as in_file:
        read_config(config)
    with pytest.raises(ValueError) as as_flag:  # the flag's value goes through the same check in build_options
        JOIN_CHECKS["device"]("gpu")
    assert str(in_file.value).endswith(f"join.device: {as_flag.value}")


def test_the_schema_is_its_own_module_that_the_swarm_file_reads():
    """The schema (keys, types and value checks) lives apart from the swarm file's format: the
    swarm file and config.toml are checked with the same objects, and a table checked with the
    schema alone refuses in the same words."""
    import volunteer.settings as settings
    import volunteer.swarmfile as swarmfile

    assert swarmfile.SWARM_KEYS["experts"] is settings.JOIN_SETTINGS
    assert swarmfile.SwarmFileError is settings.SwarmFileError
    assert "swarmfile" not in {name.split(".")[-1] for name in vars(settings) if not name.startswith("_")}
    table = {"max_upload": "5MiB", "max_gpu_memory": 2}
    with pytest.raises(settings.SwarmFileError, match=r"config file x: join.max_gpu_memory: expected a fraction"):
        settings.validate_table({"join": table}, settings.CONFIG_KEYS, where="config file x", checks=settings.CONFIG_CHECKS)
    assert table["max_upload"] == 5 * 2**20  # checked values are replaced by the ones to use
