"""The static checks CI runs with the test suite: the layering contract (import-linter) and the
types of all of ``volunteer`` and ``relay`` (mypy), both configured in pyproject.toml. Each runs a tool over the
whole package (tens of seconds): they are marked slow and live outside the unit floor.

Both tools come with the ``test`` extra and are looked up next to the interpreter running the
tests, so CI, which installs the extras into its venv, always runs them; a venv without them skips
with the reason said.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
TOOL_TIMEOUT = 300  # a cold mypy run over volunteer and relay takes about a minute; this only stops a hang


def _tool(name: str) -> Path:
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.skip(f"{name} is not installed next to {sys.executable} (pip install -e '.[test]' installs it)")
    return path


def _run(*argv: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=ROOT, capture_output=True, text=True, timeout=TOOL_TIMEOUT)


def test_layering_contract_holds():
    # net < dht, swarmfile < experts < swarm, node root, relay < cli: no import runs up a floor;
    # the experts' volunteer side never loads the trainer side
    result = _run(_tool("lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_library_type_checks(tmp_path):
    # a fresh cache, as CI's clean clone has: some verdicts (an untyped attribute, a shadowed
    # name) depend on the order mypy meets modules, which an incremental cache changes
    result = _run(_tool("mypy"), "--cache-dir", tmp_path / "mypy-cache")
    assert result.returncode == 0, result.stdout + result.stderr


def test_views_are_checked_against_the_status_they_read(tmp_path):
    # every snapshot() is a TypedDict: a view that reads a key its producer never writes (or
    # reads a count as text) is a type error, not a KeyError on a donor's dashboard
    view = tmp_path / "stale_view.py"
    view.write_text(
        "from volunteer.dht.node import DHTNode\n"
        "from volunteer.experts.server import ExpertServer\n"
        "from volunteer.net.nat.manager import NatManager\n"
        "from volunteer.replicas.manager import ReplicaManager\n"
        "from relay.metrics import snapshot\n"
        "from relay.service import HopService\n"
        "def stale(dht: DHTNode, server: ExpertServer, nat: NatManager, replicas: ReplicaManager, hop: HopService) -> None:\n"
        "    dht.snapshot()['routing_table_size']\n"
        "    server.snapshot()['upload']['bytes']\n"
        "    nat.snapshot()['evidence']['servers']\n"
        "    replicas.snapshot()['transfers']['sent']\n"
        "    snapshot(hop)['circuits_open']\n"
        "    name: str = dht.snapshot()['records']\n"
    )
    result = _run(_tool("mypy"), "--cache-dir", tmp_path / "mypy-cache", "--follow-imports", "silent", view)
    reported = [line for line in result.stdout.splitlines() if line.startswith(str(view)) and ": error:" in line]
    assert len(reported) == 6, result.stdout + result.stderr
    assert sum("typeddict-item" in line for line in reported) == 5 and any("assignment" in line for line in reported)
