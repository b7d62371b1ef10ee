"""Helpers to run the ``volunteer`` command as a user would: subprocesses, exit codes, output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def run_cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m volunteer ARGS`` with a private config dir (no test touches the user's)."""
    return subprocess.run(
        [sys.executable, "-m", "volunteer", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


def run_example_in_own_group(args: list[str], *, limit: float, env: dict | None = None) -> tuple[int, str]:
    """``python examples/ARGS`` in its own process group (its exit status and output); whatever
    happens, every process it started is killed when it ends."""
    proc = subprocess.Popen([sys.executable, str(HERE.parents[1] / "examples" / args[0]), *args[1:]],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE.parents[1],
                            start_new_session=True, env={**os.environ, **(env or {})})
    try:
        out, _ = proc.communicate(timeout=limit)
        return proc.returncode, out
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the example, and every process it started that is left
        except ProcessLookupError:
            pass
        proc.wait()


@pytest.fixture
def cli_env(tmp_path) -> dict:
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
            "XDG_RUNTIME_DIR": str(tmp_path / "run"), "VOLUNTEER_IDENTITY": str(tmp_path / "config" / "volunteer" / "identity.key")}


@pytest.fixture
def node():
    """A bare node in a subprocess; yields its full multiaddr."""
    proc = subprocess.Popen([sys.executable, str(HERE / "serve_node.py")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY "), f"node did not start: {line!r}"
        yield line.split()[1]
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
