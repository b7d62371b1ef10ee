"""The NAT rig proves its own behaviour with plain Python sockets.

Mapping (EIM vs symmetric), silent drop of unsolicited inbound, TCP simultaneous open through
two NATs (what DCUtR will do), double NAT, link delay, and cleanup in every way a run can end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.nat import rig as rigmod
from tests.nat.rig import Host, Link, Spec, read_line

pytestmark = pytest.mark.nat

OBS_PORT = 7000
LINE_TIMEOUT = 10.0

# Answers every TCP connection with "ip port" of the address it came from, and logs it.
OBSERVER = textwrap.dedent(r"""
    import select, socket, sys, time
    ports = [int(p) for p in sys.argv[1:]]
    ls = []
    for p in ports:
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", p)); s.listen(64); ls.append(s)
    print("ready", flush=True)
    end = time.monotonic() + 60
    for _ in range(1000):
        left = end - time.monotonic()
        if left <= 0:
            break
        for s in select.select(ls, [], [], left)[0]:
            c, (ip, port) = s.accept()
            c.sendall(f"{ip} {port}\n".encode()); c.close()
            print("seen", ip, port, flush=True)
""")

# From ONE local port (SO_REUSEADDR+SO_REUSEPORT), connect to each "ip:port", print what the
# far side saw, one "ip port" line per destination; sockets stay open until the end.
PROBE = textwrap.dedent(r"""
    import socket, sys
    lport, dsts, keep = int(sys.argv[1]), sys.argv[2:], []
    for d in dsts:
        ip, port = d.split(":")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("0.0.0.0", lport)); s.settimeout(5); s.connect((ip, int(port)))
        print(s.makefile().readline().strip(), flush=True); keep.append(s)
""")

# Connect and report how it ended: "connected", "refused" or "timeout".
KNOCK = textwrap.dedent(r"""
    import socket, sys
    s = socket.socket(); s.settimeout(float(sys.argv[3]))
    try:
        s.connect((sys.argv[1], int(sys.argv[2]))); print("connected")
    except ConnectionRefusedError:
        print("refused")
    except (TimeoutError, socket.timeout):
        print("timeout")
""")

# Hole punch: learn our external ip:port from the observer, print it, read the other peer's
# from stdin, then connect() to it from the same local port, a bounded number of times.
PUNCH = textwrap.dedent(r"""
    import socket, sys, time
    name, obs, lport = sys.argv[1], sys.argv[2], int(sys.argv[3])
    attempts, timeout = int(sys.argv[4]), float(sys.argv[5])
    def sock():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("0.0.0.0", lport)); return s
    o = sock(); o.settimeout(5); ip, port = obs.split(":"); o.connect((ip, int(port)))
    print("observed", o.makefile().readline().strip(), flush=True)
    rip, rport = sys.stdin.readline().split()
    for i in range(attempts):
        s = sock(); s.settimeout(timeout)
        try:
            s.connect((rip, int(rport)))
            s.sendall(f"hello from {name}\n".encode())
            print("ok", i, s.makefile().readline().strip(), flush=True)
            sys.exit(0)
        except OSError as e:
            print("attempt", i, type(e).__name__, file=sys.stderr, flush=True)
            s.close(); time.sleep(0.2)
    print("gave up", flush=True)
""")


def py(code: str, *args: object) -> list[str]:
    """argv running a script with this interpreter."""
    return [sys.executable, "-c", code, *map(str, args)]


def observer(rig: rigmod.Rig, node: str = "observer", ports=(OBS_PORT,)) -> subprocess.Popen:
    """Start the observer server in ``node`` and wait until it listens."""
    p = rig.popen(node, py(OBSERVER, *ports), stdout=subprocess.PIPE)
    assert read_line(p, LINE_TIMEOUT).strip() == "ready"
    return p


def probe(rig: rigmod.Rig, node: str, lport: int, *dsts: str) -> list[tuple[str, int]]:
    """External (ip, port) of ``node`` as seen by each destination, from one local port."""
    out = rig.run(node, py(PROBE, lport, *dsts), check=True).stdout.split("\n")
    return [(ip, int(port)) for ip, port in (x.split() for x in out if x)]


def test_peer_reaches_public_server_as_router_wan(easy_rig):
    srv = observer(easy_rig, "relay")
    relay = easy_rig.addr("relay")
    [(ip, port)] = probe(easy_rig, "peer_a", 40001, f"{relay}:{OBS_PORT}")
    assert ip == easy_rig.public_addr_of("peer_a") == "203.0.113.101"
    assert read_line(srv, LINE_TIMEOUT).split() == ["seen", ip, str(port)]


# Try to reach an address outside the rig's ranges; print the errno (0 if it connected).
ESCAPE = textwrap.dedent(r"""
    import socket, sys
    s = socket.socket(); s.settimeout(3)
    print(s.connect_ex((sys.argv[1], 53)))
""")


def test_nothing_outside_the_rig_is_routable(easy_rig):
    for node in ("peer_a", "nat_a", "relay"):
        out = easy_rig.run(node, py(ESCAPE, "8.8.8.8"), check=True).stdout.strip()
        assert out == "101", (node, out)  # ENETUNREACH


@pytest.mark.parametrize("spec", [
    Spec(hosts=(Host("x", addrs=("8.8.8.8",)),)),
    Spec(routers=(rigmod.Router("r", "10.0.0.0/24"),)),
    Spec(routers=(rigmod.Router("r", "192.0.2.0/26", wan="1.1.1.1"),)),
    Spec(routers=(rigmod.Router("r", "192.0.2.0/26", nat="full-cone"),)),
    Spec(hosts=(Host("x", addrs=("203.0.113.5",)), Host("x", addrs=("203.0.113.6",)))),
    Spec(hosts=(Host("Bad-Name", addrs=("203.0.113.5",)),)),
    Spec(hosts=(Host("x", addrs=("203.0.113.5",), link=Link(delay_ms=-1)),)),
])
def test_spec_outside_the_rules_is_refused(spec):
    with pytest.raises(ValueError):
        rigmod.Rig(spec)


def test_eim_keeps_one_external_port_for_all_destinations(easy_rig):
    observer(easy_rig, ports=(OBS_PORT, OBS_PORT + 1))
    o1, o2 = easy_rig.addrs("observer")
    seen = probe(easy_rig, "peer_a", 40002, f"{o1}:{OBS_PORT}", f"{o2}:{OBS_PORT}",
                 f"{o1}:{OBS_PORT + 1}")
    assert {ip for ip, _ in seen} == {"203.0.113.101"}
    assert len({port for _, port in seen}) == 1
    assert seen[0][1] == 40002  # masquerade preserved the source port here


def test_symmetric_maps_each_destination_to_a_new_port(symmetric_rig):
    observer(symmetric_rig, ports=(OBS_PORT, OBS_PORT + 1))
    o1, o2 = symmetric_rig.addrs("observer")
    seen = probe(symmetric_rig, "peer_a", 40003, f"{o1}:{OBS_PORT}", f"{o2}:{OBS_PORT}",
                 f"{o1}:{OBS_PORT + 1}")
    assert {ip for ip, _ in seen} == {"203.0.113.101"}
    # random ports: all three colliding has odds of ~1e-9; any two differing proves it
    assert len({port for _, port in seen}) > 1


def test_unsolicited_inbound_is_dropped_silently(easy_rig):
    listener = easy_rig.popen("peer_a", py(OBSERVER, 4001), stdout=subprocess.PIPE)
    assert read_line(listener, LINE_TIMEOUT).strip() == "ready"
    wan = easy_rig.addr("nat_a")
    before = easy_rig.dropped("nat_a")
    for port in (4001, 22):  # the peer's listening port, and one the router might serve
        out = easy_rig.run("public", py(KNOCK, wan, port, 2.0), check=True).stdout.strip()
        assert out == "timeout"  # not "refused": no RST came back
    assert easy_rig.dropped("nat_a") - before >= 2
    assert easy_rig.ping("public", wan, count=1) == []  # the router does not answer either


# Send one UDP datagram and wait for any answer: "answered" or "timeout".
UDP_KNOCK = textwrap.dedent(r"""
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(float(sys.argv[3]))
    s.sendto(b"knock", (sys.argv[1], int(sys.argv[2])))
    try:
        s.recvfrom(100); print("answered")
    except ConnectionRefusedError:
        print("refused")
    except (TimeoutError, socket.timeout):
        print("timeout")
""")


def test_a_reset_router_refuses_unsolicited_tcp_and_drops_unsolicited_udp(make_rig):
    rig = make_rig(rigmod.rst_pair())
    wan = rig.addr("nat_a")
    out = rig.run("public", py(KNOCK, wan, 4001, 2.0), check=True).stdout.strip()
    assert out == "refused"  # the RST came back at once
    out = rig.run("public", py(UDP_KNOCK, wan, 4001, 1.0), check=True).stdout.strip()
    assert out == "timeout"  # UDP: no answer, no ICMP
    # the other home of the pair still drops silently
    assert rig.run("public", py(KNOCK, rig.addr("nat_b"), 4001, 1.0), check=True).stdout.strip() == "timeout"


def punch(rig: rigmod.Rig, attempts: int, timeout: float) -> tuple[str, str]:
    """Run PUNCH on peer_a and peer_b at once; return their last stdout lines."""
    observer(rig)
    obs = f"{rig.addrs('observer')[0]}:{OBS_PORT}"
    peers = {}
    for node, lport in (("peer_a", 41000), ("peer_b", 42000)):
        peers[node] = rig.popen(node, py(PUNCH, node, obs, lport, attempts, timeout),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    seen = {}
    for node, p in peers.items():
        word, ip, port = read_line(p, LINE_TIMEOUT).split()
        assert word == "observed" and ip == rig.public_addr_of(node)
        seen[node] = f"{ip} {port}\n".encode()
    # hand each peer the other's external address, as DCUtR's CONNECT/SYNC would
    for me, other in (("peer_a", "peer_b"), ("peer_b", "peer_a")):
        peers[me].stdin.write(seen[other])
        peers[me].stdin.flush()
    bound = attempts * (timeout + 0.5) + LINE_TIMEOUT
    return read_line(peers["peer_a"], bound).strip(), read_line(peers["peer_b"], bound).strip()


def test_tcp_simultaneous_open_through_two_eim_nats(easy_rig):
    a, b = punch(easy_rig, attempts=5, timeout=3.0)
    assert a.startswith("ok") and a.endswith("hello from peer_b"), a
    assert b.startswith("ok") and b.endswith("hello from peer_a"), b


def test_tcp_simultaneous_open_fails_with_symmetric_nat(symmetric_rig):
    a, b = punch(symmetric_rig, attempts=3, timeout=2.0)
    assert (a, b) == ("gave up", "gave up")


def test_double_nat_peer_is_seen_as_carrier_nat(double_nat_rig):
    observer(double_nat_rig)
    [(ip, _)] = probe(double_nat_rig, "peer_a", 40005,
                      f"{double_nat_rig.addrs('observer')[0]}:{OBS_PORT}")
    assert ip == double_nat_rig.addr("isp_a") == double_nat_rig.public_addr_of("peer_a")
    assert double_nat_rig.addr("nat_a").startswith("100.64.")
    assert double_nat_rig.ping("peer_a", double_nat_rig.addr("relay"), count=2)


def test_delay_adds_rtt(make_rig):
    delay = 20.0
    rig = make_rig(rigmod.easy_pair(delay_ms=delay))
    rtts = rig.ping("peer_a", rig.addr("relay"), count=5)
    assert len(rtts) >= 4, rtts
    assert min(rtts) >= 2 * delay, rtts  # one delayed WAN link, both directions
    assert sorted(rtts)[len(rtts) // 2] < 2 * delay + 400, rtts
    direct = rig.ping("relay", rig.addr("public"), count=3)
    assert direct and max(direct) < min(rtts), (direct, rtts)


# Receive one TCP stream, print its length and SHA-256.
SINK = textwrap.dedent(r"""
    import hashlib, socket
    l = socket.socket(); l.bind(("0.0.0.0", 7100)); l.listen(1); print("ready", flush=True)
    l.settimeout(20); c, _ = l.accept(); c.settimeout(20); h, n = hashlib.sha256(), 0
    while d := c.recv(1 << 20):
        h.update(d); n += len(d)
    print(n, h.hexdigest(), flush=True)
""")

# Send n pseudo-random bytes to ip:7100 and print length and SHA-256.
SOURCE = textwrap.dedent(r"""
    import hashlib, random, socket, sys
    data = random.Random(7).randbytes(int(sys.argv[2]))
    s = socket.create_connection((sys.argv[1], 7100), timeout=20); s.sendall(data); s.close()
    print(len(data), hashlib.sha256(data).hexdigest())
""")


def test_bulk_tcp_through_delayed_nat_is_intact(make_rig):
    # big GSO frames and offloaded checksums must survive the userspace wire
    rig = make_rig(rigmod.easy_pair(delay_ms=10))
    sink = rig.popen("relay", py(SINK), stdout=subprocess.PIPE)
    assert read_line(sink, LINE_TIMEOUT).strip() == "ready"
    sent = rig.run("peer_a", py(SOURCE, rig.addr("relay"), 8 << 20), check=True).stdout.strip()
    assert read_line(sink, 30).strip() == sent


def test_full_loss_link_drops_everything(make_rig):
    spec = Spec(hosts=(Host("lossy", addrs=("203.0.113.40",), link=Link(loss_pct=100)),
                       Host("relay", addrs=("203.0.113.10",))))
    rig = make_rig(spec)
    assert rig.ping("relay", rig.addr("lossy"), count=1) == []


def test_context_exit_removes_everything(nat_ok):
    with rigmod.Rig(rigmod.easy_pair(delay_ms=5)) as rig:
        tag = rig.tag
        assert len([n for n in rigmod.list_namespaces() if n.startswith(tag + "-")]) == 9
        delayer = rig.procs[0]
    assert not [n for n in rigmod.list_namespaces() if n.startswith(tag + "-")]
    assert delayer.poll() is not None


def test_exception_inside_context_still_cleans_up(nat_ok):
    tag = None
    with pytest.raises(RuntimeError, match="boom"):
        with rigmod.Rig(rigmod.symmetric_pair()) as rig:
            tag = rig.tag
            raise RuntimeError("boom")
    assert tag and not [n for n in rigmod.list_namespaces() if n.startswith(tag + "-")]


CHILD = textwrap.dedent(r"""
    import os, sys, time
    from tests.nat import rig
    r = rig.Rig(rig.easy_pair()).up()
    print(r.tag, flush=True)
    if sys.argv[1] == "hang":
        time.sleep(60)
""")


def child_rig(mode: str) -> tuple[subprocess.Popen, str]:
    """A separate process that builds a rig, prints its tag, then exits or hangs."""
    p = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE,
                         cwd=rigmod.REPO, env={**os.environ, "PYTHONPATH": str(rigmod.REPO)})
    return p, read_line(p, 20.0).strip()


def ours(tag: str) -> list[str]:
    """Namespaces of the rig with this tag."""
    return [n for n in rigmod.list_namespaces() if n.startswith(tag + "-")]


def test_atexit_tears_down_a_forgotten_rig(nat_ok):
    p, tag = child_rig("exit")
    try:
        assert p.wait(20) == 0
    finally:
        p.stdout.close()
    assert tag.startswith("vr") and not ours(tag)


def test_cleanup_stale_after_kill(nat_ok):
    p, tag = child_rig("hang")
    try:
        assert len(ours(tag)) == 8
        p.kill()
        p.wait(10)
    finally:
        p.stdout.close()
    assert len(ours(tag)) == 8  # SIGKILL: nothing ran, the namespaces are left over
    mine = f"vr{os.getpid()}z-live"  # a live owner's namespace must survive
    subprocess.run(["ip", "netns", "add", mine], check=True, timeout=10)
    try:
        gone = rigmod.cleanup_stale()
        assert set(ours(tag)).isdisjoint(rigmod.list_namespaces())
        assert not ours(tag) and mine not in gone and mine in rigmod.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", mine], timeout=10)
