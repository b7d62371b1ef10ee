"""NodeState.handle: the one path of every inbound request (rate limits, refusals, fairness), pure."""

from __future__ import annotations

import os

from volunteer.dht.config import DHTConfig
from volunteer.dht.messages import ErrorReply, Stored, decode_response, encode_request, unframe
from volunteer.dht.records import owned_subkey, sign
from volunteer.dht.state import NodeState, source_of
from volunteer.net.identity import KeyPair, PeerID
from volunteer.net.multiaddr import Multiaddr

NOW = 7000.0
A = ("ip4", "127.0.0.2")
B = ("ip4", "127.0.0.3")


def fake_peer() -> PeerID:
    return PeerID(b"\x12\x20" + os.urandom(32))


def ask(state: NodeState, sender: PeerID, request, now: float = NOW, source=None):
    config = state.config
    handled = state.handle(sender, unframe(encode_request(request, config), config), now, source=source)
    return handled, decode_response(unframe(handled.reply, config), config)


def test_requests_are_limited_per_peer_and_refusals_counted() -> None:
    state = NodeState(fake_peer(), DHTConfig(request_rate=1.0, request_burst=3))
    client = NodeState(fake_peer())
    peer = client.local
    replies = [ask(state, peer, client.ping_request(), source=A)[1] for _ in range(5)]
    assert [type(r).__name__ for r in replies] == ["Pong"] * 3 + ["ErrorReply"] * 2
    assert replies[-1].code == "rate-limited" and state.rejected["rate-limited"] == 2
    assert type(ask(state, fake_peer(), client.ping_request(), source=B)[1]).__name__ == "Pong"  # others served
    assert type(ask(state, peer, client.ping_request(), NOW + 1, source=A)[1]).__name__ == "Pong"  # refilled


def test_requests_are_limited_per_source_address() -> None:
    # identities are free to mint: many peers from one address share that address's bucket
    state = NodeState(fake_peer(), DHTConfig(source_request_rate=1.0, source_request_burst=4))
    client = NodeState(fake_peer())
    replies = [ask(state, fake_peer(), client.ping_request(), source=A)[1] for _ in range(6)]
    assert sum(isinstance(r, ErrorReply) for r in replies) == 2
    assert not isinstance(ask(state, fake_peer(), client.ping_request(), source=B)[1], ErrorReply)
    assert state.rejected == {"rate-limited": 2}


def test_stored_records_are_limited_per_peer_and_address() -> None:
    config = DHTConfig(store_rate=1.0, store_burst=4, source_store_rate=1.0, source_store_burst=6)
    state = NodeState(fake_peer(), config)
    kps = [KeyPair.generate() for _ in range(3)]
    records = [[sign(kp, bytes([i]), owned_subkey(kp.peer_id), b"v", NOW + 60) for i in range(4)] for kp in kps]
    client = NodeState(fake_peer())
    _, reply = ask(state, kps[0].peer_id, client.store_request(records[0]), source=A)
    assert isinstance(reply, Stored) and reply.codes == ("ok",) * 4
    _, reply = ask(state, kps[0].peer_id, client.store_request(records[0][:1]), source=B)
    assert isinstance(reply, ErrorReply) and reply.code == "rate-limited"  # the peer's bucket is empty
    _, reply = ask(state, kps[1].peer_id, client.store_request(records[1]), source=A)
    assert isinstance(reply, ErrorReply)  # a fresh identity, but the address has 2 of 6 left
    _, reply = ask(state, kps[2].peer_id, client.store_request(records[2]), source=B)
    assert isinstance(reply, Stored)
    assert state.rejected["store-flood"] == 5 and len(state.storage) == 8


def test_store_refusals_are_counted_by_code_and_fairness_sees_the_source() -> None:
    state = NodeState(fake_peer(), DHTConfig(max_subkeys_per_signer_per_key=2))
    squatter = KeyPair.generate()
    squat = [sign(squatter, b"ffn.", owned_subkey(squatter.peer_id, bytes([i])), b"v", NOW + 3000) for i in range(5)]
    stale = sign(squatter, b"x", owned_subkey(squatter.peer_id), b"v", NOW - 1)
    handled, reply = ask(state, squatter.peer_id, NodeState(fake_peer()).store_request([*squat, stale]), source=A)
    assert reply.codes == ("ok", "ok", "signer-share", "signer-share", "signer-share", "expired")
    assert state.rejected == {"signer-share": 3, "expired": 1}
    assert state.storage.holders(b"ffn.")[1] == {A: 2}


def test_oversized_and_malformed_requests_are_counted() -> None:
    state = NodeState(fake_peer(), DHTConfig(max_message_size=1000))
    assert state.accept_length(1000) and not state.accept_length(1001)
    handled = state.handle(fake_peer(), b"\xc1", NOW, source=A)
    assert handled.error is not None
    assert state.rejected == {"too-large": 1, "malformed": 1}


def test_source_of_groups_by_address() -> None:
    relay = fake_peer()
    target = fake_peer()
    assert source_of(Multiaddr("/ip4/127.0.0.2/tcp/4001")) == ("ip4", "127.0.0.2")
    assert source_of(Multiaddr("/ip4/127.0.0.2/tcp/5000")) == source_of(Multiaddr("/ip4/127.0.0.2/tcp/4001"))
    assert source_of(Multiaddr("/ip6/2001:db8:1:2::5/tcp/1")) == source_of(Multiaddr("/ip6/2001:db8:1:2:ffff::9/tcp/1"))
    assert source_of(Multiaddr("/ip6/2001:db8:1:2::5/tcp/1")) != source_of(Multiaddr("/ip6/2001:db8:1:3::5/tcp/1"))
    circuit = Multiaddr(f"/ip4/1.2.3.4/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{target}")
    assert source_of(circuit) == ("relay", str(relay))  # relayed: the relay is the source
    assert source_of(Multiaddr("/memory/7")) == ("addr", "/memory/7")
    assert source_of(None) is None
