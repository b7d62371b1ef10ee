"""Hole punching over TCP and QUIC at once on the rig: every pair of easy-NAT homes, a home whose
router answers unsolicited SYNs with a RST included, ends direct on the first attempt; two
symmetric NATs stay relayed and work."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.nat import rig as rigmod
from tests.nat.rig import read_line

pytestmark = pytest.mark.nat
PY = sys.executable
RUNNER = ["-m", "tests.nat.node_runner"]
BOTH = ["--listen", "/ip4/0.0.0.0/tcp/4001", "--listen", "/ip4/0.0.0.0/udp/4001/quic-v1"]


def start_relay(rig):
    """Our relay on TCP and QUIC (peers learn their QUIC address from it)."""
    ip = rig.addr("relay")
    proc = rig.popen("relay", [PY, "-m", "volunteer", "relay", "--no-dashboard", "--identity", f"/tmp/{rig.tag}-relay.key",
                               "--listen", "/ip4/0.0.0.0/tcp/4001", "--listen", "/ip4/0.0.0.0/udp/4001/quic-v1",
                               "--announce", f"/ip4/{ip}/tcp/4001", "--announce", f"/ip4/{ip}/udp/4001/quic-v1"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert read_line(proc, timeout=20).startswith("relay ")
    return read_line(proc, timeout=20).split()[-1]


def start_listener(rig, node, relay_addr, listen=BOTH):
    proc = rig.popen(node, [PY, *RUNNER, "listen-via-relay", relay_addr, *listen], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = read_line(proc, timeout=30)
    assert line.startswith("READY "), line
    return line.split()[1]


def punch(rig, dialer, target, listen=BOTH, wait=10):
    result = rig.run(dialer, [PY, *RUNNER, "echo-client", target, "--size", "1000000", *listen, "--wait-direct", str(wait)],
                     timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_direct_on_first_attempt(report):
    assert report["ok"] and report["first_path"].startswith("relayed via"), report
    assert not report["path"].startswith("relayed"), report
    finished = [o for o in report["outcomes"] if o["success"]]
    assert finished and finished[-1]["attempts"] == 1, report
    assert report["punch"]["attempts"].get(report["transport"]), report


@pytest.mark.slow
@pytest.mark.parametrize("spec, dialer, listener", [
    (rigmod.easy_pair, "peer_a", "peer_b"),
    (rigmod.rst_pair, "peer_a", "peer_b"),   # the RST home dials
    (rigmod.rst_pair, "peer_b", "peer_a"),   # the RST home is dialled
    (lambda: rigmod.rst_pair(both=True), "peer_a", "peer_b"),
    (rigmod.shifted_pair, "peer_a", "peer_b"),   # the home that never keeps its ports dials
    (rigmod.shifted_pair, "peer_b", "peer_a"),   # ... is dialled
], ids=["easy-easy", "rst-dials", "rst-dialled", "rst-rst", "shifted-dials", "shifted-dialled"])
def test_easy_homes_end_direct_on_the_first_attempt(make_rig, spec, dialer, listener):
    rig = make_rig(spec())
    relay_addr = start_relay(rig)
    target = start_listener(rig, listener, relay_addr)
    report = punch(rig, dialer, target)
    assert_direct_on_first_attempt(report)


@pytest.mark.slow
def test_quic_alone_punches_where_tcp_is_refused(make_rig):
    rig = make_rig(rigmod.rst_pair(both=True))
    relay_addr = start_relay(rig)
    quic_only = ["--listen", "/ip4/0.0.0.0/udp/4001/quic-v1"]
    target = start_listener(rig, "peer_b", relay_addr, quic_only)
    report = punch(rig, "peer_a", target, quic_only)
    assert_direct_on_first_attempt(report)
    assert report["transport"] == "quic"


@pytest.mark.slow
def test_two_symmetric_homes_stay_relayed_over_both_transports_and_work(make_rig):
    rig = make_rig(rigmod.symmetric_pair(both=True))
    relay_addr = start_relay(rig)
    target = start_listener(rig, "peer_b", relay_addr)
    report = punch(rig, "peer_a", target, wait=40)
    assert report["ok"] and report["path"].startswith("relayed via"), report
    # every attempt the spec allows ran on the one DCUtR stream, each bounded by the round trip
    # and a birthday probe (3 of them end well inside the 40 s we waited), over both transports,
    # and each failed: both sides are hard (or, seen by the relay alone, unsure: they open sockets
    # and spray too, and a spray finds no way into a symmetric NAT either)
    assert report["punch"]["direct"] == 0 and report["punch"]["failed"] == 1, report
    assert report["outcomes"][-1]["attempts"] == 3, report
    assert report["punch"]["attempts"] == {"quic": {"failed": 3}, "tcp": {"failed": 3}}, report
    assert report["birthday"] in ({"hard": 3}, {"unsure": 3}), report


@pytest.mark.slow
@pytest.mark.parametrize("dialer, listener", [("peer_a", "peer_b"), ("peer_b", "peer_a")], ids=["rst-dials", "rst-dialled"])
def test_tcp_alone_survives_a_router_that_resets_the_first_syn(make_rig, dialer, listener):
    """A punched SYN that reaches the RST home's router before its host's own SYN left is refused;
    it is sent again 50 ms later, within the same attempt, and the punch ends direct."""
    rig = make_rig(rigmod.rst_pair())
    relay_addr = start_relay(rig)
    tcp_only = ["--listen", "/ip4/0.0.0.0/tcp/4001"]
    target = start_listener(rig, listener, relay_addr, tcp_only)
    report = punch(rig, dialer, target, tcp_only)
    assert_direct_on_first_attempt(report)
    assert report["transport"] == "tcp"
