"""NAT-PMP (RFC 6886) and PCP (RFC 6887) messages (pure): requests byte for byte, responses
decoded or refused, and arbitrary bytes never escaping the decoders as anything but our errors."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import PortMappingError, PortMappingMessageError
from volunteer.net import limits
from volunteer.net.nat.portmap import natpmp, pcp

NONCE = bytes(range(12))


def natpmp_map_response(transport="udp", result=0, internal=4001, external=40001, lifetime=7200, epoch=99):
    return struct.pack("!BBHIHHI", 0, 128 + natpmp.OP_MAP[transport], result, epoch, internal, external, lifetime)


def pcp_map_response(nonce=NONCE, result=0, protocol=17, internal=4001, external=40001, lifetime=7200, ip="203.0.113.101"):
    header = struct.pack("!BBBBII", 2, 0x81, 0, result, lifetime, 1234) + bytes(12)
    body = nonce + struct.pack("!B3xHH", protocol, internal, external) + pcp._ip16(ip)
    return header + body


# --- NAT-PMP ---------------------------------------------------------------------------------
def test_natpmp_requests_are_the_rfc_layout():
    assert natpmp.external_address_request() == b"\x00\x00"
    assert natpmp.map_request("tcp", 4001, 4001, 7200) == bytes.fromhex("0002 0000 0fa1 0fa1 00001c20")
    assert natpmp.map_request("udp", 4001, 0, 0)[1] == 1  # lifetime 0, port 0: delete


@pytest.mark.parametrize("args", [("sctp", 1, 1, 1), ("tcp", 0, 1, 1), ("tcp", 1, 70000, 1),
                                  ("tcp", 1, 1, limits.PORTMAP_MAX_LIFETIME + 1)])
def test_natpmp_refuses_to_encode_out_of_range_requests(args):
    with pytest.raises(ValueError):
        natpmp.map_request(*args)


def test_natpmp_decodes_an_address_and_a_mapping():
    address = natpmp.decode_external_address(struct.pack("!BBHI4s", 0, 128, 0, 7, bytes([203, 0, 113, 101])))
    assert address == natpmp.ExternalAddress("203.0.113.101", 7)
    mapped = natpmp.decode_map(natpmp_map_response("tcp", lifetime=10 ** 9), "tcp")
    assert (mapped.internal_port, mapped.external_port, mapped.epoch) == (4001, 40001, 99)
    assert mapped.lifetime == limits.PORTMAP_MAX_LIFETIME  # a silly lease is capped


def test_natpmp_refusals_carry_the_result_code_and_malformed_answers_are_message_errors():
    with pytest.raises(PortMappingError) as refused:
        natpmp.decode_map(natpmp_map_response(result=2), "udp")
    assert refused.value.code == 2 and not isinstance(refused.value, PortMappingMessageError)
    for bad in (natpmp_map_response("tcp"), natpmp_map_response()[:12], natpmp_map_response(external=0),
                b"\x01" + natpmp_map_response()[1:]):
        with pytest.raises(PortMappingMessageError):
            natpmp.decode_map(bad, "udp")


def test_a_natpmp_only_gateway_answering_pcp_is_recognised():
    refusal = struct.pack("!BBHI", 0, 128 + 1, natpmp.RESULT_UNSUPPORTED_VERSION, 0)
    assert natpmp.is_version_refusal(refusal)
    assert not natpmp.is_version_refusal(natpmp_map_response())
    assert not natpmp.is_version_refusal(pcp_map_response())


# --- PCP ---------------------------------------------------------------------------------------
def test_pcp_map_request_layout():
    request = pcp.map_request(NONCE, "192.0.2.10", "udp", 4001, 4001, 7200)
    assert len(request) == pcp.HEADER_SIZE + pcp.MAP_SIZE == 60
    assert request[:2] == b"\x02\x01" and struct.unpack_from("!I", request, 4)[0] == 7200
    assert request[8:24] == b"\0" * 10 + b"\xff\xff" + bytes([192, 0, 2, 10])  # IPv4-mapped client IP
    assert request[24:36] == NONCE and request[36] == 17
    assert struct.unpack_from("!HH", request, 40) == (4001, 4001)
    with pytest.raises(ValueError):
        pcp.map_request(b"short", "192.0.2.10", "udp", 4001, 0, 1)


def test_pcp_decodes_a_grant_and_refuses_other_requests_answers():
    mapped = pcp.decode_map(pcp_map_response(), NONCE, "udp")
    assert (mapped.external_ip, mapped.external_port, mapped.lifetime, mapped.epoch) == ("203.0.113.101", 40001, 7200, 1234)
    with pytest.raises(PortMappingMessageError):
        pcp.decode_map(pcp_map_response(nonce=bytes(12)), NONCE, "udp")  # someone else's answer
    with pytest.raises(PortMappingMessageError):
        pcp.decode_map(pcp_map_response(protocol=6), NONCE, "udp")
    with pytest.raises(PortMappingMessageError):
        pcp.decode_map(pcp_map_response() + b"\0\0", NONCE, "udp")  # not a multiple of 4


def test_a_pcp_error_answer_may_be_only_the_header():
    header_only = struct.pack("!BBBBII", 2, 0x81, 0, 8, 0, 0) + bytes(12)
    with pytest.raises(PortMappingError) as refused:
        pcp.decode_map(header_only, NONCE, "tcp")
    assert refused.value.code == 8 and "no resources" in str(refused.value)


def test_pcp_skips_options_after_the_payload():
    assert pcp.decode_map(pcp_map_response() + bytes(8), NONCE, "udp").external_port == 40001


# --- properties ------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=limits.PORTMAP_MAX_MESSAGE + 8), st.sampled_from(["tcp", "udp"]))
def test_any_bytes_decode_or_raise_a_port_mapping_error(data, transport):
    for decode in (lambda: natpmp.decode_map(data, transport), lambda: natpmp.decode_external_address(data),
                   lambda: pcp.decode_map(data, NONCE, transport)):
        try:
            decode()
        except PortMappingError:
            pass
    natpmp.is_version_refusal(data)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["tcp", "udp"]), st.integers(1, 65535), st.integers(1, 65535),
       st.integers(1, limits.PORTMAP_MAX_LIFETIME), st.integers(0, 2 ** 32 - 1))
def test_granted_mappings_round_trip(transport, internal, external, lifetime, epoch):
    got = natpmp.decode_map(natpmp_map_response(transport, 0, internal, external, lifetime, epoch), transport)
    assert (got.internal_port, got.external_port, got.lifetime, got.epoch) == (internal, external, lifetime, epoch)
    protocol = pcp.PROTOCOLS[transport]
    got6 = pcp.decode_map(pcp_map_response(NONCE, 0, protocol, internal, external, lifetime, "2001:db8::1"), NONCE, transport)
    assert (got6.internal_port, got6.external_port, got6.external_ip) == (internal, external, "2001:db8::1")


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 59), st.integers(1, 255))
def test_a_flipped_byte_in_a_pcp_grant_is_decoded_consistently_or_refused(index, flip):
    data = bytearray(pcp_map_response())
    data[index] ^= flip
    try:
        got = pcp.decode_map(bytes(data), NONCE, "udp")
    except PortMappingError:
        return
    assert got.internal_port and got.transport == "udp"
