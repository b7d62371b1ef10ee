"""What doctor says about reach (pure): each finding gives the right status, names what was
found, and says what to do when something is missing."""

from __future__ import annotations

from volunteer.cli.reachcheck import hairpin_check, ipv6_check, nat_mapping_check, port_mapping_check
from volunteer.net.nat.observed import MappingType

TCP = "/ip4/203.0.113.101/tcp/4001"
QUIC = "/ip4/203.0.113.101/udp/4001/quic-v1"


def snapshot(protocol="pcp", mappings=(), error="", errors=None):
    return {"protocol": protocol, "gateway": "192.0.2.1", "external_ip": "203.0.113.101",
            "mappings": list(mappings), "error": error, "errors": errors or {}}


def mapping(addr, confirmed=False, refused=False, protocol="pcp"):
    return {"addr": addr, "internal_port": 4001, "protocol": protocol, "confirmed": confirmed, "refused": refused,
            "renew_in_s": 3600.0}


def test_a_mapping_reached_from_outside_is_ok_and_names_protocol_and_addresses():
    check = port_mapping_check(snapshot("natpmp", [mapping(TCP, confirmed=True), mapping(QUIC, confirmed=True)]))
    assert check.status == "OK" and check.detail.startswith("NAT-PMP: ") and TCP in check.detail and QUIC in check.detail
    partly = port_mapping_check(snapshot("upnp", [mapping(TCP, confirmed=True), mapping(QUIC)]))
    assert partly.status == "OK" and "UPnP IGD" in partly.detail and "1 not reached yet" in partly.detail


def test_no_router_protocol_says_why_each_failed_and_how_to_turn_one_on():
    check = port_mapping_check(snapshot(None, error="no router answered",
                                        errors={"pcp": "timed out", "natpmp": "timed out", "upnp": "no IGD found"}))
    assert check.status == "WARN" and "PCP: timed out" in check.detail and "UPnP IGD: no IGD found" in check.detail
    assert "UPnP" in check.fix and "forward" in check.fix


def test_a_mapping_nobody_could_dial_back_points_at_a_second_nat():
    check = port_mapping_check(snapshot("pcp", [mapping(TCP, refused=True)]))
    assert check.status == "WARN" and "not advertised" in check.detail and "CGNAT" in check.fix


def test_an_unconfirmed_mapping_is_not_advertised_and_a_refusal_is_reported():
    pending = port_mapping_check(snapshot("pcp", [mapping(TCP)]))
    assert pending.status == "WARN" and "not yet confirmed" in pending.detail and "AutoNAT" in pending.fix
    refused = port_mapping_check(snapshot("pcp", [], error="tcp port 4001: PCP: no resources"))
    assert refused.status == "WARN" and "no resources" in refused.detail


def test_mapping_off_says_how_to_turn_it_on():
    assert port_mapping_check(None, "--no-port-mapping").fix.startswith("drop --no-port-mapping")
    assert port_mapping_check(None, "VOLUNTEER_NO_PORT_MAPPING=1").fix.startswith("unset VOLUNTEER_NO_PORT_MAPPING=1")


def test_whether_the_mapping_varies_by_destination():
    easy = nat_mapping_check("TCP", MappingType.ENDPOINT_INDEPENDENT, [TCP])
    assert easy.status == "OK" and "same for every destination" in easy.detail
    hard = nat_mapping_check("QUIC", MappingType.ENDPOINT_DEPENDENT, [QUIC, "/ip4/203.0.113.101/udp/5555/quic-v1"])
    assert hard.status == "WARN" and "varies by destination" in hard.detail and "birthday" in hard.detail
    assert "UPnP" in hard.fix and "IPv6" in hard.fix
    assert nat_mapping_check("TCP", MappingType.ENDPOINT_DEPENDENT, [TCP], mapped=True).status == "OK"
    unknown = nat_mapping_check("QUIC", MappingType.UNKNOWN, [])
    assert unknown.status == "WARN" and "two peers" in unknown.detail and "quic-v1" in unknown.fix


def test_hairpinning_yes_no_and_untried():
    assert hairpin_check(True, TCP).status == "OK"
    no = hairpin_check(False, TCP, "timed out")
    assert no.status == "WARN" and "timed out" in no.detail and "mDNS" in no.fix
    assert hairpin_check(None, None).status == "WARN"


def test_ipv6_missing_present_and_unanswered():
    missing = ipv6_check([], None)
    assert missing.status == "WARN" and "no global IPv6" in missing.detail and "IPv6" in missing.fix
    assert ipv6_check(["2001:db8::5"], None).status == "OK"
    assert ipv6_check(["2001:db8::5"], True).status == "OK"
    silent = ipv6_check(["2001:db8::5"], False, "timed out")
    assert silent.status == "WARN" and "2001:db8::5" in silent.detail and "timed out" in silent.detail


def test_a_router_that_refused_is_not_said_to_speak_none_of_the_protocols():
    """The router answered PCP and NAT-PMP with a refusal: it speaks them; the line used to say it
    spoke none of them, in a sentence that quoted its answers ("PCP: PCP: not authorized")."""
    check = port_mapping_check(snapshot(None, error="no router answered",
                                        errors={"pcp": "PCP: not authorized", "natpmp": "NAT-PMP: not authorized or refused",
                                                "upnp": "no UPnP device answered"}))
    assert check.status == "WARN" and "speaks none" not in check.detail
    assert check.detail.startswith("the router answered PCP, NAT-PMP but refused a mapping")
    assert "PCP: not authorized" in check.detail and "PCP: PCP:" not in check.detail
    assert "allow port mapping" in check.fix and "turn on" not in check.fix
    natpmp_only = port_mapping_check(snapshot(None, errors={"pcp": "the gateway speaks NAT-PMP, not PCP",
                                                            "natpmp": "NAT-PMP: out of resources"}))
    assert "answered PCP, NAT-PMP" in natpmp_only.detail


def test_silence_still_says_the_router_speaks_none_and_no_gateway_says_there_is_no_router():
    silent = port_mapping_check(snapshot(None, errors={"pcp": "the gateway did not answer on port 5351",
                                                       "natpmp": "the gateway did not answer on port 5351",
                                                       "upnp": "no UPnP device answered"}))
    assert "speaks none of PCP, NAT-PMP, UPnP IGD" in silent.detail
    alone = port_mapping_check(snapshot(None, errors={"pcp": "no IPv4 default gateway to ask",
                                                      "natpmp": "no IPv4 default gateway to ask",
                                                      "upnp": "no UPnP device answered"}))
    assert alone.detail.startswith("no router to ask") and "speaks" not in alone.detail
