"""NAT traversal scenarios on the namespace rig: volunteers behind home NATs reach each other
through our public relay (issue: reach volunteers behind NAT)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.nat.rig import read_line

pytestmark = pytest.mark.nat
PY = sys.executable
RUNNER = ["-m", "tests.nat.node_runner"]


def start_relay(rig, node="relay"):
    proc = rig.popen(node, [PY, "-m", "volunteer", "relay", "--no-dashboard", "--identity", f"/tmp/{rig.tag}-{node}.key",
                            "--listen", "/ip4/0.0.0.0/tcp/4001", "--announce", f"/ip4/{rig.addr(node)}/tcp/4001"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert read_line(proc, timeout=20).startswith("relay ")
    addr = read_line(proc, timeout=20).split()[-1]
    return proc, addr


def start_listener(rig, node, relay_addr):
    proc = rig.popen(node, [PY, *RUNNER, "listen-via-relay", relay_addr], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = read_line(proc, timeout=30)
    assert line.startswith("READY "), line
    return proc, line.split()[1]


def echo_from(rig, node, target, size=2_000_000, *extra):
    result = rig.run(node, [PY, *RUNNER, "echo-client", target, "--size", str(size), *extra], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_nat_a_reaches_nat_b_through_our_relay(easy_rig):
    rig = easy_rig
    _, relay_addr = start_relay(rig)
    _, circuit_addr = start_listener(rig, "peer_b", relay_addr)
    assert "/p2p-circuit/p2p/" in circuit_addr and rig.addr("relay") in circuit_addr
    report = echo_from(rig, "peer_a", circuit_addr)
    assert report["ok"] and report["bytes"] == 2_000_000
    assert report["path"].startswith("relayed via")
    # `volunteer ping` through the relayed address shows the path it took.
    result = rig.run("peer_a", [PY, "-m", "volunteer", "ping", "--identity", f"/tmp/{rig.tag}-a.key",
                                "-c", "2", "-i", "0.2", circuit_addr], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "path=relayed via" in result.stdout


def test_symmetric_nat_side_still_works_through_the_relay(symmetric_rig):
    rig = symmetric_rig
    _, relay_addr = start_relay(rig)
    _, circuit_addr = start_listener(rig, "peer_b", relay_addr)
    report = echo_from(rig, "peer_a", circuit_addr)  # peer_a is behind the symmetric NAT
    assert report["ok"] and report["path"].startswith("relayed via")
    _, circuit_a = start_listener(rig, "peer_a", relay_addr)
    assert echo_from(rig, "peer_b", circuit_a)["ok"]


def test_double_nat_side_reaches_and_is_reached(double_nat_rig):
    rig = double_nat_rig
    _, relay_addr = start_relay(rig)
    _, circuit_a = start_listener(rig, "peer_a", relay_addr)  # behind CGNAT + home NAT
    assert echo_from(rig, "peer_b", circuit_a)["ok"]
    _, circuit_b = start_listener(rig, "peer_b", relay_addr)
    assert echo_from(rig, "peer_a", circuit_b)["ok"]


def test_relay_restart_brings_reservations_back_and_direct_survives(easy_rig):
    rig = easy_rig
    relay, relay_addr = start_relay(rig)
    listener, circuit_addr = start_listener(rig, "peer_b", relay_addr)
    holder = rig.popen("peer_a", [PY, *RUNNER, "hold-direct", circuit_addr], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert read_line(holder, timeout=30).strip() == "DIRECT"
    holder.stdin.write("echo\n")
    holder.stdin.flush()
    before = json.loads(read_line(holder, timeout=15))
    assert before["ok"] and before["path"] == "hole-punched"
    relay.send_signal(signal.SIGTERM)
    relay.wait(timeout=15)
    relay, relay_addr_again = start_relay(rig)  # same identity file, same address
    assert relay_addr_again == relay_addr
    line = read_line(listener, timeout=60)
    assert line.startswith("RESERVED "), line  # the reservation came back by itself
    holder.stdin.write("echo\n")
    holder.stdin.flush()
    after = json.loads(read_line(holder, timeout=15))
    assert after == before  # the same direct connection, untouched by the relay's restart
    assert echo_from(rig, "peer_a", circuit_addr, 100_000)["ok"]  # and the relay path works again


def relay_bytes(rig) -> int:
    """The relay's bytes-relayed counter, read from its /metrics inside its namespace."""
    code = "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())"
    from prometheus_client.parser import text_string_to_metric_families

    text = rig.run("relay", [PY, "-c", code], timeout=20).stdout
    families = {family.name: family for family in text_string_to_metric_families(text)}
    return int(sum(sample.value for sample in families["volunteer_relay_bytes"].samples))  # both directions


def start_relay_with_metrics(rig):
    proc = rig.popen("relay", [PY, "-m", "volunteer", "relay", "--no-dashboard", "--identity", f"/tmp/{rig.tag}-relay.key",
                               "--listen", "/ip4/0.0.0.0/tcp/4001", "--announce", f"/ip4/{rig.addr('relay')}/tcp/4001",
                               "--metrics", "127.0.0.1:9100"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert read_line(proc, timeout=20).startswith("relay ")
    return proc, read_line(proc, timeout=20).split()[-1]


def test_pair_ends_on_a_direct_hole_punched_connection(easy_rig):
    rig = easy_rig
    _, relay_addr = start_relay_with_metrics(rig)
    _, circuit_addr = start_listener(rig, "peer_b", relay_addr)
    before = relay_bytes(rig)
    report = echo_from(rig, "peer_a", circuit_addr, 4_000_000, "--listen", "/ip4/0.0.0.0/tcp/4001", "--wait-direct", "10")
    assert report["ok"] and report["first_path"].startswith("relayed via")
    assert report["path"] == "hole-punched", report
    # The bytes went direct: the relay carried only the handshake and the DCUtR exchange.
    assert relay_bytes(rig) - before < 200_000
    # `volunteer ping` through the relayed address shows the switch from relayed to direct.
    result = rig.run("peer_a", [PY, "-m", "volunteer", "ping", "--identity", f"/tmp/{rig.tag}-a.key", "--listen",
                                "/ip4/0.0.0.0/tcp/4002", "-c", "8", "-i", "0.5", circuit_addr], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    paths = [line.split("path=")[1].split(" transport=")[0] for line in result.stdout.splitlines() if "path=" in line]
    assert paths[0].startswith("relayed via") and paths[-1] == "hole-punched", result.stdout
    assert result.stdout.splitlines()[-3].endswith("transport=tcp"), result.stdout  # the punched path, over TCP


def test_symmetric_nat_stays_relayed_and_works(symmetric_rig):
    rig = symmetric_rig
    _, relay_addr = start_relay(rig)
    _, circuit_addr = start_listener(rig, "peer_b", relay_addr)
    report = echo_from(rig, "peer_a", circuit_addr, 1_000_000, "--listen", "/ip4/0.0.0.0/tcp/4001", "--wait-direct", "8")
    assert report["ok"] and report["path"].startswith("relayed via"), report


def test_autonat_tells_natted_from_public(easy_rig):
    rig = easy_rig
    _, relay_addr = start_relay(rig)
    behind = json.loads(rig.run("peer_a", [PY, *RUNNER, "autonat", relay_addr], timeout=60).stdout.splitlines()[-1])
    assert behind["reachability"] == "private", json.dumps(behind)
    assert behind["observed_addrs"] == [f"/ip4/{rig.public_addr_of('peer_a')}/tcp/4001"]
    public = json.loads(rig.run("public", [PY, *RUNNER, "autonat", relay_addr], timeout=60).stdout.splitlines()[-1])
    assert public["reachability"] == "public", public


def test_our_natted_peers_use_a_go_libp2p_relay(easy_rig):
    """Scenario 6: a go-libp2p relay (p2pd v0.32) instead of ours."""
    import os

    from tests.interop.conftest import interop_dir

    p2pd = interop_dir() / "bin" / "p2pd"
    if not p2pd.exists():
        if os.environ.get("VOLUNTEER_REQUIRE_INTEROP") == "1":
            pytest.fail("p2pd is not installed: run bash .ci/install_peers.sh")
        pytest.skip("p2pd is not installed: run bash .ci/install_peers.sh")
    rig = easy_rig
    control = f"/tmp/{rig.tag}-p2pd.sock"
    proc = rig.popen("relay", [str(p2pd), "-hostAddrs", "/ip4/0.0.0.0/tcp/4001", "-listen", f"/unix{control}",
                               "-quic=false", "-b=false", "-natPortMap=false", "-relayService", "-forceReachabilityPublic"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    read_line(proc, timeout=20)  # Control socket: …
    peer_id = read_line(proc, timeout=20).split(": ", 1)[1]
    relay_addr = f"/ip4/{rig.addr('relay')}/tcp/4001/p2p/{peer_id}"
    _, circuit_addr = start_listener(rig, "peer_b", relay_addr)
    # go-libp2p's relay limits a circuit to 128 KiB per direction (its default): stay below.
    report = echo_from(rig, "peer_a", circuit_addr, 60_000)
    assert report["ok"] and report["path"].startswith("relayed via"), report
    # And the pair still punches through to a direct connection, coordinated over go's relay.
    report = echo_from(rig, "peer_a", circuit_addr, 1_000_000, "--listen", "/ip4/0.0.0.0/tcp/4001", "--wait-direct", "10")
    assert report["ok"] and report["path"] == "hole-punched", report


def doctor_from(rig, node, peers):
    result = rig.run(node, [PY, "-m", "volunteer", "doctor", "--identity", f"/tmp/{rig.tag}-{node}-doctor.key",
                            "--listen", "/ip4/0.0.0.0/tcp/4001", "--json", *peers], timeout=90)
    return {c["name"].split()[0]: c for c in json.loads(result.stdout)}


def test_doctor_tells_nat_mapping_and_reachability(easy_rig):
    rig = easy_rig
    _, relay_addr = start_relay(rig)
    _, second = start_relay(rig, "public")
    checks = doctor_from(rig, "peer_a", [relay_addr, second])
    assert checks["reachability"]["status"] == "WARN" and "private" in checks["reachability"]["detail"]
    assert checks["NAT"]["status"] == "OK" and "endpoint-independent" in checks["NAT"]["detail"]
    assert checks["relay"]["status"] == "OK" and checks["perf"]["status"] == "OK"


def test_doctor_spots_a_symmetric_nat(symmetric_rig):
    rig = symmetric_rig
    _, relay_addr = start_relay(rig)
    _, second = start_relay(rig, "public")
    checks = doctor_from(rig, "peer_a", [relay_addr, second])
    assert checks["NAT"]["status"] == "WARN" and "symmetric" in checks["NAT"]["detail"], checks
