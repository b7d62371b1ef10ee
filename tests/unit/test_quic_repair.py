"""The repair codec under QUIC (transport/quic/repair.py): any one or two lost members of a block
come back from the others and the two repairs; three do not; a repair that names other
datagrams, or garbage, rebuilds nothing that QUIC would accept; the demultiplexer routes repairs
to their connection."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.net.transport.quic import route
from volunteer.net.transport.quic.repair import (
    BLOCK_SIZE,
    OVERHEAD,
    RepairDecoder,
    RepairEncoder,
    connection_id,
    hello,
    parse_rebuilt,
    parse_repair,
    rebuilt_report,
    protectable,
)

CID = bytes(range(8))


def block(sizes: list[int]) -> list[bytes]:
    return [b"\x40" + os.urandom(size) for size in sizes]


def encode(members: list[bytes]) -> list[bytes]:
    encoder = RepairEncoder(block_size=len(members))
    repairs = []
    for member in members:
        repairs += encoder.add(member, CID, now=0.0)
    return repairs


def decode(members: list[bytes], lost: set[int], repairs: list[bytes]) -> tuple[list[bytes], RepairDecoder]:
    decoder = RepairDecoder()
    for index, member in enumerate(members):
        if index not in lost:
            decoder.received(member)
    rebuilt = []
    for extra in repairs:
        rebuilt += decoder.repair(extra)
    return rebuilt, decoder


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(5, 1400), min_size=1, max_size=BLOCK_SIZE),
    data=st.data(),
)
def test_any_one_or_two_lost_members_come_back(sizes, data):
    members = block(sizes)
    repairs = encode(members)
    assert len(repairs) == 2
    assert all(len(r) <= max(map(len, members)) + OVERHEAD for r in repairs)
    count = data.draw(st.integers(1, min(2, len(members))))
    lost = set(data.draw(st.lists(st.integers(0, len(members) - 1), min_size=count, max_size=count, unique=True)))
    order = data.draw(st.permutations(repairs))
    rebuilt, decoder = decode(members, lost, order)
    assert sorted(rebuilt) == sorted(members[i] for i in lost)
    assert decoder.rebuilt == len(lost)


def test_one_lost_member_needs_only_one_repair_either_one():
    members = block([100, 1300, 7, 900])
    p, q = encode(members)
    for repair in (p, q):
        rebuilt, _ = decode(members, {2}, [repair])
        assert rebuilt == [members[2]]


def test_three_lost_members_are_beyond_repair_and_counted():
    members = block([500] * 8)
    rebuilt, decoder = decode(members, {0, 3, 7}, encode(members))
    assert rebuilt == [] and decoder.unrepairable == 1


def test_nothing_lost_rebuilds_nothing():
    members = block([300] * 5)
    rebuilt, decoder = decode(members, set(), encode(members))
    assert rebuilt == [] and decoder.rebuilt == 0


def test_a_block_that_did_not_fill_goes_out_after_its_wait():
    encoder = RepairEncoder(wait=0.005)
    assert encoder.add(b"\x40" + os.urandom(50), CID, now=1.0) == []
    assert encoder.deadline == 1.005
    assert encoder.due(CID, now=1.004) == []
    repairs = encoder.due(CID, now=1.005)
    assert len(repairs) == 2 and encoder.deadline is None
    assert parse_repair(repairs[0]).tags == parse_repair(repairs[1]).tags


def test_forged_or_mismatched_repairs_rebuild_only_bytes_quic_would_check():
    members = block([400] * 6)
    p, q = encode(members)
    decoder = RepairDecoder()
    for member in members[1:]:
        decoder.received(member)
    # garbage with the marker, truncated repairs, a hello: nothing rebuilt, nothing raised
    for junk in (b"\x1d", b"\x1d\x01\x08" + CID, p[:20], hello(CID), b"\x1d\x01\xff" + os.urandom(60)):
        assert decoder.repair(junk) == []
    # a repair whose coded bytes were altered rebuilds something, but not the member: QUIC's
    # authentication is what rejects it (the decoder never claims to know the bytes are right)
    altered = p[:-1] + bytes([p[-1] ^ 0xFF])
    rebuilt = decoder.repair(altered)
    assert rebuilt != [members[0]]


def test_only_short_header_packets_that_fit_are_protected():
    assert protectable(b"\x40" + bytes(300), largest=1400)
    assert not protectable(b"\x40" + bytes(100), largest=1400)  # an ACK: a later one makes up for it
    assert not protectable(b"\xc0" + bytes(300), largest=1400)  # a long header (the handshake)
    assert not protectable(b"\x40" + bytes(1400), largest=1400)
    assert not protectable(b"", largest=1400)


def test_repairs_and_hellos_route_to_their_connection():
    members = block([200, 300])
    for datagram in encode(members) + [hello(CID)]:
        assert connection_id(datagram) == CID
        found = route(datagram)
        assert found is not None and found.destination_cid == CID and not found.opens_connection
    assert route(b"\x1d\x01\x30" + bytes(10)) is None  # a connection ID longer than QUIC allows


def test_a_rebuilt_report_carries_its_count_and_routes_like_a_repair():
    report = rebuilt_report(CID, 1234)
    assert parse_rebuilt(report) == 1234 and connection_id(report) == CID
    assert parse_rebuilt(hello(CID)) is None and parse_repair(report) is None
    assert parse_rebuilt(report[:-1]) is None
