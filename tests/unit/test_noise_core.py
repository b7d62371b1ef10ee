"""Noise XX handshake and transport cores, paired without sockets (h11-style)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import HandshakeError, LocalProtocolError, PeerIDMismatch, RemoteProtocolError
from volunteer.net.identity import KeyPair
from volunteer.net.noise.handshake import CipherState, Handshake
from volunteer.net.noise.transport import NoiseTransport

ALICE, BOB = KeyPair.generate(), KeyPair.generate()


def body(framed: bytes) -> bytes:
    assert int.from_bytes(framed[:2], "big") == len(framed) - 2
    return framed[2:]


def handshake_pair(expected=None, muxers_a=("/yamux/1.0.0",), muxers_b=("/yamux/1.0.0",)):
    initiator = Handshake(True, ALICE, muxers_a, expected_peer=expected)
    responder = Handshake(False, BOB, muxers_b)
    m1 = initiator.write_message()
    responder.read_message(body(m1))
    m2 = responder.write_message()
    initiator.read_message(body(m2))
    m3 = initiator.write_message()
    responder.read_message(body(m3))
    return initiator, responder, (m1, m2, m3)


def test_handshake_authenticates_both_sides_and_inlines_muxers():
    initiator, responder, (m1, m2, m3) = handshake_pair(expected=BOB.peer_id)
    assert initiator.complete and responder.complete
    assert initiator.remote_peer == BOB.peer_id and responder.remote_peer == ALICE.peer_id
    assert initiator.remote_muxers == ["/yamux/1.0.0"] == responder.remote_muxers
    assert len(body(m1)) == 32  # e, empty payload unencrypted
    a_send, a_recv = initiator.split()
    b_send, b_recv = responder.split()
    a, b = NoiseTransport(a_send, a_recv), NoiseTransport(b_send, b_recv)
    assert b.receive_data(a.encrypt(b"hello bob")) == b"hello bob"
    assert a.receive_data(b.encrypt(b"hello alice")) == b"hello alice"


def test_wrong_peer_is_refused():
    with pytest.raises(PeerIDMismatch) as excinfo:
        handshake_pair(expected=KeyPair.generate().peer_id)
    assert str(BOB.peer_id) in str(excinfo.value)


def test_without_muxer_extension():
    initiator, responder, _ = handshake_pair(muxers_a=(), muxers_b=())
    assert initiator.remote_muxers == [] and responder.remote_muxers == []


@pytest.mark.parametrize("message", [1, 2])
def test_every_flipped_byte_of_message_2_and_3_is_detected(message):
    initiator = Handshake(True, ALICE)
    responder = Handshake(False, BOB)
    responder.read_message(body(initiator.write_message()))
    m2 = body(responder.write_message())
    if message == 1:
        targets, reader = m2, initiator
    else:
        initiator.read_message(m2)
        targets, reader = body(initiator.write_message()), responder
    # Flipping any byte of the encrypted parts must fail authentication (sample positions for speed).
    start = 32 if message == 1 else 0
    for index in range(start, len(targets), 7):
        tampered = bytearray(targets)
        tampered[index] ^= 0x01
        clone = _clone_reader(reader)
        with pytest.raises(HandshakeError):
            clone.read_message(bytes(tampered))


def _clone_reader(reader: Handshake) -> Handshake:
    import copy

    clone = copy.copy(reader)
    clone.state = copy.copy(reader.state)
    clone.state.cipher = copy.copy(reader.state.cipher)
    return clone


def test_truncated_and_out_of_turn_messages():
    initiator = Handshake(True, ALICE)
    responder = Handshake(False, BOB)
    with pytest.raises(HandshakeError):
        responder.read_message(b"\x00" * 10)  # too short for an ephemeral key
    with pytest.raises(LocalProtocolError):
        responder.write_message()  # not our turn
    responder = Handshake(False, BOB)
    responder.read_message(body(initiator.write_message()))
    m2 = body(responder.write_message())
    with pytest.raises(HandshakeError):
        initiator.read_message(m2[:60])


def test_transport_frames_large_data_and_partial_input():
    initiator, responder, _ = handshake_pair()
    a = NoiseTransport(*initiator.split())
    b = NoiseTransport(*responder.split())
    payload = bytes(range(256)) * 1000  # 256000 bytes: several 65519-byte frames
    wire = a.encrypt(payload)
    assert len(wire) == len(payload) + 4 * 18  # 4 frames, each 2 length + 16 tag bytes
    out = bytearray()
    for i in range(0, len(wire), 10_007):  # arbitrary chunking
        out += b.receive_data(wire[i : i + 10_007])
    assert bytes(out) == payload and b.pending == 0
    tampered = bytearray(a.encrypt(b"x" * 100))
    tampered[10] ^= 1
    with pytest.raises(RemoteProtocolError):
        b.receive_data(bytes(tampered))


def test_nonce_exhaustion_is_refused_before_reuse():
    cipher = CipherState(b"k" * 32, max_nonce=3)
    for _ in range(3):
        cipher.encrypt(None, b"x")
    with pytest.raises(LocalProtocolError):
        cipher.encrypt(None, b"x")
    initiator, responder, _ = handshake_pair()
    send, receive = initiator.split(max_nonce=2)
    transport = NoiseTransport(send, receive)
    transport.encrypt(b"a")
    with pytest.raises(LocalProtocolError):
        transport.encrypt(b"b" * 70000)  # would need nonces 1 and 2


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_first_message_to_responder(data):
    responder = Handshake(False, BOB)
    try:
        responder.read_message(data)
        responder.write_message()
    except HandshakeError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_random_second_message_to_initiator(data):
    initiator = Handshake(True, ALICE)
    initiator.write_message()
    try:
        initiator.read_message(data)
    except HandshakeError:
        pass


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_random_transport_bytes(data):
    initiator, responder, _ = handshake_pair()
    transport = NoiseTransport(*responder.split())
    try:
        transport.receive_data(data)
    except RemoteProtocolError:
        pass
    assert transport.pending <= len(data)
