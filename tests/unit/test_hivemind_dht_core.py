"""hivemind's DHT protocol core and storage, sans-I/O: store rules (later expiration wins,
sub-keys, dictionaries), bounds, client mode, find answers, and fuzzing of every request decoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import RemoteProtocolError
from volunteer.hivemind.dht_protocol import DHTProtocolCore, StoreItem, merge
from volunteer.hivemind.dhtid import key_id, random_id
from volunteer.hivemind.errors import HivemindUnsupported
from volunteer.hivemind.limits import DHTLimits
from volunteer.hivemind.lookup import Lookup
from volunteer.hivemind.pb import hm_dht_pb2 as pb
from volunteer.hivemind.serializer import DictionaryValue, ValueWithExpiration, dumps
from volunteer.hivemind.storage import Contact, Contacts, Storage
from volunteer.net.identity import KeyPair

NOW = 1_000_000.0
ALICE, BOB = KeyPair.from_seed(b"a" * 32).peer_id, KeyPair.from_seed(b"b" * 32).peer_id


def pair():
    return DHTProtocolCore(random_id()), DHTProtocolCore(random_id())


def test_store_then_find_between_two_cores():
    server, client = pair()
    items = [StoreItem(key_id("k"), dumps("v"), NOW + 10), StoreItem(key_id("d"), dumps(1), NOW + 10, "sub", True)]
    stored = client.read_store(ALICE, server.handle_store(client.store_request(items), BOB, NOW), 2)
    assert stored == [True, True]
    # the store carried the client's node id: it is now the server's contact, and vice versa
    assert server.contacts.node_of(BOB) == client.node_id and client.contacts.node_of(ALICE) == server.node_id
    keys = [key_id("k"), key_id("d"), key_id("none")]
    answers = client.read_find(ALICE, server.handle_find(client.find_request(keys), BOB, NOW), keys)
    assert answers[0].value == ValueWithExpiration(dumps("v"), NOW + 10)
    assert isinstance(answers[1].value.value, DictionaryValue) and answers[1].value.value.items["sub"].value == dumps(1)
    assert answers[2].value is None
    # the requester is not among the nearest contacts it is sent
    assert all(c.peer != BOB for a in answers for c in a.nearest)


def test_storage_rules_match_hivemind():
    storage = Storage()
    assert storage.store(1, b"a", NOW + 10, NOW)
    assert not storage.store(1, b"b", NOW + 5, NOW)  # older loses
    assert storage.store(1, b"c", NOW + 20, NOW)
    assert not storage.store(2, b"x", NOW - 1, NOW)  # already expired
    # a sub-key store replaces a regular value that expires sooner, and is refused by a later one
    assert storage.store_subkey(1, "s", b"d", NOW + 30, NOW)
    assert isinstance(storage.get(1, NOW).value, DictionaryValue)
    assert storage.store(3, b"r", NOW + 100, NOW)
    assert not storage.store_subkey(3, "s", b"d", NOW + 50, NOW)
    # expired values go
    assert storage.get(1, NOW + 31) is None
    assert storage.stored_bytes == 1 + storage.limits.entry_overhead  # key 3's value, and what keeps it


def test_storage_bounds():
    limits = DHTLimits(max_stored_keys=2, max_value_bytes=4, max_subkeys=1, max_expiration_ahead=100)
    storage = Storage(limits)
    assert not storage.store(1, b"12345", NOW + 1, NOW)
    assert storage.store(1, b"1", NOW + 1, NOW) and storage.store(2, b"2", NOW + 1, NOW)
    assert not storage.store(3, b"3", NOW + 1, NOW)
    assert storage.store(3, b"3", NOW + 5, NOW + 2)  # room once the others expired
    assert storage.store_subkey(4, "a", b"x", NOW + 10, NOW + 2)
    assert not storage.store_subkey(4, "b", b"y", NOW + 10, NOW + 2)
    # a far-future expiration is capped relative to our clock; NaN and infinity are refused
    assert storage.store(5, b"far", NOW + 10**9, NOW + 9)
    assert storage.get(5, NOW + 9).expiration_time == NOW + 9 + 100
    assert not storage.store(6, b"n", float("nan"), NOW + 9)
    assert not storage.store_subkey(6, "s", b"n", float("inf"), NOW + 9)


def test_contacts_are_bounded_and_nearest_first():
    contacts = Contacts(0, DHTLimits(max_contacts=2))
    assert contacts.add(4, ALICE) and contacts.add(1, BOB)
    carol = KeyPair.from_seed(b"c" * 32).peer_id
    assert not contacts.add(2, carol)  # full of live contacts
    contacts.mark_failed(ALICE)
    assert contacts.add(2, carol)  # replaced the one that failed
    assert [c.node_id for c in contacts.nearest(0, 5)] == [1, 2]
    assert contacts.nearest(0, 5, exclude=1) == [Contact(2, carol)]


def test_client_mode_sends_no_node_id():
    client = DHTProtocolCore(random_id(), client_mode=True)
    assert pb.PingRequest.FromString(client.ping_request()).peer.node_id == b""


def test_authorized_requests_are_refused_clearly():
    server, _ = pair()
    with pytest.raises(HivemindUnsupported, match="authorizer"):
        server.handle_find(pb.FindRequest(auth=b"token").SerializeToString(), BOB, NOW)


def test_too_many_keys_are_refused():
    server = DHTProtocolCore(random_id(), DHTLimits(max_keys_per_request=2))
    request = pb.FindRequest(keys=[bytes(20)] * 3).SerializeToString()
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        server.handle_find(request, BOB, NOW)


def test_merge_prefers_later_and_merges_dictionaries():
    a, b = DictionaryValue(), DictionaryValue()
    a.store("x", b"1", 10)
    b.store("y", b"2", 20)
    merged = merge(ValueWithExpiration(a, 10), ValueWithExpiration(b, 20))
    assert set(merged.value.items) == {"x", "y"} and merged.expiration_time == 20
    assert merge(ValueWithExpiration(b"old", 1), ValueWithExpiration(b"new", 2)).value == b"new"
    assert merge(None, None) is None


def test_lookup_asks_nearest_first_and_stops():
    contacts = [Contact(n, KeyPair.from_seed(bytes([n]) * 32).peer_id) for n in (8, 4, 2)]
    lookup = Lookup(0, contacts, k=2, alpha=1, max_rounds=10, local_id=99)
    first = lookup.next_batch()
    assert [c.node_id for c in first] == [2]
    lookup.on_failure(first[0].peer)
    second = lookup.next_batch()
    assert [c.node_id for c in second] == [4]
    from volunteer.hivemind.dht_protocol import FindAnswer

    lookup.on_answer(second[0].peer, FindAnswer(ValueWithExpiration(b"v", 5), [Contact(1, ALICE)]))
    assert [c.node_id for c in lookup.next_batch()] == [1]
    lookup.on_answer(ALICE, FindAnswer(None, []))
    assert lookup.next_batch() == []
    assert lookup.value.value == b"v" and [c.node_id for c in lookup.nearest(5)] == [1, 4]


FUZZ = settings(max_examples=300, deadline=None)


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_request_decoders(data):
    server = DHTProtocolCore(random_id(), DHTLimits(max_keys_per_request=8))
    for handle in (server.handle_store, server.handle_find):
        try:
            handle(data, BOB, NOW)
        except RemoteProtocolError:
            pass
        except HivemindUnsupported:
            pass
    try:
        server.parse_ping(data)
    except (RemoteProtocolError, HivemindUnsupported):
        pass


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_response_decoders(data):
    client = DHTProtocolCore(random_id())
    for read in (lambda: client.read_ping(ALICE, data), lambda: client.read_store(ALICE, data, 1),
                 lambda: client.read_find(ALICE, data, [1])):
        try:
            read()
        except RemoteProtocolError:
            pass


@FUZZ
@given(st.lists(st.tuples(st.binary(min_size=20, max_size=20), st.binary(max_size=40), st.binary(max_size=40),
                          st.floats(allow_nan=True)), max_size=6))
@pytest.mark.slow
def test_fuzz_store_requests_with_odd_tags_and_values(entries):
    server = DHTProtocolCore(random_id())
    request = pb.StoreRequest(
        keys=[e[0] for e in entries], subkeys=[e[1] for e in entries], values=[e[2] for e in entries],
        expiration_time=[e[3] for e in entries], in_cache=[False] * len(entries),
    )
    try:
        response = pb.StoreResponse.FromString(server.handle_store(request.SerializeToString(), BOB, NOW))
        assert len(response.store_ok) == len(entries)
    except RemoteProtocolError:
        pass
