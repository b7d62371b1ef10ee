"""Every kind of home ends direct on the rig: a symmetric home through its router's port mapping
(miniupnpd: PCP, NAT-PMP and UPnP IGD each), dual-stack homes over IPv6 when IPv4 cannot be
punched, and an easy home with a symmetric one by birthday probing; two symmetric homes without a
mapping stay relayed and work. Each kind of pair once (the whole matrix is benchmarks/reach.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.nat import rig as rigmod
from tests.nat.rig import read_line

from .test_quic_punch import BOTH, PY, RUNNER, assert_direct_on_first_attempt, start_relay

pytestmark = pytest.mark.nat
BOTH6 = BOTH + ["--listen", "/ip6/::/tcp/4001", "--listen", "/ip6/::/udp/4001/quic-v1"]


def start_listener(rig, node, relay_addr, listen=BOTH, *extra):
    """A listener reserved on the relay; returns its circuit address and the other addresses it
    printed (a mapping AutoNAT confirmed, with --wait-mapped)."""
    proc = rig.popen(node, [PY, *RUNNER, "listen-via-relay", relay_addr, *listen, *extra], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = read_line(proc, timeout=30)
    assert line.startswith("READY "), line
    target, others = line.split()[1], []
    if "--wait-mapped" in extra:
        mapped = read_line(proc, timeout=30).split()
        assert mapped[0] == "MAPPED", mapped
        others = mapped[1:]
    return target, others


def punch(rig, dialer, target, listen=BOTH, wait=15, also=(), extra=()):
    argv = [PY, *RUNNER, "echo-client", target, "--size", "200000", *listen, "--wait-direct", str(wait), *extra]
    for addr in also:
        argv += ["--also", addr]
    result = rig.run(dialer, argv, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("mapped_side", ["listener", "dialer"])
def test_a_symmetric_home_with_port_mapping_ends_direct_with_a_symmetric_home(make_rig, mapped_side):
    """The miniupnpd home maps its TCP and QUIC ports (PCP first), AutoNAT dials the mapping back,
    and the other symmetric home reaches it there: by dialling it (listener) or because the
    mapping is what the DCUtR CONNECT carries (dialer)."""
    rig = make_rig(rigmod.upnp_pair())
    relay_addr = start_relay(rig)
    mapping = ["--port-mapping"]
    if mapped_side == "listener":
        target, mapped = start_listener(rig, "peer_a", relay_addr, BOTH, *mapping, "--wait-mapped", "20")
        assert any("/203.0.113.101/" in a for a in mapped), mapped
        report = punch(rig, "peer_b", target, also=mapped)
        assert report["ok"] and not report["first_path"].startswith("relayed"), report  # dialled straight in
    else:
        target, _ = start_listener(rig, "peer_b", relay_addr)
        report = punch(rig, "peer_a", target, extra=mapping)
        assert_direct_on_first_attempt(report)
    assert not report["path"].startswith("relayed"), report


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["pcp", "natpmp", "upnp"])
def test_each_mapping_protocol_gets_a_mapping_that_autonat_confirms(make_rig, protocol):
    rig = make_rig(rigmod.upnp_pair())
    relay_addr = start_relay(rig)
    code = f"""
import json, trio
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.nat.portmap import PortMapper
from volunteer.net.events import PortMappingChanged
async def main():
    mapper = PortMapper(protocols=({protocol!r},))
    async with open_stack(listen=["/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1"],
                          options=StackOptions(port_mapping=False), services=[mapper]) as host:
        await host.connect({relay_addr!r})
        with host.events.subscribe(PortMappingChanged) as changes, trio.move_on_after(20):
            while len(mapper.advertised_addrs()) < 2:
                await changes.receive()
        print(json.dumps(mapper.snapshot()), flush=True)
trio.run(main)
"""
    result = rig.run("peer_a", [PY, "-c", code], timeout=60)
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout.strip().splitlines()[-1])
    assert snapshot["protocol"] == protocol, snapshot
    mappings = {m["addr"]: m for m in snapshot["mappings"]}
    assert set(mappings) == {"/ip4/203.0.113.101/tcp/4001", "/ip4/203.0.113.101/udp/4001/quic-v1"}, snapshot
    assert all(m["confirmed"] and m["protocol"] == protocol for m in mappings.values()), snapshot
    # leaving deleted them: miniupnpd's DNAT rules are gone
    rules = rig.run("nat_a", ["nft", "list", "chain", "inet", "rig", "prerouting_miniupnpd"]).stdout
    assert "dnat" not in rules, rules


@pytest.mark.slow
@pytest.mark.parametrize("listen", ["tcp", "quic"])
def test_no_ping_is_lost_while_a_relayed_connection_becomes_direct(make_rig, listen):
    """A user pings across the punch: relayed first, then the direct connection, then the relayed
    one's close two seconds later. Every ping is answered (over TCP alone, and over QUIC alone)."""
    rig = make_rig(rigmod.easy_pair())
    relay_addr = start_relay(rig)
    only = ["--listen", "/ip4/0.0.0.0/udp/4001/quic-v1" if listen == "quic" else "/ip4/0.0.0.0/tcp/4001"]
    target, _ = start_listener(rig, "peer_b", relay_addr, only)
    report = punch(rig, "peer_a", target, only, extra=["--ping-through", "3"])
    assert not report["path"].startswith("relayed"), report
    pings = report["pings"]
    assert pings["sent"] >= 10 and pings["lost"] == 0, report


@pytest.mark.slow
def test_a_mapping_on_a_carrier_nats_private_address_is_never_advertised_nor_waited_for(make_rig):
    """A home router behind a carrier NAT grants NAT-PMP mappings on its 100.64 WAN address.
    Nobody outside can reach it: it is never advertised, never a candidate AutoNAT is asked
    about, and no hole punch waits for it (each waited the whole observation window before);
    the home still ends direct with an easy one on the first attempt."""
    rig = make_rig(rigmod.natpmp_double_pair())
    relay_addr = start_relay(rig)
    code = f"""
import json, trio
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.nat.portmap import PortMapper
async def main():
    mapper = PortMapper(protocols=("natpmp",))
    async with open_stack(listen=["/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1"],
                          options=StackOptions(port_mapping=False), services=[mapper]) as host:
        await host.connect({relay_addr!r})
        with trio.fail_after(20):
            while len(mapper.plan.leases) < 2:
                await trio.sleep(0.05)
        await trio.sleep(1.0)  # an AutoNAT round would have asked about a candidate by now
        print(json.dumps({{"snapshot": mapper.snapshot(), "candidates": [str(a) for a in mapper.plan.candidates()],
                          "confirming": mapper.confirming, "advertised": [str(a) for a in mapper.advertised_addrs()]}}),
              flush=True)
trio.run(main)
"""
    result = rig.run("peer_a", [PY, "-c", code], timeout=60)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    mappings = {m["addr"] for m in seen["snapshot"]["mappings"]}
    assert mappings == {"/ip4/100.64.0.2/tcp/4001", "/ip4/100.64.0.2/udp/4001/quic-v1"}, seen  # granted
    assert seen["candidates"] == [] and not seen["confirming"], seen
    assert seen["advertised"] == [], seen
    target, _ = start_listener(rig, "peer_b", relay_addr)
    report = punch(rig, "peer_a", target, extra=["--port-mapping"])
    assert_direct_on_first_attempt(report)


@pytest.mark.slow
def test_dual_stack_homes_whose_ipv4_is_symmetric_end_direct_over_ipv6(make_rig):
    rig = make_rig(rigmod.ipv6_pair())
    relay_addr = start_relay(rig)
    target, _ = start_listener(rig, "peer_b", relay_addr, BOTH6)
    report = punch(rig, "peer_a", target, BOTH6)
    assert_direct_on_first_attempt(report)
    assert report["remote_addr"].startswith("/ip6/2001:db8:b::"), report


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_an_ipv6_pair_behind_stateful_firewalls_punches_each_transport_alone(make_rig, transport):
    rig = make_rig(rigmod.ipv6_pair())
    relay_addr = start_relay(rig)
    only = {"tcp": ["--listen", "/ip4/0.0.0.0/tcp/4001", "--listen", "/ip6/::/tcp/4001"],
            "quic": ["--listen", "/ip4/0.0.0.0/udp/4001/quic-v1", "--listen", "/ip6/::/udp/4001/quic-v1"]}[transport]
    target, _ = start_listener(rig, "peer_b", relay_addr, only)
    report = punch(rig, "peer_a", target, only)
    assert_direct_on_first_attempt(report)
    assert report["transport"] == transport and report["remote_addr"].startswith("/ip6/"), report
    assert rig.dropped("nat_b") > 0  # the firewall did drop what nobody asked for


@pytest.mark.slow
@pytest.mark.trio_timeout(400)
def test_an_easy_home_and_a_symmetric_one_end_direct_by_birthday_probing_nine_times_in_ten(make_rig):
    """Ten fresh dialers behind the symmetric NAT, each punching the easy home: the ordinary punch
    fails (the symmetric NAT's port is new for every destination), the birthday probe finds a way
    (over QUIC, the hard side's sockets counted) at least 9 times in 10. How many needed a second
    DCUtR attempt is printed: benchmarks/reach.py reports the first-attempt share."""
    rig = make_rig(rigmod.symmetric_pair())
    relay_addr = start_relay(rig)
    target, _ = start_listener(rig, "peer_b", relay_addr)
    direct = first_attempt = 0
    reports = []
    for attempt in range(10):
        listen = [a.replace("/4001", f"/{4101 + attempt}") for a in BOTH]
        report = punch(rig, "peer_a", target, listen)
        reports.append(report)
        if not report["path"].startswith("relayed"):
            # the symmetric side is "hard" once two observers saw it, "unsure" (both parts) with the relay alone
            hard_side = report["birthday"].get("hard", 0) + report["birthday"].get("unsure", 0)
            assert report["transport"] == "quic" and hard_side >= 1, report
            direct += 1
            first_attempt += hard_side == 1 and len(report["birthday"]) == 1
    print(f"\nbirthday probing, easy <-> symmetric: {direct} of 10 direct, {first_attempt} on the first attempt;",
          "seconds to direct:", [round(r["seconds_to_direct"], 2) for r in reports])
    assert direct >= 9, reports


@pytest.mark.slow
def test_a_home_that_never_keeps_its_ports_and_a_symmetric_one_end_direct_four_times_in_five(make_rig):
    """The shifted home's NAT is endpoint-independent but moves every port: with only the relay
    to observe it, it cannot tell itself from a symmetric NAT ("unsure"), so it plays both parts
    of the birthday probe, and its easy part meets the symmetric home's hard one."""
    rig = make_rig(rigmod.shifted_pair(nat_b="symmetric"))
    relay_addr = start_relay(rig)
    target, _ = start_listener(rig, "peer_a", relay_addr)
    reports = [punch(rig, "peer_b", target, [a.replace("/4001", f"/{4101 + attempt}") for a in BOTH])
               for attempt in range(5)]
    direct = [r for r in reports if not r["path"].startswith("relayed")]
    print(f"\nbirthday probing, shifted <-> symmetric: {len(direct)} of 5 direct;",
          "seconds to direct:", [round(r["seconds_to_direct"], 2) for r in direct])
    assert len(direct) >= 4, reports


def start_quic_relay(rig, node):
    """A relay on TCP and QUIC in ``node`` (a second observer of our addresses, for doctor)."""
    ip = rig.addr(node)
    proc = rig.popen(node, [PY, "-m", "volunteer", "relay", "--no-dashboard", "--identity", f"/tmp/{rig.tag}-{node}.key",
                            "--listen", "/ip4/0.0.0.0/tcp/4001", "--listen", "/ip4/0.0.0.0/udp/4001/quic-v1",
                            "--announce", f"/ip4/{ip}/tcp/4001", "--announce", f"/ip4/{ip}/udp/4001/quic-v1"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert read_line(proc, timeout=20).startswith("relay ")
    return read_line(proc, timeout=20).split()[-1]


def doctor(rig, node, peers):
    env = {k: v for k, v in os.environ.items() if k != "VOLUNTEER_NO_PORT_MAPPING"}  # doctor asks the rig's router
    result = rig.run(node, [PY, "-m", "volunteer", "doctor", "--identity", f"/tmp/{rig.tag}-{node}-doctor.key",
                            "--perf-size", "0", "--json", *peers], timeout=120, env=env)
    assert result.stdout, result.stderr
    return {c["name"]: c for c in json.loads(result.stdout)}


@pytest.mark.slow
@pytest.mark.trio_timeout(200)
def test_doctor_tells_the_router_protocol_the_mapping_and_whether_mapping_varies_by_destination(make_rig):
    """In the miniupnpd home: PCP answered, both ports mapped and reached from outside, and peers
    get in whatever the NAT's own mapping. In the plain symmetric home: no router protocol, the
    advice to turn one on, and a mapping that varies by destination."""
    rig = make_rig(rigmod.upnp_pair())
    peers = [start_relay(rig), start_quic_relay(rig, "public")]
    mapped = doctor(rig, "peer_a", peers)
    assert mapped["port mapping"]["status"] == "OK" and mapped["port mapping"]["detail"].startswith("PCP: "), mapped
    assert "/ip4/203.0.113.101/tcp/" in mapped["port mapping"]["detail"], mapped
    assert "/ip4/203.0.113.101/udp/" in mapped["port mapping"]["detail"], mapped
    for transport in ("TCP", "QUIC"):
        # the router's own NAT varies by destination, but a mapped port keeps its external port
        # for every destination (miniupnpd's rules): either way, peers get in
        check = mapped[f"NAT mapping {transport}"]
        assert check["status"] == "OK", mapped
        assert "varies by destination" in check["detail"] or "same for every destination" in check["detail"], mapped
    assert mapped["hairpinning"]["status"] in ("OK", "WARN") and "203.0.113.101" in mapped["hairpinning"]["detail"], mapped
    plain = doctor(rig, "peer_b", peers)
    assert plain["port mapping"]["status"] == "WARN" and "speaks none of" in plain["port mapping"]["detail"], plain
    assert "UPnP" in plain["port mapping"]["fix"], plain
    check = plain["NAT mapping QUIC"]
    assert check["status"] == "WARN" and "varies by destination" in check["detail"] and "birthday" in check["detail"], plain


@pytest.mark.slow
def test_doctor_sees_a_global_ipv6_address_and_listens_on_it(make_rig):
    rig = make_rig(rigmod.ipv6_pair())
    checks = doctor(rig, "peer_a", [start_relay(rig)])
    assert checks["IPv6"]["status"] == "OK" and "global address 2001:db8:a::" in checks["IPv6"]["detail"], checks
    assert "/ip6/::/tcp/" in checks["listening"]["detail"] and "/ip6/::/udp/" in checks["listening"]["detail"], checks


def test_two_machines_on_one_lan_behind_a_router_without_hairpinning_end_direct_over_the_lan(make_rig):
    """Both see the same public address; the router refuses it from inside. DCUtR offers the LAN
    addresses to a peer behind our own public address, so the pair ends direct over the LAN."""
    rig = make_rig(rigmod.lan_pair())
    relay_addr = start_relay(rig)
    target, _ = start_listener(rig, "peer_b", relay_addr)
    report = punch(rig, "peer_a", target, [a.replace("/4001", "/4101") for a in BOTH])
    assert not report["path"].startswith("relayed"), report
    assert report["remote_addr"].startswith("/ip4/100.64.2.3/"), report  # the LAN, not the public address
