"""A TCP path that loses packets moves to QUIC with repairs (net/lossy_paths.py), for real: a
namespace of its own whose loopback drops 3 % of the TCP packets to one Host's port (nftables,
at random), two Hosts in it, calls through the stream pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nat import netns

pytestmark = pytest.mark.nat

NODE = Path(__file__).with_name("lossy_path_node.py")
TCP_PORT, UDP_PORT = 4101, 4102


@pytest.fixture
def lossy_loopback(nat_ok) -> Iterator[str]:
    """A namespace whose loopback drops 3 % of TCP packets to TCP_PORT; deleted afterwards."""
    ns = f"vr{os.getpid()}l-lossy"
    netns._cmd(["ip", "netns", "add", ns])
    try:
        # a home line's packets: loopback's 64 KiB MTU (and its segmentation offload) would carry
        # a whole call in one or two packets
        netns._cmd(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "mtu", "1500", "gso_max_segs", "1", "up"])
        # dropped on arrival: a drop on the way out is an error the sending TCP sees and retries
        # at once, not a loss it must detect
        netns._cmd(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=(
            "table ip lossy {\n chain arriving {\n type filter hook input priority 0;\n"
            f" tcp dport {TCP_PORT} numgen random mod 100 < 3 drop\n }}\n}}\n"))
        yield ns
    finally:
        netns._delete_ns(ns)


@pytest.mark.slow
def test_calls_move_from_a_lossy_tcp_path_to_quic_with_repairs(lossy_loopback):
    done = subprocess.run(["ip", "netns", "exec", lossy_loopback, sys.executable, str(NODE), str(TCP_PORT), str(UDP_PORT)],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["tcp_loses"] and report["tcp_loss"] > 0.005  # the kernel saw the drops as retransmissions
    assert report["moved"] == 1 and report["quic_repaired"]
    assert report["best"] == "quic"
    paths = report["paths"]
    assert paths[0] == "tcp" and paths[-1] == "quic"
    # once moved, calls stay on QUIC (the pool's TCP streams were closed, not reused)
    assert paths[paths.index("quic"):] == ["quic"] * (len(paths) - paths.index("quic"))
