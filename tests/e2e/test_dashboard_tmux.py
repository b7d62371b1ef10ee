"""The live dashboard as a user sees it: ``volunteer join`` in a real terminal (tmux) at 80x24,
then paused and resumed (``volunteer pause`` / ``resume``: the donor's own actions, which the
header says and the Log panel does not count as warnings), then resized to 120x40 and 160x48.
Every capture must hold exactly one copy of the dashboard's header: no log line torn into the
view, no stale frame left above it after a resize."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from .conftest import run_cli
from .test_join_cli import relay  # noqa: F401 - the fixture: a relay and a swarm file naming it

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

HEADER = "running · swarm e2e"
PAUSED = "PAUSED (paused by you (cli)"  # the donor's own actions are notices: the header says them, not the Log


class Tmux:
    """A private tmux server (its own socket) holding one session; ``close`` kills it all."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-f", "/dev/null", "-S", self.socket, *args], check=True,
                              capture_output=True, text=True, timeout=10).stdout

    def capture(self) -> str:
        return self("capture-pane", "-p", "-t", "dash")

    def wait_for(self, *needles: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.capture()
            if all(needle in screen for needle in needles):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"not on screen after {timeout} s: {needles}\n{screen}")

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=10)


def test_dashboard_in_a_terminal_with_warnings_and_resizes(relay, tmp_path, cli_env):  # noqa: F811
    control = str(tmp_path / "daemon.sock")
    env = {**cli_env, "PYTHONPATH": os.getcwd(), "VOLUNTEER_NO_MDNS": "1", "TERM": "xterm-256color"}
    script = tmp_path / "join.sh"
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items())
    script.write_text(f"{exports}exec {shlex.quote(sys.executable)} -m volunteer join --yes {shlex.quote(relay)} "
                      f"--listen /ip4/127.0.0.1/tcp/0 --control {shlex.quote(control)}\n")
    tmux = Tmux(str(tmp_path / "tmux.sock"))
    try:
        tmux("new-session", "-d", "-s", "dash", "-x", "80", "-y", "24", f"bash {shlex.quote(str(script))}")
        tmux("set-option", "-t", "dash", "window-size", "manual")
        tmux.wait_for(HEADER, "Log")
        for command, state in (("pause", PAUSED), ("resume", HEADER)):
            result = run_cli(command, "--control", control, env=cli_env)
            assert result.returncode == 0, result.stderr
            tmux.wait_for(state, timeout=30)
        for width, height in ((80, 24), (120, 40), (160, 48)):
            tmux("resize-window", "-t", "dash", "-x", str(width), "-y", str(height))
            time.sleep(1.5)  # a few frames at the new size (the view redraws twice a second)
            screen = tmux.wait_for(HEADER, timeout=30)
            lines = screen.rstrip("\n").splitlines()
            assert len(lines) <= height and max(map(len, lines)) <= width, screen
            assert screen.count(HEADER) == 1, screen
            assert screen.count("Identity") == 1 and screen.count("Connections") == 1, screen
            assert PAUSED not in screen, screen
            assert "WARN" not in screen and "Traceback" not in screen, screen  # a pause is no warning, no raw log line underneath
    finally:
        tmux.close()
