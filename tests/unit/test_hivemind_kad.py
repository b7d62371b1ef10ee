"""``/ipfs/kad/1.0.0`` peer routing, sans-I/O: go-libp2p-kad-dht's field numbers, answers to
FIND_NODE / PING / GET_VALUE, refusals of writes, and fuzzing of the message decoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import RemoteProtocolError
from volunteer.hivemind import kad_wire as wire
from volunteer.hivemind.errors import HivemindUnsupported
from volunteer.hivemind.pb.hm_kad_pb2 import Message
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr


def peers(n: int) -> list:
    return [KeyPair.generate().peer_id for _ in range(n)]


def test_find_node_request_uses_go_kad_field_numbers():
    (target,) = peers(1)
    raw = wire.find_node_request(target).SerializeToString()
    # type = 1 (varint 4: FIND_NODE), key = 2 (the peer id's bytes)
    assert raw[:2] == b"\x08\x04" and raw[2] == 0x12 and raw.endswith(target.to_bytes())
    assert wire.delimited(Message(type=Message.PING)) == b"\x02\x08\x05"


def test_find_node_answers_nearest_known_peers_and_the_target_never_the_requester():
    requester, target, *others = peers(30)
    addr = (Multiaddr("/ip4/127.0.0.1/tcp/4001"),)
    known = [wire.KnownPeer(p, addr, True) for p in others] + [
        wire.KnownPeer(requester, addr), wire.KnownPeer(target, addr),
        wire.KnownPeer(peers(1)[0], ()),  # no address: never named
    ]
    reply = wire.answer(wire.find_node_request(target), known, requester)
    named = wire.closer_peers(reply)
    ids = [p.peer for p in named]
    assert target in ids and requester not in ids and len(ids) == 20
    assert all(p.addrs == addr for p in named)
    key = target.to_bytes()
    distances = [wire.distance(p.to_bytes(), key) for p in ids]
    assert distances == sorted(distances)


def test_ping_and_get_value_are_answered_writes_refused():
    (requester,) = peers(1)
    assert wire.answer(wire.ping_request(), [], requester).type == Message.PING
    reply = wire.answer(Message(type=Message.GET_VALUE, key=b"/pk/x"), [], requester)
    assert reply.type == Message.GET_VALUE and not reply.HasField("record")
    with pytest.raises(HivemindUnsupported, match="not supported by volunteer"):
        wire.answer(Message(type=Message.PUT_VALUE, key=b"k"), [], requester)
    with pytest.raises(RemoteProtocolError):
        wire.answer(Message(type=42), [], requester)


def test_closer_peers_drop_bad_ids_and_addresses():
    good = peers(1)[0]
    message = Message(type=Message.FIND_NODE)
    message.closerPeers.add(id=b"\xff" * 3, addrs=[Multiaddr("/ip4/1.2.3.4/tcp/1").to_bytes()])
    message.closerPeers.add(id=good.to_bytes(), addrs=[b"\xff\xff\xff", Multiaddr("/ip4/1.2.3.4/tcp/1").to_bytes()])
    (only,) = wire.closer_peers(message)
    assert only.peer == good and only.addrs == (Multiaddr("/ip4/1.2.3.4/tcp/1"),)


FIXED = KeyPair.generate().peer_id


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_fuzz_kad_messages_parse_or_raise_protocol_errors(data):
    requester = FIXED
    try:
        message = wire.parse_message(data)
    except RemoteProtocolError:
        return
    wire.closer_peers(message)
    try:
        wire.answer(message, [], requester)
    except (RemoteProtocolError, HivemindUnsupported):
        pass

