"""Every error a user can cause ends in one line on stderr and exit 1 (2 for a bad flag), never a
traceback: each mistake a newcomer made, run through the CLI as they ran it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from .conftest import run_cli

PEER = "12D3KooWGzh7Q6Tq4tJ9s8tH2s3j8mu1KJrjGqsTqQk4t6m3Dp1m"


def _one_line(result: subprocess.CompletedProcess, code: int) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line]
    assert result.returncode == code, result.stderr
    return lines[-1] if code == 2 else (lines[0] if len(lines) == 1 else pytest.fail(result.stderr))


@pytest.fixture
def solo(tmp_path):
    swarm = tmp_path / "solo.toml"
    swarm.write_text('name = "solo"\n')  # a new swarm: nothing to reach, so only the mistake fails
    (tmp_path / "afile").write_text("")
    return str(swarm)


def test_each_mistake_is_one_line(tmp_path, cli_env, solo):
    join = ["join", "--yes", solo, "--no-dashboard", "--listen", "/ip4/127.0.0.1/tcp/0"]
    afile = tmp_path / "afile"
    cases = [
        ([*join, "--device", "mps", "--experts", "ffn:e.[0:2]"], 1, "no MPS device here"),
        ([*join, "--control", str(afile / "d.sock")], 1, f"cannot use control socket {afile / 'd.sock'}: {afile} is not a directory"),
        ([*join, "--control", "/proc/volunteer/d.sock"], 1, "cannot use control socket /proc/volunteer/d.sock"),
        ([*join, "--identity", str(afile / "id.key")], 1, f"cannot create identity key file {afile / 'id.key'}: {afile} is not a directory"),
        ([*join, "--identity", "/proc/volunteer/id.key"], 1, "cannot create identity key file /proc/volunteer/id.key"),
        (["id", "--identity", "/proc/volunteer/id.key"], 1, "cannot create identity key file"),
        ([*join, "--swarm-id", "a/b"], 2, "bad swarm id 'a/b'"),
        (["join", "--yes", f"/ip4/127.0.0.1/tcp/9/p2p/{PEER}", "--swarm-id", "a b/../c"], 2, "bad swarm id"),
        (["relay", "--swarm", "a b/../c", "--listen", "/ip4/127.0.0.1/tcp/0", "--no-dashboard"], 2, "bad swarm id 'a b/../c'"),
        (["ping", "-W", "-1", f"/ip4/127.0.0.1/tcp/9/p2p/{PEER}"], 2, "expected seconds more than 0, got '-1'"),
        (["ping", "-i", "0", f"/ip4/127.0.0.1/tcp/9/p2p/{PEER}"], 2, "expected seconds more than 0"),
    ]
    for args, code, expected in cases:
        line = _one_line(run_cli(*args, env=cli_env), code)
        assert expected in line, (args, line)


# The module whose import ends just before `volunteer`'s entry point takes over Ctrl-C: until
# then a Ctrl-C is the interpreter's own (its startup prints a traceback before any of our code
# runs), so a test may only send one after it.
ENTRY_MODULE = "volunteer.cli.entry"


class _ImportWatch:
    """Reads a ``python -X importtime`` child's stderr: ``entered`` is set once the entry module
    finished importing; the other lines are kept (the import timings are left out)."""

    def __init__(self, stream) -> None:
        self.entered = threading.Event()
        self.lines: list[str] = []
        self._stream = stream
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            if line.startswith("import time:"):
                if line.rstrip().endswith(f"| {ENTRY_MODULE}"):
                    self.entered.set()
                continue
            self.lines.append(line)
        self.entered.set()  # ended before it: let the test see why

    def stderr(self, timeout: float) -> str:
        """What the child wrote besides import timings, once it closed its stderr."""
        self._thread.join(timeout)
        self._stream.close()
        return "".join(self.lines)


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.02, 0.1, 0.3, 0.6])
def test_ctrl_c_while_starting_is_no_traceback(tmp_path, cli_env, solo, after):
    """Ctrl-C ``after`` seconds into our code's start (the entry module imported, the command's
    own modules still importing or the node starting): no traceback, one line at most. Timed
    from the child's own word (``-X importtime``), not from a guess at the interpreter's start,
    which a loaded machine overran."""

    def as_a_terminal() -> None:  # a shell's background job would ignore SIGINT; a terminal's does not
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "volunteer", "join", "--yes", solo,
                             "--no-dashboard", "--listen", "/ip4/127.0.0.1/tcp/0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **cli_env}, preexec_fn=as_a_terminal)
    watch = _ImportWatch(proc.stderr)
    try:
        assert watch.entered.wait(60), "the entry module was never imported"
        time.sleep(after)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"join did not end on Ctrl-C:\n{watch.stderr(10)}")
    err = watch.stderr(10)
    assert "Traceback" not in err, err
    assert proc.returncode in (0, 130, -signal.SIGINT), err  # left gracefully, interrupted, or not yet Python
    assert len([line for line in err.splitlines() if line]) <= 1, err


def test_a_wrong_peer_id_is_said_alike_by_ping_join_and_doctor(tmp_path, cli_env, node):
    """The address answers, but as another peer: every command names both ids whole, in the same words."""
    from volunteer.net.identity import KeyPair

    wrong = KeyPair.generate().peer_id
    where, real = node.split("/p2p/", 1)
    line = _one_line(run_cli("ping", "-c", "1", f"{where}/p2p/{wrong}", env=cli_env), 1)
    said = f"answered as peer {real}, not {wrong} as its address says: the address's /p2p/ id is wrong"
    assert said in line, line
    swarm = tmp_path / "wrong.toml"
    swarm.write_text(f'name = "wrong"\nrelays = ["{where}/p2p/{wrong}"]\n')
    line = _one_line(run_cli("join", "--yes", str(swarm), "--no-dashboard", "--listen", "/ip4/127.0.0.1/tcp/0", env=cli_env), 1)
    assert said in line and line.endswith(f"(fix swarm file {swarm})"), line
    doctor = run_cli("doctor", str(swarm), "--no-port-mapping", "--perf-size", "0", "--listen", "/ip4/127.0.0.1/tcp/0",
                     env=cli_env)
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stderr
    reach = next((row for row in doctor.stdout.splitlines() if row.startswith("FAIL  reach")), doctor.stdout)
    assert said in reach and f"its relay {where.split('/')[2]}:" in reach, reach
    assert reach.endswith(f"(fix swarm file {swarm})"), reach
