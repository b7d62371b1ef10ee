"""Home lines on the rig deliver what they say: each profile's caps are in force (a raw TCP
transfer cannot beat them), its delay shows in ping, and a port forward opens exactly one port.
The pure parts (bucket and queue sizes, the tc command, spec checks) need no root."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.nat import lines
from tests.nat import rig as rigmod
from tests.nat.rig import Host, Spec, read_line

PORT = 5000
SECONDS_AT_CAP = 1.5  # each transfer moves this long's worth of bytes at the line's cap
CAP_SLACK = 1.05  # tbf counts frame bytes, we count payload: payload over the cap means no cap

# Serves transfers: reads "send N" (we then read N bytes and answer "ok") or "recv N" (we send
# N bytes); bounded in connections and lifetime.
SERVER = textwrap.dedent(r"""
    import socket, sys, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8); s.settimeout(120)
    print("ready", flush=True)
    for _ in range(16):
        c, _ = s.accept(); c.settimeout(60)
        f = c.makefile("rb"); op, n = f.readline().split(); n = int(n)
        if op == b"send":
            got = 0
            while got < n:
                d = f.read1(1 << 20)
                if not d: break
                got += len(d)
            c.sendall(b"ok\n")
        else:
            chunk = b"x" * (1 << 16)
            while n > 0:
                c.sendall(chunk[:n]); n -= len(chunk)
        c.close()
""")

# One transfer: prints the payload bytes and the seconds from the request to the last byte.
CLIENT = textwrap.dedent(r"""
    import socket, sys, time
    op, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    c = socket.create_connection((host, port), timeout=60)
    t0 = time.monotonic(); c.sendall(f"{op} {n}\n".encode()); got = 0
    if op == "send":
        chunk = b"x" * (1 << 16); left = n
        while left > 0:
            c.sendall(chunk[:left]); left -= len(chunk)
        assert c.makefile("rb").readline() == b"ok\n"; got = n
    else:
        while got < n:
            d = c.recv(1 << 20)
            if not d: break
            got += len(d)
    print(got, time.monotonic() - t0)
""")


def transfer(rig: rigmod.Rig, node: str, op: str, nbytes: int) -> tuple[int, float]:
    """Move ``nbytes`` between ``node`` and the public server; (bytes moved, seconds)."""
    result = rig.run(node, [sys.executable, "-c", CLIENT, op, rig.addr("public"), str(PORT), str(nbytes)],
                     timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    got, seconds = result.stdout.split()
    return int(got), float(seconds)


@pytest.mark.nat
@pytest.mark.slow
@pytest.mark.parametrize("line", sorted(lines.PROFILES))
def test_each_line_delivers_its_caps_and_delay(make_rig, line):
    profile = lines.PROFILES[line]
    rig = make_rig(rigmod.line_homes(line, ["home0"]))
    caps = rig.caps("nat_home0")
    assert [c["rate_bit"] for c in caps["up"]] == [int(profile.up_mbit * 1e6)]
    assert [c["rate_bit"] for c in caps["down"]] == [int(profile.down_mbit * 1e6)]
    rtts = rig.ping("home0", rig.addr("public"), count=4)
    assert rtts, "no ping answered"  # a 0.5 % loss line may lose one probe, not all four
    assert min(rtts) >= 2 * profile.delay_ms  # one line crossed, both directions
    server = rig.popen("public", [sys.executable, "-c", SERVER, str(PORT)], stdout=subprocess.PIPE)
    assert read_line(server, 10).strip() == "ready"
    for op, mbit, cap in (("recv", profile.down_mbit, caps["down"][0]), ("send", profile.up_mbit, caps["up"][0])):
        nbytes = int(mbit * 1e6 / 8 * SECONDS_AT_CAP)
        got, seconds = transfer(rig, "home0", op, nbytes)
        assert got == nbytes
        # the bucket starts full: at most one burst more than the rate allows
        assert got <= (mbit * 1e6 / 8) * seconds * CAP_SLACK + cap["burst"], (op, got, seconds)
    after = rig.caps("nat_home0")
    assert after["down"][0]["bytes"] > int(profile.down_mbit * 1e6 / 8 * SECONDS_AT_CAP)  # it went through the cap
    assert after["up"][0]["bytes"] > int(profile.up_mbit * 1e6 / 8 * SECONDS_AT_CAP)


@pytest.mark.nat
def test_port_forward_opens_one_port_to_one_host(make_rig):
    rig = make_rig(rigmod.line_homes("fibre", ["home0"]))
    server = rig.popen("home0", [sys.executable, "-c", SERVER, str(PORT)], stdout=subprocess.PIPE)
    assert read_line(server, 10).strip() == "ready"
    wan = rig.addr("nat_home0")
    knock = "import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2); print('open')\n" \
            "except OSError: print('closed')"
    assert rig.run("public", [sys.executable, "-c", knock, wan, str(PORT)]).stdout.strip() == "closed"
    rig.forward_port("nat_home0", PORT, "home0")
    assert rig.run("public", [sys.executable, "-c", knock, wan, str(PORT)]).stdout.strip() == "open"
    assert rig.run("public", [sys.executable, "-c", knock, wan, str(PORT + 1)]).stdout.strip() == "closed"
    with pytest.raises(ValueError):
        rig.forward_port("nat_home0", PORT, "public")  # not behind that router


def test_bucket_and_queue_sizes_follow_the_rate():
    assert lines.burst_bytes(2) == lines.MIN_BURST  # a slow line still passes whole frames
    assert lines.burst_bytes(300) == int(300e6 / 8 * lines.BURST_SECONDS)
    assert lines.queue_bytes(10, 100) == int(10e6 / 8 * 0.1)
    assert lines.queue_bytes(0.1, 1) == lines.burst_bytes(0.1) + lines.MTU_FRAME
    command = lines.cap_command("ns", "eth0", 50, 100)
    assert command[command.index("rate") + 1] == "50000000bit"
    assert lines.PROFILES["cable"].rtt_ms() == 80  # trainer's line and volunteer's, both ways


@pytest.mark.parametrize("link", [
    lines.Link(up_mbit=0), lines.Link(down_mbit=-1), lines.Link(up_mbit=1e6), lines.Link(queue_ms=0),
    lines.Link(delay_ms=-1),
])
def test_bad_caps_are_refused(link):
    assert link.problems()
    with pytest.raises(ValueError):
        rigmod.Rig(Spec(hosts=(Host("x", addrs=("203.0.113.5",), link=link),)))


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(KeyError, match="cable"):
        lines.profile_names(["cable", "moon"])
    assert [p.name for p in lines.profile_names(["dsl", "far"])] == ["dsl", "far"]
