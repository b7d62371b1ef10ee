"""Port mapping's decisions (pure, ``now`` passed in): which ports, which protocol, when to renew
and retry, and that only a mapping dialled back from outside is ever advertised."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.net import limits
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.portmap.plan import Lease, PortMapPlan, Wanted, choose_protocol, settled, wanted_ports

TCP = Wanted("tcp", 4001)
QUIC = Wanted("quic", 4001)


def lease(wanted=TCP, port=40001, lifetime=7200.0, at=0.0, protocol="pcp"):
    return Lease(protocol, wanted, "203.0.113.101", port, lifetime, at)


def test_only_ipv4_tcp_and_quic_ports_off_loopback_are_wanted_each_once():
    listen = [Multiaddr(a) for a in ("/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1", "/ip4/127.0.0.1/tcp/5000",
                                     "/ip6/::/tcp/4001", "/ip4/192.0.2.5/tcp/4001", "/ip4/0.0.0.0/udp/9/webrtc")]
    assert wanted_ports(listen) == [TCP, QUIC]
    assert QUIC.transport == "udp" and TCP.transport == "tcp"


def test_protocols_are_preferred_pcp_then_natpmp_then_upnp():
    assert choose_protocol(["upnp", "natpmp"]) == "natpmp"
    assert choose_protocol([]) is None
    assert settled({"pcp": None, "natpmp": True}) == (False, None)  # PCP may still answer
    assert settled({"pcp": False, "natpmp": True, "upnp": True}) == (True, "natpmp")
    assert settled({"pcp": False, "natpmp": False}) == (True, None)


def test_the_first_try_is_at_once_and_failures_back_off_doubling_to_a_cap():
    plan = PortMapPlan()
    assert plan.should_try([TCP], 0.0)
    assert not plan.should_try([], 0.0)
    plan.tried(0.0, None, "no gateway answered", [TCP])
    assert plan.next_try_at() == limits.PORTMAP_RETRY_INTERVAL
    assert not plan.should_try([TCP], limits.PORTMAP_RETRY_INTERVAL - 1)
    assert plan.should_try([TCP], limits.PORTMAP_RETRY_INTERVAL)
    for n in range(2, 12):
        plan.tried(0.0, None, "again", [TCP])
        assert plan.next_try_at() == min(limits.PORTMAP_MAX_BACKOFF, limits.PORTMAP_RETRY_INTERVAL * 2 ** (n - 1))
    assert plan.should_try([TCP, QUIC], 1.0)  # a port never tried goes at once


def test_a_network_change_retries_but_not_more_often_than_the_interval():
    plan = PortMapPlan()
    plan.tried(0.0, "pcp", "", [TCP])
    plan.granted(lease())
    assert not plan.should_try([TCP], 5.0)  # mapped, nothing changed
    assert not plan.should_try([TCP], 5.0, network_changed=True)
    assert plan.should_try([TCP], limits.PORTMAP_RETRY_INTERVAL, network_changed=True)


def test_leases_renew_half_way_never_sooner_than_the_floor():
    assert lease(lifetime=7200, at=100).renew_at == 100 + 3600
    assert lease(lifetime=10, at=100).renew_at == 100 + limits.PORTMAP_MIN_RENEW
    assert lease(lifetime=0, at=0).renew_at == limits.PORTMAP_LIFETIME / 2  # UPnP's "forever"
    plan = PortMapPlan()
    plan.granted(lease(TCP, at=0))
    plan.granted(lease(QUIC, at=50))
    assert plan.next_renewal() == 3600
    assert [l.wanted for l in plan.due_renewals(3600)] == [TCP]


def test_only_a_mapping_dialled_back_is_advertised():
    plan = PortMapPlan()
    assert plan.granted(lease(TCP))
    assert plan.granted(lease(QUIC))
    assert plan.advertised() == []
    tcp_addr, quic_addr = lease(TCP).addr, lease(QUIC).addr
    assert quic_addr == Multiaddr("/ip4/203.0.113.101/udp/40001/quic-v1")
    assert set(plan.candidates()) == {tcp_addr, quic_addr}
    assert plan.dialled_back(tcp_addr, True)
    assert not plan.dialled_back(tcp_addr, True)  # no change the second time
    assert not plan.dialled_back(quic_addr, False)
    assert plan.advertised() == [tcp_addr] and plan.candidates() == []
    plan.network_changed()
    assert plan.candidates() == [quic_addr]  # refused before, worth asking again
    assert not plan.dialled_back(Multiaddr("/ip4/203.0.113.101/tcp/1"), True)  # no such lease


def test_a_renewal_with_the_same_address_needs_no_new_confirmation_and_a_lost_lease_is_withdrawn():
    plan = PortMapPlan()
    plan.granted(lease(TCP))
    plan.dialled_back(lease(TCP).addr, True)
    assert not plan.granted(lease(TCP, at=3600))
    assert plan.advertised() == [lease(TCP).addr]
    assert plan.granted(lease(TCP, port=40002))  # the router moved us: confirm again
    assert plan.advertised() == []
    plan.lost(TCP)
    assert plan.leases == {} and plan.advertised() == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["grant", "confirm", "refuse", "lose", "change"]),
                          st.sampled_from([TCP, QUIC]), st.integers(40000, 40003)), max_size=40))
def test_whatever_happens_nothing_unconfirmed_or_unleased_is_advertised(events):
    plan = PortMapPlan()
    confirmed_by_server: set[Multiaddr] = set()
    for kind, wanted, port in events:
        addr = lease(wanted, port).addr
        if kind == "grant":
            plan.granted(lease(wanted, port))
        elif kind == "confirm":
            if plan.dialled_back(addr, True) or addr in plan.advertised():
                confirmed_by_server.add(addr)
        elif kind == "refuse":
            plan.dialled_back(addr, False)
        elif kind == "lose":
            plan.lost(wanted)
        else:
            plan.network_changed()
    leased = {l.addr for l in plan.leases.values()}
    assert set(plan.advertised()) <= leased & confirmed_by_server


def test_a_mapping_nobody_can_check_or_reach_stops_being_a_candidate():
    """A punch waits while a mapping awaits its dial-back (``PortMapper.confirming``): a mapping
    on the inner router's private WAN address of a double NAT, or one every AutoNAT server
    refuses to dial, would make every punch wait for evidence that cannot come."""
    plan = PortMapPlan()
    tcp, quic = wanted_ports([Multiaddr("/ip4/0.0.0.0/tcp/4001"), Multiaddr("/ip4/0.0.0.0/udp/4001/quic-v1")])
    plan.granted(Lease("natpmp", tcp, "100.64.0.2", 4001, 3600, 0.0))  # the inner router's 100.64 WAN
    assert plan.candidates() == []
    plan.granted(Lease("natpmp", quic, "203.0.113.101", 4001, 3600, 0.0))
    public = Multiaddr("/ip4/203.0.113.101/udp/4001/quic-v1")
    assert plan.candidates() == [public]
    plan.not_checked(public)
    assert plan.candidates() == []
    plan.network_changed()
    assert plan.candidates() == []  # a refusal to check is not undone by a new observation
    assert plan.dialled_back(public, True) and plan.advertised() == [public]  # a later answer still counts
