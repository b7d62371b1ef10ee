"""Tombstone forwarding to caching readers (watch.py, NodeState.handle, messages) and STOREs that
answer as a FIND_NODE (a store's lookup), pure."""

from __future__ import annotations

import os
from dataclasses import replace

import msgpack
import pytest

from volunteer.dht.caches import RecentValues
from volunteer.dht.config import DHTConfig
from volunteer.dht.messages import FindValue, decode_request, encode_request, unframe
from volunteer.dht.records import owned_subkey, sign
from volunteer.dht.routing import Contact
from volunteer.dht.state import NodeState
from volunteer.dht.watch import Watchers, forwards
from volunteer.net.identity import KeyPair, PeerID

NOW = 5000.0
CONFIG = DHTConfig(watch_age=10.0, max_watched_keys=3, max_watchers_per_key=2)


def reader() -> Contact:
    return Contact(PeerID(b"\x12\x20" + os.urandom(32)), (b"/r",))


def test_watchers_lapse_and_stay_bounded() -> None:
    watchers = Watchers(CONFIG)
    a, b, c = reader(), reader(), reader()
    watchers.watch(b"k", a, NOW)
    watchers.watch(b"k", b, NOW + 5)
    assert watchers.watching(b"k", NOW + 9) == [a, b]
    assert watchers.watching(b"k", NOW + 9, exclude=[a.peer]) == [b]
    assert watchers.watching(b"k", NOW + 10) == [b]  # a's watch lapsed
    watchers.watch(b"k", a, NOW + 10)
    watchers.watch(b"k", c, NOW + 10)  # a third reader: the oldest (b) is dropped
    assert watchers.watching(b"k", NOW + 11) == [a, c]
    for key in (b"x", b"y", b"z"):  # a fourth key: the least recently watched (k) is forgotten
        watchers.watch(key, a, NOW + 11)
    assert len(watchers) == 3 and watchers.watching(b"k", NOW + 11) == []
    assert watchers.watching(b"x", NOW + 30) == [] and len(watchers) == 2  # lapsed keys are dropped


def test_forwards_only_tombstones_once_per_reader() -> None:
    kp = KeyPair.generate()
    watchers = Watchers(CONFIG)
    a, b = reader(), reader()
    watchers.watch(b"k1", a, NOW)
    watchers.watch(b"k2", a, NOW)
    watchers.watch(b"k2", b, NOW)
    tomb1 = sign(kp, b"k1", owned_subkey(kp.peer_id), None, NOW + 15)
    tomb2 = sign(kp, b"k2", owned_subkey(kp.peer_id), None, NOW + 15)
    value = sign(kp, b"k1", owned_subkey(kp.peer_id, b"x"), b"v", NOW + 15)
    out = dict((c.peer, records) for c, records in forwards(watchers, [tomb1, tomb2, value], NOW))
    assert out == {a.peer: [tomb1, tomb2], b.peer: [tomb2]}
    assert forwards(watchers, [tomb2], NOW, exclude=[a.peer, b.peer]) == []  # never back to the sender
    assert forwards(watchers, [value], NOW) == []  # heartbeats are not pushed


def ask(state: NodeState, sender: PeerID, request):
    return state.handle(sender, unframe(encode_request(request, state.config), state.config), NOW)


def test_handle_forwards_tombstones_to_watching_readers() -> None:
    holder = NodeState(PeerID(b"\x12\x20" + os.urandom(32)), CONFIG)
    trainer, other = NodeState(reader().peer), NodeState(reader().peer)
    leaver = KeyPair.generate()
    declared = sign(leaver, b"ffn.1.", owned_subkey(leaver.peer_id), b"decl", NOW + 15)
    assert ask(holder, leaver.peer_id, NodeState(leaver.peer_id).store_request([declared])).forward == []
    ask(holder, trainer.local, trainer.find_value_request([b"ffn.1."], watch=True))
    ask(holder, other.local, other.find_value_request([b"ffn.1."]))  # does not cache: not told
    tomb = sign(leaver, b"ffn.1.", owned_subkey(leaver.peer_id), None, NOW + 15)
    handled = ask(holder, leaver.peer_id, NodeState(leaver.peer_id).store_request([tomb]))
    assert [(c.peer, records) for c, records in handled.forward] == [(trainer.local, [tomb])]
    assert handled.invalidated == [b"ffn.1."]
    # the same tombstone again: nothing new to forward, but it still proves the key changed
    again = ask(holder, leaver.peer_id, NodeState(leaver.peer_id).store_request([tomb]))
    assert again.forward == [] and again.invalidated == [b"ffn.1."]
    # a forged tombstone (the leaver's signature over another key) invalidates nothing
    forged = replace(tomb, key=b"ffn.2.")
    ask(holder, trainer.local, trainer.find_value_request([b"ffn.2."], watch=True))
    refused = ask(holder, leaver.peer_id, NodeState(leaver.peer_id).store_request([forged]))
    assert refused.forward == [] and refused.invalidated == []


def test_watch_flag_on_the_wire() -> None:
    request = FindValue((b"k",), False, (), True)
    assert decode_request(unframe(encode_request(request, CONFIG), CONFIG), CONFIG) == request
    plain = msgpack.packb({"op": "find_value", "ks": [b"k"]})  # a peer that predates the flag
    assert decode_request(plain, CONFIG).watch is False
    holder = NodeState(reader().peer, CONFIG)
    bad = msgpack.packb({"op": "find_value", "ks": [b"k"], "wt": 1})
    assert holder.handle(reader().peer, bad, NOW).error is not None and holder.rejected["malformed"] == 1
    assert len(holder.watchers) == 0


def test_recent_values_drop_answers_older_than_a_forget() -> None:
    cache = RecentValues()
    started = cache.generation
    cache.forget(b"k")  # a tombstone arrived while the lookup was out
    cache.put(b"k", {}, NOW, since=started)
    assert cache.get(b"k", NOW, max_age=5) is None
    cache.put(b"k", {}, NOW, since=cache.generation)
    assert cache.get(b"k", NOW, max_age=5) == {}


def test_config_keeps_watches_at_least_as_long_as_the_cache() -> None:
    with pytest.raises(ValueError):
        DHTConfig(expert_cache_age=5.0, watch_age=4.0)


def test_store_answers_as_a_find_node_when_asked() -> None:
    from volunteer.dht.messages import Stored, decode_response
    from volunteer.dht.routing import key_id

    holder = NodeState(reader().peer, CONFIG)
    known = [reader() for _ in range(4)]
    for contact in known:
        holder.table.update(contact, NOW)
    kp = KeyPair.generate()
    writer = NodeState(kp.peer_id)
    record = sign(kp, b"key", owned_subkey(kp.peer_id), b"v", NOW + 60)
    asked = writer.store_request([record], near=key_id(b"key"))
    assert decode_request(unframe(encode_request(asked, CONFIG), CONFIG), CONFIG) == asked  # round trip
    handled = ask(holder, kp.peer_id, asked)
    reply = decode_response(unframe(handled.reply, CONFIG), CONFIG, asked)
    assert isinstance(reply, Stored) and reply.codes == ("ok",)
    assert {c.peer for c in reply.closer} == {c.peer for c in known}  # the closest it knows, not the writer
    plain = ask(holder, kp.peer_id, writer.store_request([record]))
    assert decode_response(unframe(plain.reply, CONFIG), CONFIG).closer == ()  # not asked: no contacts
    bad = msgpack.packb({"op": "store", "rs": [], "nr": b"short"})
    assert holder.handle(kp.peer_id, bad, NOW).error is not None
