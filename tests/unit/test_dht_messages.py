"""DHT wire format and request handling: round trips, strict decoding, typed errors only."""

from __future__ import annotations

import os

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from volunteer.dht.config import DHTConfig, protocol_id
from volunteer.dht.messages import (
    ErrorReply,
    FindNode,
    FindValue,
    KeyResult,
    Nodes,
    Ping,
    Pong,
    Store,
    Stored,
    Values,
    check_reply,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    frame,
    unframe,
)
from volunteer.dht.records import owned_subkey, sign
from volunteer.dht.routing import Contact, id_to_bytes, key_id
from volunteer.dht.state import NodeState
from volunteer.errors import DHTError, DHTMessageError, DHTRemoteError, LocalProtocolError
from volunteer.net.identity import KeyPair, PeerID

CONFIG = DHTConfig()
NOW = 5000.0
KP = KeyPair.generate()
RECORD = sign(KP, b"ffn.1.", owned_subkey(KP.peer_id), b"value", NOW + 15)
TOMB = sign(KP, b"ffn.2.", owned_subkey(KP.peer_id), None, NOW + 15)


def fake_peer() -> PeerID:
    return PeerID(b"\x12\x20" + os.urandom(32))


CONTACTS = tuple(Contact(fake_peer(), (b"\x04\x7f\x00\x00\x01\x06\x0f\xa1",)) for _ in range(3))

REQUESTS = [
    Ping(),
    Ping(True, (b"/addr",)),
    Store((RECORD, TOMB), False, (b"a", b"b")),
    FindNode(b"\x01" * 32),
    FindValue((b"ffn.1.", b"ffn.2."), True),
]
RESPONSES = [
    (REQUESTS[0], Pong(True)),
    (REQUESTS[2], Stored(("ok", "stale"))),
    (REQUESTS[3], Nodes(CONTACTS)),
    (
        REQUESTS[4],
        Values((KeyResult((RECORD,), CONTACTS[:2]), KeyResult((TOMB,), CONTACTS[1:])), False),
    ),
    (REQUESTS[0], ErrorReply("malformed", "bad")),
]


def body(data: bytes) -> bytes:
    return unframe(data, CONFIG)


def request_body(request) -> bytes:
    return body(encode_request(request, CONFIG))


def test_protocol_id() -> None:
    assert CONFIG.protocol_id == protocol_id("default") == "/volunteer/default/dht/1.0.0"
    with pytest.raises(ValueError):
        DHTConfig(swarm_id="a/b")
    with pytest.raises(ValueError):
        DHTConfig(k=0)


@pytest.mark.parametrize("request_", REQUESTS)
def test_request_round_trip(request_) -> None:
    assert decode_request(body(encode_request(request_, CONFIG)), CONFIG) == request_


@pytest.mark.parametrize("request_,response", RESPONSES)
def test_response_round_trip(request_, response) -> None:
    decoded = decode_response(body(encode_response(response, CONFIG)), CONFIG, request_)
    assert decoded == response


def test_values_share_one_contact_table() -> None:
    data = body(encode_response(RESPONSES[3][1], CONFIG))
    msg = msgpack.unpackb(data)
    assert len(msg["ps"]) == 3 and msg["vs"][0][1] == [0, 1] and msg["vs"][1][1] == [1, 2]


def test_reply_must_match_request() -> None:
    with pytest.raises(DHTMessageError):
        check_reply(Ping(), Nodes(()))
    with pytest.raises(DHTMessageError):
        check_reply(REQUESTS[2], Stored(("ok",)))
    with pytest.raises(DHTMessageError):
        check_reply(REQUESTS[4], Values((KeyResult((), ()),)))
    with pytest.raises(DHTMessageError):  # records of a key that was not asked for
        check_reply(FindValue((b"x", b"y")), Values((KeyResult((RECORD,), ()), KeyResult((), ()))))


def test_frame_bounds() -> None:
    assert unframe(frame(b"abc"), CONFIG) == b"abc"
    for bad in (b"", b"\x80", frame(b"abc")[:-1], frame(b"abc") + b"x", b"\xff" * 10):
        with pytest.raises(DHTMessageError):
            unframe(bad, CONFIG)
    small = DHTConfig(max_message_size=10)
    with pytest.raises(DHTMessageError):
        unframe(frame(b"x" * 11), small)
    with pytest.raises(LocalProtocolError):
        encode_request(FindValue((b"k" * 100,)), small)
    with pytest.raises(LocalProtocolError):
        encode_request(FindNode(b"short"), CONFIG)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


BAD_REQUESTS = [
    pack([1, 2]),
    pack({"op": 3}),
    pack({"op": "nope"}),
    pack({"op": "ping", "cm": "yes"}),
    pack({"op": "ping", "ad": [1]}),
    pack({"op": "ping", "ad": [b"x" * 2000]}),
    pack({"op": "ping", "ad": [b"x"] * 100}),
    pack({"op": "find_node", "tg": b"short"}),
    pack({"op": "find_node"}),
    pack({"op": "find_value", "ks": []}),
    pack({"op": "find_value", "ks": [b"k" * 300]}),
    pack({"op": "find_value", "ks": ["text"]}),
    pack({"op": "find_value", "ks": [b"k"] * 65}),
    pack({"op": "store", "rs": [[b"k", b"s", b"v", 1, b"p", b"s"]]}),  # int expiration
    pack({"op": "store", "rs": [[b"k", b"s", b"v", 1.0, b"not a peer", b"s"]]}),
    pack({"op": "store", "rs": [[b"k", b"s", b"v", float("nan"), KP.peer_id.to_bytes(), b"s"]]}),
    pack({"op": "store", "rs": [[b"k", b"s", "str", 1.0, KP.peer_id.to_bytes(), b"s"]]}),
    pack({"op": "store", "rs": [[b"k", b"s"]]}),
    pack({"op": "store", "rs": [[b"k", b"s", b"v" * 9000, 1.0, KP.peer_id.to_bytes(), b"s"]]}),
    pack({1: 2}),
    b"\xc1",  # never-used byte
    b"\x92\x01",  # truncated array
    pack({"op": "ping"}) + b"\x00",  # trailing data
    msgpack.packb(msgpack.ExtType(5, b"xx")),
    b"\x91" * 5000,  # deep nesting
]


# numbered, not named by their bytes: some hold a key made at import, and every pytest-xdist
# worker must collect the same names
@pytest.mark.parametrize("data", BAD_REQUESTS, ids=range(len(BAD_REQUESTS)))
def test_bad_requests_are_typed_errors(data: bytes) -> None:
    with pytest.raises(DHTMessageError) as info:
        decode_request(data, CONFIG)
    assert info.value.hint


BAD_RESPONSES = [
    pack({"op": "nodes", "ps": [[b"bad", []]]}),
    pack({"op": "nodes", "ps": [[KP.peer_id.to_bytes()]]}),
    pack({"op": "values", "ps": [], "vs": [[[], [0]]]}),  # index out of range
    pack({"op": "values", "ps": [], "vs": [[[], [True]]]}),
    pack({"op": "values", "ps": [], "vs": [[[]]]}),
    pack({"op": "stored", "ok": [1]}),
    pack({"op": "error"}),
    pack({"op": "pong", "cm": 1}),
]


@pytest.mark.parametrize("data", BAD_RESPONSES, ids=range(len(BAD_RESPONSES)))
def test_bad_responses_are_typed_errors(data: bytes) -> None:
    with pytest.raises(DHTMessageError):
        decode_response(data, CONFIG)


# --- property tests ---------------------------------------------------------------------------
SMALL = DHTConfig(max_message_size=4096, max_records_per_request=16, max_contacts=16)
VALID = [body(encode_request(r, CONFIG)) for r in REQUESTS] + [
    body(encode_response(r, CONFIG)) for _, r in RESPONSES
]


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_random_bytes_only_typed_errors(data: bytes) -> None:
    for decode in (decode_request, decode_response):
        try:
            decode(data, SMALL)
        except DHTMessageError:
            pass


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.data())
def test_mutated_messages_only_typed_errors(original: bytes, data) -> None:
    mutated = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        if not mutated:
            break
        pos = data.draw(st.integers(0, len(mutated) - 1))
        mutated[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(mutated)))
    for candidate in (bytes(mutated), bytes(mutated[:cut])):
        for decode in (decode_request, decode_response):
            try:
                decode(candidate, CONFIG)
            except DHTMessageError:
                pass


FIELDS = st.sampled_from(["op", "cm", "ad", "rs", "tg", "ks", "ps", "vs", "ok", "code", "msg"])


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats()
        | st.binary(max_size=40)
        | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=6) | st.dictionaries(FIELDS, inner, max_size=6),
        max_leaves=30,
    ),
    st.sampled_from(["ping", "store", "find_node", "find_value", "pong", "stored", "nodes", "values", "error"]),
)
@pytest.mark.slow
def test_structured_garbage_only_typed_errors(obj, op) -> None:
    if isinstance(obj, dict):
        obj = {**obj, "op": op}
    data = pack(obj)
    for decode in (decode_request, decode_response):
        try:
            decode(data, CONFIG)
        except DHTMessageError:
            pass


# --- request handling (NodeState) -----------------------------------------------------------------
def test_handle_garbage_answers_typed_error_reply() -> None:
    state = NodeState(KeyPair.generate().peer_id, CONFIG)
    handled = state.handle(fake_peer(), b"\xc1garbage", NOW)
    assert isinstance(handled.error, DHTMessageError)
    reply = decode_response(body(handled.reply), CONFIG)
    assert isinstance(reply, ErrorReply) and reply.code == "malformed"
    assert len(state.table) == 0  # a peer that sent garbage is not added


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=512))
def test_handle_never_raises(data: bytes) -> None:
    state = NodeState(KP.peer_id, CONFIG)
    handled = state.handle(fake_peer(), data, NOW)
    assert handled.error is None or isinstance(handled.error, DHTError)
    decode_response(body(handled.reply), CONFIG)


def test_store_find_value_and_find_node_through_bytes() -> None:
    server = NodeState(fake_peer(), CONFIG, addrs=[b"/server"])
    client = NodeState(fake_peer(), CONFIG, client_mode=True)
    others = [Contact(fake_peer(), (b"/o",)) for _ in range(40)]
    for c in others:
        server.table.update(c, NOW)
    known = [e.contact for e in server.table.entries()]  # a full bucket may have left some out

    store = client.store_request([RECORD, TOMB, sign(KP, b"x", owned_subkey(KP.peer_id), b"v", NOW - 1)])
    handled = server.handle(client.local, body(encode_request(store, CONFIG)), NOW)
    reply = decode_response(body(handled.reply), CONFIG, store)
    assert reply.codes == ("ok", "ok", "expired")
    assert client.local not in server.table  # client mode: served, never inserted

    find = client.find_value_request([b"ffn.1.", b"nothing"])
    reply = decode_response(body(server.handle(client.local, request_body(find), NOW).reply), CONFIG, find)
    assert reply.results[0].records == (RECORD,) and reply.results[1].records == ()
    want = sorted(known, key=lambda c: c.id ^ key_id(b"nothing"))[: CONFIG.reply_contacts]
    assert list(reply.results[1].closer) == want

    target = key_id(b"somewhere")
    find_node = client.find_node_request(target)
    assert find_node.target == id_to_bytes(target)
    reply = decode_response(body(server.handle(client.local, request_body(find_node), NOW).reply), CONFIG)
    assert list(reply.peers) == sorted(known, key=lambda c: c.id ^ target)[: CONFIG.reply_contacts]

    # a server-mode requester joins the table, with the addresses it sent
    fresh = NodeState(fake_peer(), CONFIG)  # an empty table: no full bucket in the way
    peer = NodeState(fake_peer(), CONFIG, addrs=[b"/peer"])
    fresh.handle(peer.local, request_body(peer.ping_request()), NOW)
    assert fresh.table.get(peer.local).contact.addrs == (b"/peer",)


def test_values_reply_fits_the_message_bound() -> None:
    config = DHTConfig(max_message_size=20_000)
    server = NodeState(fake_peer(), config)
    signers = [KeyPair.generate() for _ in range(40)]
    for kp in signers:
        for key in (b"a", b"b"):
            server.storage.store(sign(kp, key, owned_subkey(kp.peer_id), b"v" * 400, NOW + 10), NOW)
    # 40 contacts in the table: a random ID past a full bucket is not kept, and 40 random ones
    # left 30 or fewer (fewer than reply_contacts once) in 20 tables of 20,000, so add until 40 stay
    for _ in range(400):
        if len(server.table) >= 40:
            break
        server.table.update(Contact(fake_peer(), (b"/x" * 20,)), NOW)
    assert len(server.table) >= 40
    request = FindValue((b"a", b"b"))
    handled = server.handle(fake_peer(), body(encode_request(request, config)), NOW)
    assert len(handled.reply) <= config.max_message_size + 4
    reply = decode_response(body(handled.reply), config, request)
    assert 0 < len(reply.results[0].records) < 40  # truncated, freshest first
    assert len(reply.results[1].closer) == config.reply_contacts


def test_on_reply_updates_table_and_raises_remote_errors() -> None:
    state = NodeState(fake_peer(), CONFIG)
    contact = Contact(fake_peer(), (b"/c",))
    assert state.on_reply(contact, Ping(), Pong(), NOW) == []
    assert contact.peer in state.table
    with pytest.raises(DHTRemoteError) as info:
        state.on_reply(contact, Ping(), ErrorReply("busy", "later"), NOW)
    assert info.value.code == "busy"
    with pytest.raises(DHTMessageError):
        state.on_reply(contact, Ping(), Nodes(()), NOW)
    state.on_reply(Contact(fake_peer()), Ping(), Pong(client_mode=True), NOW)
    assert len(state.table) == 1


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.sampled_from([request_body(r) for r in REQUESTS]), st.data())
def test_handle_mutated_requests_only_typed_errors(original: bytes, data) -> None:
    state = NodeState(KP.peer_id, CONFIG)
    mutated = bytearray(original)
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(mutated) - 1))
        mutated[pos] = data.draw(st.integers(0, 255))
    handled = state.handle(fake_peer(), bytes(mutated), NOW)
    assert handled.error is None or isinstance(handled.error, DHTMessageError)
    decode_response(body(handled.reply), CONFIG)
