"""The machine seam (probes), consent recorded in config.toml, and the GPU choice."""

from __future__ import annotations

import json
import os
import time
import tomllib
from types import SimpleNamespace

import pytest

from volunteer.cli import consent
from volunteer.cli.donorflags import choose_gpus
from volunteer.donor.probes import CpuSample, FakeProbe, ProbeError, PsutilProbe, other_load, parse_hid_idle, parse_logind_idle, probe_from_env
from volunteer.errors import VolunteerError


def test_other_load_from_two_samples():
    assert other_load(None, CpuSample(10, 5, 2)) is None
    assert other_load(CpuSample(10, 5, 2), CpuSample(12, 7, 2)) == 50.0
    assert other_load(CpuSample(10, 5, 2), CpuSample(12, 4, 2)) == 0.0  # a counter that went down
    assert other_load(CpuSample(10, 5, 2), CpuSample(10, 9, 2)) is None


def test_platform_idle_parsers():
    assert parse_logind_idle("IdleHint=no\nIdleSinceHint=0\n", 100.0) == 0.0
    assert parse_logind_idle("IdleHint=yes\nIdleSinceHint=40000000\n", 100.0) == 60.0
    assert parse_logind_idle("", 100.0) is None
    assert parse_hid_idle('    | |   "HIDIdleTime" = 2500000000\n') == 2.5
    assert parse_hid_idle("nothing") is None


def test_fake_probe_reads_its_file_each_time(tmp_path):
    path = tmp_path / "probe.json"
    probe = FakeProbe(path)
    assert probe.on_battery() is None and probe.programs() == frozenset()  # no file: nothing known
    path.write_text(json.dumps({"now": "2030-01-10T23:30:00", "on_battery": True, "other_load": 80,
                                "programs": ["Steam"], "input_idle_s": 12}))
    assert probe.on_battery() is True and probe.other_load() == 80.0 and probe.programs() == {"steam"}
    assert probe.input_idle_s() == 12.0 and probe.cpu() is None
    import datetime

    assert probe.now() == datetime.datetime(2030, 1, 10, 23, 30).timestamp()
    path.write_text(json.dumps({"now": 1000.0, "running": True}))
    os.utime(path, (time.time() - 30, time.time() - 30))
    assert 1029 < probe.now() < 1100  # a running fake clock: 30 s since the file was written
    path.write_text("[1, 2")
    assert probe.on_battery() is None


def test_probe_from_env():
    assert isinstance(probe_from_env({}), PsutilProbe)
    assert isinstance(probe_from_env({"VOLUNTEER_PROBE": "fake:/tmp/x.json"}), FakeProbe)
    assert probe_from_env({"VOLUNTEER_PROBE": "tree:1"})._tree == 1
    with pytest.raises(ProbeError):
        probe_from_env({"VOLUNTEER_PROBE": "tree:me"})


def test_psutil_probe_on_this_machine():
    probe = PsutilProbe()
    first = probe.cpu()
    assert first is not None and first.cpus >= 1 and first.others >= 0
    assert any(name.startswith(("python", "pytest")) for name in probe.programs())  # this very process runs
    assert probe.on_battery() in (None, True, False)


def test_consent_is_recorded_without_losing_the_donors_file(tmp_path):
    fresh = tmp_path / "a" / "config.toml"
    assert consent.record(fresh)
    assert tomllib.loads(fresh.read_text())["run"]["consent"] is True
    mine = tmp_path / "config.toml"
    mine.write_text('# my settings\n[join]\ndevice = "cpu"  # no GPU here\n\n[run]\non_battery = false\n')
    consent.record(mine)
    text = mine.read_text()
    assert "# my settings" in text and "# no GPU here" in text
    assert tomllib.loads(text)["run"] == {"consent": True, "on_battery": False}
    refused = tmp_path / "refused.toml"
    refused.write_text("[run]\nconsent = false\n")
    consent.record(refused)
    assert tomllib.loads(refused.read_text())["run"]["consent"] is True  # replaced, not a duplicate key


def test_consent_summary_and_question():
    from volunteer.net.stack import StackOptions

    node = SimpleNamespace(device="auto", max_gpu_memory=0.5, max_upload=5 * 2**20, uids=[], place=True, max_experts=4,
                           cpu_threads=2, stack=StackOptions(port_mapping=False))
    lines = consent.summary_lines(node, policy_lines=["pause on battery"], web="http://127.0.0.1:7396/")
    text = "\n".join(lines)
    for part in ("device:", "at most 50% of the GPU's memory", "CPU threads:   2 of", "5.0 MiB/s", "port mapping:  off",
                 "up to 4", "pause on battery", "web page:"):
        assert part in text
    import io

    out = io.StringIO()
    assert consent.ask(lines, read=lambda prompt: "y", out=out) and "Start" not in out.getvalue()
    assert not consent.ask(lines, read=lambda prompt: "", out=io.StringIO())

    def eof(prompt):
        raise EOFError

    assert not consent.ask(lines, read=eof, out=io.StringIO())


def test_choose_gpus():
    assert choose_gpus(3, None, []) == [0, 1, 2]
    assert choose_gpus(3, [2, 0, 2], [0]) == [2]
    with pytest.raises(VolunteerError, match="no CUDA device cuda:3"):
        choose_gpus(2, [3], [])
    with pytest.raises(VolunteerError, match="leave no GPU"):
        choose_gpus(1, None, [0])


def test_gpu_use_is_unknown_without_nvml_or_nvidia_smi(monkeypatch, tmp_path):
    """No nvidia-ml-py and no nvidia-smi: the probe says "unknown" (None) and never raises."""
    import importlib
    import json

    real_import = importlib.import_module

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_pynvml)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi on it
    probe = PsutilProbe()
    assert probe.gpu_users() is None and probe.gpu_users() is None
    fake = tmp_path / "machine.json"
    fake.write_text(json.dumps({"gpu_users": ["Blender"]}))
    assert FakeProbe(fake).gpu_users() == frozenset({"blender"})
    fake.write_text("{}")
    assert FakeProbe(fake).gpu_users() is None


def test_gpu_use_from_nvidia_smi_names_other_programs(monkeypatch, tmp_path):
    """A stand-in nvidia-smi lists our own pid and another's: only the other program is named."""
    import importlib
    import os
    import subprocess
    import sys

    real_import = importlib.import_module
    monkeypatch.setattr(importlib, "import_module",
                        lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name)) if name == "pynvml" else real_import(name, *a, **k))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        smi = tmp_path / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho {os.getpid()}\necho {other.pid}\n")
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", str(tmp_path))
        users = PsutilProbe().gpu_users()
        assert users is not None and any(name.startswith("python") for name in users), users
        smi.write_text(f"#!/bin/sh\necho {os.getpid()}\n")  # only ourselves on the GPU: nobody else
        assert PsutilProbe().gpu_users() == frozenset()
    finally:
        other.kill()
        other.wait()


def test_the_consent_summary_says_join_maps_ports_by_default(monkeypatch):
    from volunteer.net.stack import StackOptions

    monkeypatch.delenv("VOLUNTEER_NO_PORT_MAPPING", raising=False)
    node = SimpleNamespace(device="cpu", max_gpu_memory=None, max_upload=None, uids=[], place=False, max_experts=None,
                           cpu_threads=None, stack=None)  # join's default: the stack's own, which maps ports
    text = "\n".join(consent.summary_lines(node, policy_lines=["always"], web=None))
    assert "port mapping:  on" in text and "no router changes" not in text
    node.stack = StackOptions(port_mapping=False)  # --no-port-mapping
    assert "port mapping:  off" in "\n".join(consent.summary_lines(node, policy_lines=["always"], web=None))


def test_a_read_only_config_dir_is_one_line_for_the_web_token(tmp_path, monkeypatch):
    """The token cannot be written (a read-only config directory; as root, modes do not refuse,
    so the refusal is the kernel's answer stood in for): one VolunteerError line, no traceback."""
    from volunteer.cli.webpage import load_or_create_token

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(VolunteerError, match=r"--web needs its token file .*web-token: Permission denied"):
        load_or_create_token(tmp_path / "config" / "web-token")
    (tmp_path / "dir" / "web-token").mkdir(parents=True)
    monkeypatch.undo()
    with pytest.raises(VolunteerError, match="Is a directory"):
        load_or_create_token(tmp_path / "dir" / "web-token")
