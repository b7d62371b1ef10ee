"""How long a NATed `volunteer join` takes to become reachable ("sees within seconds
whether they are reachable"). The figure is printed, never asserted (no timing assertions):
what is asserted is how it became reachable, and that the snapshot carries the same figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.nat.rig import read_line

from .test_scenarios import start_relay

pytestmark = pytest.mark.nat
PY = sys.executable


def join_in(rig, node: str, swarm_file: str, tag: str) -> subprocess.Popen:
    env = {**os.environ, "VOLUNTEER_CONFIG_DIR": f"/tmp/{tag}-cfg", "VOLUNTEER_STATE_DIR": f"/tmp/{tag}-state",
           "VOLUNTEER_RUNTIME_DIR": f"/tmp/{tag}-run", "PYTHONUNBUFFERED": "1"}
    return rig.popen(node, [PY, "-m", "volunteer", "join", swarm_file, "--yes", "--no-dashboard", "--no-mdns",
                            "--listen", "/ip4/0.0.0.0/tcp/4001"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)


def test_a_natted_daemon_reports_how_soon_it_is_reachable(easy_rig, tmp_path):
    rig = easy_rig
    _, relay_addr = start_relay(rig)
    swarm_file = tmp_path / "rig.toml"
    swarm_file.write_text(f'name = "rig"\nrelays = ["{relay_addr}"]\n')
    tag = f"{rig.tag}-reach"
    spawned = time.monotonic()
    proc = join_in(rig, "peer_a", str(swarm_file), tag)
    lines = []
    joined_at = None
    while not any("reachable after" in line for line in lines):
        line = read_line(proc, timeout=60).strip()
        assert line, f"join ended early: {lines}"
        lines.append(line)
        if line.startswith("joined swarm"):
            joined_at = time.monotonic()
    reached_at = time.monotonic()
    reachable = next(line for line in lines if "reachable after" in line)
    assert "reserved on relay" in reachable, lines  # behind a NAT: reachable through the relay
    status = rig.run("peer_a", [PY, "-m", "volunteer", "status", "--json", "--control", f"/tmp/{tag}-run/daemon.sock"],
                     timeout=30)
    snapshot = json.loads(status.stdout)
    assert snapshot["reachable_after_s"] is not None and snapshot["reachable_how"].startswith("reserved on relay")
    print(f"\nNAT rig (easy NAT): reachable after {snapshot['reachable_after_s']:.2f} s from the daemon's start; "
          f"{reached_at - joined_at:.2f} s after 'joined swarm'; {reached_at - spawned:.2f} s from process spawn "
          f"(imports included)")


def test_a_daemon_behind_a_forwarded_port_is_public_from_its_first_autonat_round(easy_rig, tmp_path):
    """The NAT manager starts before the DHT has connected anywhere; its first round must still
    name the address the AutoNAT server sees (the forwarded port), not only the LAN address
    behind it: otherwise the first verdict is private and the next round is minutes away."""
    rig = easy_rig
    for proto in ("tcp", "udp"):
        rig.forward_port("nat_a", 4001, "peer_a", proto=proto)
    _, relay_addr = start_relay(rig)
    swarm_file = tmp_path / "rig.toml"
    swarm_file.write_text(f'name = "rig"\nrelays = ["{relay_addr}"]\n')
    tag = f"{rig.tag}-fwd"
    proc = join_in(rig, "peer_a", str(swarm_file), tag)
    try:
        while not read_line(proc, timeout=60).startswith("joined swarm"):
            pass
        view: dict = {}
        deadline = time.monotonic() + 60  # the second AutoNAT round would come 120 s after the first
        while time.monotonic() < deadline:
            status = rig.run("peer_a", [PY, "-m", "volunteer", "status", "--json", "--control",
                                        f"/tmp/{tag}-run/daemon.sock"], timeout=30)
            view = json.loads(status.stdout).get("reachability") or {}
            if view.get("status") == "public":
                break
            time.sleep(0.5)
        assert view.get("status") == "public", view
        # the first round decided: one that named only the LAN address got no dial-back (or a
        # failed one), and public came a round later, if ever
        assert view["evidence"]["unreachable"] == 0 and view["evidence"]["rounds"] == 1, view
    finally:
        proc.terminate()
        proc.wait(timeout=30)
