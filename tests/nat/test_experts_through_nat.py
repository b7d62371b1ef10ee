"""A trainer behind one NAT of the rig trains through experts hosted by a `volunteer join`
daemon behind another: AutoNAT finds the volunteer private, it reserves a relay slot and
declares its experts with relayed addresses; the trainer finds them in the DHT (the relay is
the bootstrap peer), calls them through the relay, and hole punching moves the calls direct."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.nat.rig import read_line
from tests.nat.test_scenarios import start_relay

pytestmark = pytest.mark.nat
PY = sys.executable


def test_trainer_behind_nat_trains_through_experts_behind_another_nat(easy_rig, tmp_path):
    rig = easy_rig
    _, relay_addr = start_relay(rig)  # serves the DHT of swarm "default"
    swarm_file = tmp_path / "swarm.toml"
    swarm_file.write_text(f'name = "rig"\nid = "default"\nrelays = ["{relay_addr}"]\n')
    volunteer = rig.popen("peer_b", [PY, "-m", "volunteer", "join", str(swarm_file), "--yes", "--no-dashboard",
                                     "--experts", "ffn:expert.[0:2].[0:2]", "--hidden-dim", "16", "--device", "cpu",
                                     "--listen", "/ip4/0.0.0.0/tcp/4001", "--identity", str(tmp_path / "b.key"),
                                     "--control", str(tmp_path / "b.sock"), "--checkpoints", str(tmp_path / "ckpt")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    while not any("control socket" in line for line in lines):
        lines.append(read_line(volunteer, timeout=60))
    result = rig.run("peer_a", [PY, "-m", "tests.nat.trainer_runner", str(swarm_file)], timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["ok"], report
    assert report["losses"][-1] < report["losses"][0]
    assert report["path"] == "hole-punched", report  # calls started relayed; DCUtR moved them direct
    # The daemon reserves its relay slot at once, before AutoNAT's verdict (a dial-back to a NATed
    # port takes its whole 10 s timeout to fail): the trainer may finish first, so wait for it.
    deadline = time.monotonic() + 60
    while True:
        status = rig.run("peer_b", [PY, "-m", "volunteer", "status", "--json", "--control", str(tmp_path / "b.sock")], timeout=30)
        snapshot = json.loads(status.stdout)
        if snapshot["reachability"]["status"] != "unknown" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert snapshot["reachability"]["status"] == "private"
    assert any(r["reserved"] for r in snapshot["reachability"]["relays"])
    assert sum(e["requests"] for e in snapshot["experts"]) > 0
    volunteer.terminate()
    volunteer.wait(timeout=30)
