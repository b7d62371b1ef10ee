"""Real libp2p peers for interop tests: py-libp2p 0.8.1 and go-libp2p's p2pd.

Installed by `bash .ci/install_peers.sh` into `.interop/` (or $VOLUNTEER_INTEROP_DIR). Without
them the tests skip, saying how to install them, except in CI, where
VOLUNTEER_REQUIRE_INTEROP=1 turns a missing peer into a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = Path(__file__).parent / "peers"


def interop_dir() -> Path:
    return Path(os.environ.get("VOLUNTEER_INTEROP_DIR", ROOT / ".interop"))


def _missing(what: str) -> None:
    message = f"{what} is not installed: run bash .ci/install_peers.sh"
    if os.environ.get("VOLUNTEER_REQUIRE_INTEROP") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def pylibp2p_python() -> Path:
    python = interop_dir() / "pylibp2p" / "bin" / "python"
    if not python.exists():
        _missing("py-libp2p 0.8.1")
    return python


@pytest.fixture(scope="session")
def p2pd_binary() -> Path:
    binary = interop_dir() / "bin" / "p2pd"
    if not binary.exists():
        _missing("p2pd (go-libp2p)")
    return binary


def read_ready(proc: subprocess.Popen, timeout: float = 30) -> str:
    """Wait for the `READY <addr>` line of a peer process (bounded)."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    if not selector.select(timeout):
        raise TimeoutError("peer did not become ready")
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        raise RuntimeError(f"peer failed to start: {line!r}")
    return line.split()[1]


def stop(proc: subprocess.Popen) -> None:
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.terminate()
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe:
            pipe.close()


def _serving_pylibp2p(python: Path, *flags: str):
    proc = subprocess.Popen([str(python), str(PEERS / "pylibp2p_peer.py"), *flags, "serve"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield read_ready(proc)
    finally:
        stop(proc)


@pytest.fixture
def pylibp2p_server(pylibp2p_python):
    """A py-libp2p host serving /echo/1.0.0, ping, identify and PerfService; yields its multiaddr."""
    yield from _serving_pylibp2p(pylibp2p_python)


@pytest.fixture
def pylibp2p_quic_server(pylibp2p_python):
    """The same py-libp2p host on QUIC v1 (py-libp2p's aioquic transport); yields its multiaddr."""
    yield from _serving_pylibp2p(pylibp2p_python, "--quic")


def run_pylibp2p(python: Path, *args: str, timeout: float = 60) -> dict:
    """Run one py-libp2p client command; returns its JSON report."""
    import json

    result = subprocess.run([str(python), str(PEERS / "pylibp2p_peer.py"), *args],
                            capture_output=True, text=True, timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report from py-libp2p: {result.stderr[-2000:]}"
    return json.loads(lines[-1])


class P2pd:
    """A running p2pd: .peer_id (str), .addrs (list of str), .control (socket path)."""

    def __init__(self, binary: Path, *, quic: bool = False) -> None:
        self.tmp = tempfile.mkdtemp(prefix="p2pd-")
        self.control = os.path.join(self.tmp, "p2pd.sock")
        # Loopback only; no bootstrap, DHT, NAT port mapping or relay discovery; TCP, or QUIC v1 alone.
        transport = ["-hostAddrs", "/ip4/127.0.0.1/udp/0/quic-v1"] if quic else ["-hostAddrs", "/ip4/127.0.0.1/tcp/0", "-quic=false"]
        self.proc = subprocess.Popen(
            [str(binary), *transport, "-listen", f"/unix{self.control}",
             "-b=false", "-natPortMap=false", "-autoRelay=false", "-relayDiscovery=false"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        lines = [self.proc.stdout.readline().strip() for _ in range(4)]
        assert lines[1].startswith("Peer ID: "), lines
        self.peer_id = lines[1].split(": ", 1)[1]
        self.addrs = [lines[3]]
        while True:  # any further listen addresses
            import select

            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if not ready:
                break
            line = self.proc.stdout.readline().strip()
            if not line.startswith("/"):
                break
            self.addrs.append(line)

    def full_addr(self) -> str:
        return f"{self.addrs[0]}/p2p/{self.peer_id}"

    def close(self) -> None:
        stop(self.proc)
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def p2pd(p2pd_binary):
    daemon = P2pd(p2pd_binary)
    try:
        yield daemon
    finally:
        daemon.close()


@pytest.fixture
def p2pd_quic(p2pd_binary):
    """A p2pd listening on /udp/…/quic-v1 only."""
    daemon = P2pd(p2pd_binary, quic=True)
    try:
        yield daemon
    finally:
        daemon.close()
