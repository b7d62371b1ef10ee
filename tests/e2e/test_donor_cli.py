"""The donor's client as a donor runs it: consent first, each run-when policy through the CLI
with a fake battery, fake busy programs and a fake clock (``VOLUNTEER_PROBE=fake:FILE``), a real
CPU burner, fold / pause / finish, an expert that keeps failing, and the history across restarts."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import JoinProcess, run_cli
from .test_join_cli import relay  # noqa: F401  (fixture: a relay subprocess and its swarm file)

EXPERTS = ["--experts", "ffn:expert.[0:2]", "--hidden-dim", "8", "--device", "cpu"]


class Joined(JoinProcess):
    """``volunteer join SWARM ARGS`` on loopback with its own control socket, and the commands
    a donor runs against it."""

    def __init__(self, swarm: str, *args: str, env: dict, control: Path) -> None:
        self.control = str(control)
        self.env = env
        super().__init__(["join", swarm, "--listen", "/ip4/127.0.0.1/tcp/0", "--no-dashboard", "--control", self.control,
                          *args], env=env)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return run_cli(*args, "--control", self.control, env=self.env)

    def status(self) -> dict:
        result = self.cli("status", "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def wait_for(self, predicate, what: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if predicate(status):
                return status
            assert time.monotonic() < deadline, f"{what}: last status {status.get('state_text')!r}"
            time.sleep(0.3)


def listed(swarm: str, env: dict) -> list[str]:
    result = run_cli("experts", swarm, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return sorted({row["uid"] for row in json.loads(result.stdout)})


def wait_listed(swarm: str, env: dict, want: list[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while listed(swarm, env) != want:
        assert time.monotonic() < deadline, f"experts listed: {listed(swarm, env)}, wanted {want}"
        time.sleep(0.3)


def call_experts(swarm: str, uids: list[str], times: int = 1) -> list[str]:
    """A trainer's forward and backward on each expert; the errors it got, as text."""
    import torch

    from volunteer import RemoteExpert, Swarm
    from volunteer.errors import VolunteerError

    errors = []
    with Swarm.join(swarm) as joined:
        found = joined.get_experts(uids)
        for uid in uids:
            host = found[uid][0]
            expert = RemoteExpert(uid, host.peer, joined, addrs=host.addrs)
            for _ in range(times):
                x = torch.randn(3, 8, requires_grad=True)
                try:
                    expert(x).sum().backward()
                except VolunteerError as exc:
                    errors.append(str(exc))
    return errors


@pytest.fixture
def env(cli_env):
    return {**os.environ, **cli_env, "PYTHONUNBUFFERED": "1"}


def test_bad_policy_settings_are_one_line(tmp_path, env):
    from .test_join_cli import one_line_error, unreachable_swarm

    swarm = unreachable_swarm(tmp_path)
    for args, words in ((["--when-idle", "-1"], "when_idle is minutes"), (["--compute-hours", "22-07"], "is not HH:MM-HH:MM"),
                        (["--max-other-load", "150"], "max_other_load is a percentage"),
                        (["--daily-transfer", "lots"], "daily_transfer:"), (["--failure-limit", "0"], "--failure-limit"),
                        (["--gpus", "7"], "no CUDA device cuda:7")):
        assert words in one_line_error(run_cli("join", swarm, *args, env=env)), args
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = one_line_error(run_cli("join", swarm, "--yes", "--web", f"127.0.0.1:{port}", env=env))
        assert line.endswith(f"cannot serve the web page on 127.0.0.1:{port}: the port is in use; choose another --web HOST:PORT")
    config = tmp_path / "config.toml"
    config.write_text('[run]\ncompute_hours = "25:00-01:00"\n')
    assert "does not exist" in one_line_error(run_cli("join", swarm, "--config", str(config), env=env))
    config.write_text("[run]\nconsent = 1\n")
    assert "run.consent has the wrong type" in one_line_error(run_cli("join", swarm, "--config", str(config), env=env))
    assert run_cli("join", swarm, "--gpus", "x", env=env).returncode == 2


@pytest.mark.slow
def test_first_join_asks_for_consent_and_fold_starts_and_remembers(relay, tmp_path, env):  # noqa: F811
    daemon = Joined(relay, *EXPERTS, env=env, control=tmp_path / "run" / "d.sock")
    try:
        text = "".join(daemon.lines)
        assert "first start on this machine: volunteer will use" in text
        for part in ("device:        cpu", "CPU threads:", "upload:        no cap", "port mapping:  off", "when:          pause on battery"):
            assert part in text
        assert "not joining yet: nothing is joined, downloaded or computed until you run `volunteer fold` (or join with --yes)" in text
        status = daemon.status()
        assert status["paused"] and status["state_text"] == "paused until you agree to donate: `volunteer fold` starts"
        time.sleep(2)
        assert listed(relay, env) == []  # nothing was ever announced
        result = daemon.cli("fold")
        assert result.returncode == 0 and "folding" in result.stdout
        wait_listed(relay, env, ["expert.0", "expert.1"])
        config = (tmp_path / "config" / "volunteer" / "config.toml").read_text()
        assert "[run]" in config and "consent = true" in config
        assert [e["origin"] for e in daemon.status()["conduct"]["events"]][:2] == ["consent", "cli"]
    finally:
        assert daemon.stop() == 0
    again = Joined(relay, *EXPERTS, env=env, control=tmp_path / "run" / "d.sock")
    try:
        assert not any("first start" in line for line in again.lines)  # consent was remembered
        assert again.status()["state"] == "folding"
    finally:
        again.stop()


@pytest.mark.slow
def test_a_pause_outlives_a_restart_until_fold(relay, tmp_path, env):  # noqa: F811
    control = tmp_path / "d.sock"
    daemon = Joined(relay, *EXPERTS, "--yes", env=env, control=control)
    try:
        wait_listed(relay, env, ["expert.0", "expert.1"])
        assert daemon.cli("pause").returncode == 0
        wait_listed(relay, env, [])
    finally:
        assert daemon.stop() == 0
    again = Joined(relay, *EXPERTS, "--yes", env=env, control=control)  # a reboot, say
    try:
        status = again.status()
        assert status["paused"] and status["state_text"] == "paused by you (cli): `volunteer fold` resumes", status
        assert "kept from before the restart" in status["conduct"]["events"][0]["reason"]
        time.sleep(2)
        assert listed(relay, env) == []  # the restarted daemon announced nothing
        assert again.cli("fold").returncode == 0
        wait_listed(relay, env, ["expert.0", "expert.1"])
    finally:
        assert again.stop() == 0
    third = Joined(relay, *EXPERTS, "--yes", env=env, control=control)  # fold is kept too: it serves
    try:
        assert third.status()["state"] == "folding"
    finally:
        third.stop()


@pytest.mark.slow
def test_every_policy_through_the_cli_with_a_fake_machine(relay, tmp_path, env):  # noqa: F811
    machine = tmp_path / "machine.json"
    noon = datetime.datetime(2030, 6, 1, 12, 0).isoformat()

    def looks(**state) -> None:
        machine.write_text(json.dumps({"now": noon, "on_battery": False, "input_idle_s": 600, **state}))

    looks()
    env = {**env, "VOLUNTEER_PROBE": f"fake:{machine}"}
    daemon = Joined(relay, *EXPERTS, "--yes", "--pause-while", "steam", "--max-other-load", "50", "--when-idle", "0.05",
                    "--compute-hours", "08:00-20:00", "--pause-on-gpu-use", "--policy-period", "0.2", env=env,
                    control=tmp_path / "d.sock")
    try:
        wait_listed(relay, env, ["expert.0", "expert.1"])
        steps = [
            (dict(on_battery=True), "paused: on battery"),
            (dict(programs=["steam"]), "paused: steam is running"),
            (dict(gpu_users=["blender"]), "paused: blender uses the GPU"),
            (dict(other_load=80), "paused: other programs use 80 % CPU (limit 50 %)"),
            (dict(other_load=5, input_idle_s=1), "waiting: computer in use, resumes after 3 s"),
            (dict(now=datetime.datetime(2030, 6, 1, 23, 0).isoformat()), "paused: outside computing hours, resumes at 08:00"),
        ]
        for state, text in steps:
            looks(**state)
            status = daemon.wait_for(lambda s: s["state_text"] == text, text)
            assert status["paused"] and status["policy"]["verdict"]["text"] == text
            wait_listed(relay, env, [])  # withdrawn at once, not at the records' expiry
        looks()
        daemon.wait_for(lambda s: s["state"] == "folding" and not s["paused"], "folding again")
        wait_listed(relay, env, ["expert.0", "expert.1"])
        events = daemon.status()["conduct"]["events"]
        reasons = [e["reason"] for e in events if e["origin"] == "policy"]
        assert "on battery" in reasons and "steam is running" in reasons and reasons[-1] == "run-when policies allow it"
        rendered = daemon.cli("status").stdout  # the dashboard says why too
        assert "running · swarm e2e" in rendered
        log = "".join(daemon.lines)
    finally:
        assert daemon.stop() == 0
    log += "".join(daemon.lines)
    assert "paused (policy): on battery" in log and "resume (policy): run-when policies allow it" in log


@pytest.mark.slow
def test_the_daily_transfer_cap(relay, tmp_path, env):  # noqa: F811
    daemon = Joined(relay, "--yes", "--daily-transfer", "1KiB", "--policy-period", "0.2", env=env, control=tmp_path / "d.sock")
    try:
        status = daemon.wait_for(lambda s: s["policy"]["verdict"]["code"] == "transfer", "the cap")
        assert status["state_text"] == "paused: daily transfer cap of 1.0 KiB reached, resumes at midnight"
        assert status["policy"]["observed"]["transferred_today"] >= 1024
    finally:
        daemon.stop()


BURNER = """
import os, sys, time
flag, deadline = sys.argv[1], time.monotonic() + 120
while time.monotonic() < deadline and not os.path.exists(flag + ".stop"):
    if os.path.exists(flag):
        end = time.monotonic() + 0.2
        while time.monotonic() < end:
            pass
    else:
        time.sleep(0.05)
"""


@pytest.mark.slow
def test_a_real_cpu_burner_pauses_and_resumes_the_daemon(relay, tmp_path, env):  # noqa: F811
    """psutil measures a real busy process. On a machine shared with other work, the probe is
    pointed at the burner's process tree (``tree:PID``) so others' load cannot decide."""
    flag = tmp_path / "burn"
    burner = subprocess.Popen([sys.executable, "-c", BURNER, str(flag)])
    daemon = None
    try:
        env = {**env, "VOLUNTEER_PROBE": f"tree:{burner.pid}"}
        daemon = Joined(relay, *EXPERTS, "--yes", "--max-other-load", "5", "--policy-period", "0.5", env=env,
                        control=tmp_path / "d.sock")
        daemon.wait_for(lambda s: s["state"] == "folding" and s["policy"]["observed"] is not None
                        and s["policy"]["observed"]["other_load"] is not None, "an idle burner")
        flag.touch()
        status = daemon.wait_for(lambda s: s["policy"]["verdict"]["code"] == "load", "the burner's load")
        assert status["paused"] and status["state_text"].startswith("paused: other programs use")
        wait_listed(relay, env, [])
        flag.unlink()
        daemon.wait_for(lambda s: s["state"] == "folding" and not s["paused"], "the burner idle again")
        wait_listed(relay, env, ["expert.0", "expert.1"])
    finally:
        (tmp_path / "burn.stop").touch()
        if daemon is not None:
            daemon.stop()
        burner.wait(timeout=30)


FAILING = """
import torch
import volunteer.experts as e

@e.register_expert("test_failing")
class Failing(torch.nn.Module):
    def __init__(self, hidden_dim):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_dim, hidden_dim)
    def forward(self, x):
        if x.abs().sum() > 0:  # the dummy forward of zeros at start-up passes
            raise RuntimeError("this expert is broken")
        return self.linear(x)
"""


@pytest.mark.slow
def test_an_expert_that_keeps_failing_is_set_aside_until_fold(relay, tmp_path, env):  # noqa: F811
    expert_file = tmp_path / "failing.py"
    expert_file.write_text(FAILING)
    daemon = Joined(relay, "--yes", "--experts", "test_failing:expert.[0:1]", "--hidden-dim", "8", "--device", "cpu",
                    "--expert-file", str(expert_file), "--failure-limit", "3", env=env, control=tmp_path / "d.sock")
    try:
        wait_listed(relay, env, ["expert.0"])
        errors = call_experts(relay, ["expert.0"], times=3)
        assert len(errors) == 3 and all("this expert is broken" in e for e in errors)
        status = daemon.wait_for(lambda s: s["state"] == "paused", "the expert set aside")
        assert "failed 3 calls in a row" in status["self_care"]["set_aside"]["expert.0"]
        assert status["state_text"].startswith("paused: all 1 expert(s) failed 3 calls in a row")
        wait_listed(relay, env, [])
        assert daemon.cli("fold").returncode == 0
        wait_listed(relay, env, ["expert.0"])
    finally:
        daemon.stop()
    assert any("set aside (withdrawn, calls refused)" in line for line in daemon.lines)


@pytest.mark.slow
def test_history_survives_restarts_and_prints_by_day_and_month(relay, tmp_path, env):  # noqa: F811
    machine = tmp_path / "machine.json"
    today = datetime.datetime.now().replace(hour=12, minute=0, second=0, microsecond=0)
    days = [today - datetime.timedelta(days=40), today - datetime.timedelta(days=2)]  # a fake clock, in the past
    for day, calls in zip(days, (2, 3)):
        machine.write_text(json.dumps({"now": day.isoformat(), "running": True, "on_battery": False}))
        daemon = Joined(relay, *EXPERTS, "--yes", env={**env, "VOLUNTEER_PROBE": f"fake:{machine}"},
                        control=tmp_path / "d.sock")
        try:
            wait_listed(relay, env, ["expert.0", "expert.1"])
            assert call_experts(relay, ["expert.0"], times=calls) == []
        finally:
            assert daemon.stop() == 0
    result = run_cli("history", "--json", env=env)
    assert result.returncode == 0, result.stderr
    history = json.loads(result.stdout)
    by_day = {d["day"]: d for d in history["days"]}
    first, second = (day.strftime("%Y-%m-%d") for day in days)
    assert by_day[first]["calls"] == 4 and by_day[second]["calls"] == 6  # a forward and a backward each
    assert by_day[first]["trainers"] == 1 and by_day[first]["cpu_s"] > 0 and by_day[first]["uptime_s"] > 0
    months: dict[str, int] = {}
    for day, calls in zip(days, (4, 6)):
        months[day.strftime("%Y-%m")] = months.get(day.strftime("%Y-%m"), 0) + calls
    assert {m["month"]: m["calls"] for m in history["months"]} == months
    text = run_cli("history", "--days", "60", env=env).stdout
    assert first in text and second in text and days[0].strftime("%Y-%m") + " " in text and "in all: 10 calls" in text
    assert second in run_cli("history", env=env).stdout and first not in run_cli("history", "--days", "10", env=env).stdout
