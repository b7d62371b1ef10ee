"""Noise XX handshake core, two cores paired without sockets (h11-style)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import HandshakeError, LocalProtocolError, PeerIDMismatch
from volunteer.net.identity import KeyPair
from volunteer.net.noise import SIGNATURE_PREFIX, Handshake, encode_payload, verify_payload
from volunteer.net.noise.handshake import public_bytes
from volunteer.net.pb import noise_pb2

ALICE = KeyPair.generate()
BOB = KeyPair.generate()
YAMUX = "/yamux/1.0.0"


def fixed_key(byte: int) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(bytes([byte]) * 32)


def pair(expected=None, muxers_a=(YAMUX,), muxers_b=(YAMUX,), cls_a=Handshake, cls_b=Handshake):
    """Deterministic handshakes (fixed X25519 keys): the same messages every time."""
    initiator = cls_a(True, ALICE, muxers_a, expected, static_key=fixed_key(1), ephemeral_key=fixed_key(2))
    responder = cls_b(False, BOB, muxers_b, static_key=fixed_key(3), ephemeral_key=fixed_key(4))
    return initiator, responder


def run(initiator: Handshake, responder: Handshake) -> tuple[bytes, bytes, bytes]:
    m1 = initiator.write_message()
    assert responder.receive_data(m1)
    m2 = responder.write_message()
    assert initiator.receive_data(m2)
    m3 = initiator.write_message()
    assert responder.receive_data(m3)
    return m1, m2, m3


def body(framed: bytes) -> bytes:
    assert int.from_bytes(framed[:2], "big") == len(framed) - 2
    return framed[2:]


# --- the Noise core against the cacophony test vector ----------------------------------------
# Noise_XX_25519_ChaChaPoly_SHA256 from the cacophony vectors (prologue "John Galt"): checks
# MixHash/MixKey/HKDF, the DH order and the split, byte for byte.
VECTOR = {
    "prologue": "4a6f686e2047616c74",
    "init_static": "e61ef9919cde45dd5f82166404bd08e38bceb5dfdfded0a34c8df7ed542214d1",
    "init_ephemeral": "893e28b9dc6ca8d611ab664754b8ceb7bac5117349a4439a6b0569da977c464a",
    "resp_static": "4a3acbfdb163dec651dfa3194dece676d437029c62a408b4c5ea9114246e4893",
    "resp_ephemeral": "bbdb4cdbd309f1a1f2e1456967fe288cadd6f712d65dc7b7793d5e63da6b375b",
    "handshake_hash": "c8e5f64e846193be2a834104c2a009868d6c9f3bd3c186299888b488b2f1f58e",
    "messages": [
        ("4c756477696720766f6e204d69736573", "ca35def5ae56cec33dc2036731ab14896bc4c75dbb07a61f879f8e3afa4c79444c756477696720766f6e204d69736573"),
        (
            "4d757272617920526f746862617264",
            "95ebc60d2b1fa672c1f46a8aa265ef51bfe38e7ccb39ec5be34069f14480884381cbad1f276e038c48378ffce2b65285e08d6b68"
            "aaa3629a5a8639392490e5b9bd5269c2f1e4f488ed8831161f19b7815528f8982ffe09be9b5c412f8a0db50f8814c7194e83f23dbd8d162c9326ad",
        ),
        (
            "462e20412e20486179656b",
            "c7195ffacac1307ff99046f219750fc47693e23c3cb08b89c2af808b444850a80ae475b9df0f169ae80a89be0865b57f58c9fea0d4ec82a286427402f113e4b6ae769a1d95941d49b25030",
        ),
        ("4361726c204d656e676572", "96763ed773f8e47bb3712f0e29b3060ffc956ffc146cee53d5e1df"),
        ("4a65616e2d426170746973746520536179", "3e40f15f6f3a46ae446b253bf8b1d9ffb6ed9b174d272328ff91a7e2e5c79c07f5"),
        ("457567656e2042f6686d20766f6e2042617765726b", "eb3f3515110702e047a6c9da4478b6ead94873c11c0f2d710ddb3f09fce024b3a58502ae3f"),
    ],
}


class VectorHandshake(Handshake):
    """Plain Noise payloads (no libp2p identity) so the vector's messages can be reproduced."""

    def _outgoing_payload(self) -> bytes:
        return bytes.fromhex(VECTOR["messages"][self.step][0])

    def _incoming_payload(self, plaintext: bytes) -> None:
        assert plaintext == bytes.fromhex(VECTOR["messages"][self.step][0])


def test_cacophony_vector():
    key = lambda name: X25519PrivateKey.from_private_bytes(bytes.fromhex(VECTOR[name]))  # noqa: E731
    prologue = bytes.fromhex(VECTOR["prologue"])
    initiator = VectorHandshake(True, ALICE, prologue=prologue, static_key=key("init_static"), ephemeral_key=key("init_ephemeral"))
    responder = VectorHandshake(False, BOB, prologue=prologue, static_key=key("resp_static"), ephemeral_key=key("resp_ephemeral"))
    writers = [initiator, responder, initiator]
    for step, (writer, (_, ciphertext)) in enumerate(zip(writers, VECTOR["messages"][:3])):
        reader = responder if writer is initiator else initiator
        assert body(writer.write_message()).hex() == ciphertext, f"message {step + 1}"
        reader.read_message(bytes.fromhex(ciphertext))
    assert initiator.handshake_hash.hex() == VECTOR["handshake_hash"] == responder.handshake_hash.hex()
    a, b = initiator.transport(), responder.transport()
    for index, (payload, ciphertext) in enumerate(VECTOR["messages"][3:]):
        sender, receiver = (b, a) if index % 2 == 0 else (a, b)  # message 4 is the responder's
        wire = sender.encrypt(bytes.fromhex(payload))
        assert body(bytes(wire)).hex() == ciphertext
        assert receiver.receive_data(wire).hex() == payload


# --- libp2p handshakes -------------------------------------------------------------------------


def test_success_authenticates_both_sides_and_inlines_muxers():
    initiator, responder = pair(expected=BOB.peer_id)
    m1, m2, m3 = run(initiator, responder)
    assert initiator.complete and responder.complete
    assert not initiator.our_turn and not responder.our_turn
    assert initiator.remote_peer == BOB.peer_id and responder.remote_peer == ALICE.peer_id
    assert initiator.remote_public_key == BOB.public_key and responder.remote_public_key == ALICE.public_key
    assert initiator.remote_muxers == [YAMUX] == responder.remote_muxers
    assert initiator.handshake_hash == responder.handshake_hash
    assert len(m1) == 2 + 32  # e only; the empty payload is not encrypted yet
    assert initiator.send_cipher.aead is not None and initiator.receive_cipher is not None
    a, b = initiator.transport(), responder.transport()
    assert bytes(b.receive_data(a.encrypt(b"hello bob"))) == b"hello bob"
    assert bytes(a.receive_data(b.encrypt(b"hello alice"))) == b"hello alice"


def test_random_keys_and_no_expected_peer():
    initiator, responder = Handshake(True, ALICE), Handshake(False, BOB)
    run(initiator, responder)
    assert initiator.remote_peer == BOB.peer_id


@pytest.mark.parametrize(
    ("muxers_a", "muxers_b"),
    [((), ()), ((YAMUX,), ()), ((), (YAMUX, "/mplex/6.7.0"))],
)
def test_muxer_extension_is_optional(muxers_a, muxers_b):
    initiator, responder = pair(muxers_a=muxers_a, muxers_b=muxers_b)
    run(initiator, responder)
    assert initiator.remote_muxers == list(muxers_b)
    assert responder.remote_muxers == list(muxers_a)


def test_wrong_peer_id_is_refused_before_message_3():
    stranger = KeyPair.generate().peer_id
    initiator, responder = pair(expected=stranger)
    responder.receive_data(initiator.write_message())
    with pytest.raises(PeerIDMismatch) as excinfo:
        initiator.receive_data(responder.write_message())
    assert str(BOB.peer_id) in str(excinfo.value) and str(stranger) in str(excinfo.value)
    assert initiator.failed and initiator.remote_peer is None
    with pytest.raises(LocalProtocolError):
        initiator.write_message()  # no message 3 goes out


def _message(index: int) -> bytes:
    initiator, responder = pair()
    return run(initiator, responder)[index]


def _reader_before(index: int) -> Handshake:
    """A fresh handshake about to read message ``index`` (1 or 2) of the deterministic run."""
    initiator, responder = pair()
    responder.receive_data(initiator.write_message())
    if index == 1:
        return initiator
    initiator.receive_data(responder.write_message())
    initiator.write_message()
    return responder


@pytest.mark.parametrize("index", [1, 2])
def test_every_flipped_byte_of_message_2_and_3_is_detected(index):
    message = body(_message(index))
    for position in range(len(message)):
        tampered = bytearray(message)
        tampered[position] ^= 0x01
        reader = _reader_before(index)
        with pytest.raises(HandshakeError):
            reader.read_message(bytes(tampered))
        assert reader.failed and reader.remote_peer is None


def test_flipped_length_prefix_never_passes():
    for index in (1, 2):
        framed = _message(index)
        for position in (0, 1):
            for bit in range(8):
                tampered = bytearray(framed)
                tampered[position] ^= 1 << bit
                reader = _reader_before(index)
                try:
                    done = reader.receive_data(bytes(tampered))
                except HandshakeError:
                    continue
                assert not done and not reader.complete  # still waiting for bytes that never come


def test_flipped_message_1_breaks_the_handshake_later():
    framed = _message(0)
    for position in range(2, len(framed), 5):
        initiator, responder = pair()
        m1 = bytearray(initiator.write_message())
        m1[position] ^= 0x80
        responder.receive_data(bytes(m1))  # the clear ephemeral key cannot be checked yet
        with pytest.raises(HandshakeError):
            initiator.receive_data(responder.write_message())


def test_truncated_messages():
    for index in (0, 1, 2):
        message = body(_message(index))
        for cut in sorted({0, 1, 31, 32, 33, 79, 80, 95, len(message) - 1}):
            if cut >= len(message):
                continue
            reader = pair()[1] if index == 0 else _reader_before(index)
            if index == 0 and cut >= 32:
                reader.read_message(message[:cut])  # message 1 is just a key: longer is fine
                continue
            with pytest.raises(HandshakeError):
                reader.read_message(message[:cut])


def test_partial_frames_are_buffered_and_leftovers_kept():
    initiator, responder = pair()
    m1 = initiator.write_message()
    assert not responder.receive_data(m1[:1])
    assert not responder.receive_data(m1[1:5])
    assert responder.receive_data(m1[5:])
    assert responder.our_turn
    assert initiator.receive_data(responder.write_message())
    m3 = initiator.write_message()
    for byte in m3[:-1]:
        assert not responder.receive_data(bytes([byte]))
    assert responder.receive_data(m3[-1:] + b"transport bytes")
    assert responder.complete and responder.take_buffered() == b"transport bytes"
    assert responder.take_buffered() == b""
    with pytest.raises(LocalProtocolError):
        responder.receive_data(b"more")


def test_out_of_turn_use():
    initiator, responder = pair()
    with pytest.raises(LocalProtocolError):
        responder.write_message()
    with pytest.raises(LocalProtocolError):
        initiator.read_message(b"\x00" * 32)
    with pytest.raises(LocalProtocolError):
        initiator.split()
    # Bytes from a peer that should be silent are held, but only up to one frame's worth.
    assert not initiator.receive_data(b"\x00" * 1000)
    with pytest.raises(HandshakeError):
        initiator.receive_data(b"\x00" * 70_000)


def test_low_order_ephemeral_key_is_refused():
    _, responder = pair()
    responder.read_message(b"\x00" * 32)  # the all-zero point: the DH result would be zero
    with pytest.raises(HandshakeError):
        responder.write_message()


def test_a_failed_handshake_stays_failed():
    _, responder = pair()
    with pytest.raises(HandshakeError):
        responder.read_message(b"short")
    with pytest.raises(HandshakeError):
        responder.receive_data(b"\x00\x20" + b"\x01" * 32)
    with pytest.raises(LocalProtocolError):
        responder.write_message()


# --- bad payloads from an authenticated-looking responder ---------------------------------------


def _responder_sending(payload_for) -> type[Handshake]:
    class Evil(Handshake):
        def _outgoing_payload(self) -> bytes:
            return payload_for(self) if self.step else b""

    return Evil


def _signed(identity: KeyPair, static: bytes, **fields) -> bytes:
    payload = noise_pb2.NoiseHandshakePayload(
        identity_key=identity.public_key.to_protobuf(), identity_sig=identity.sign(SIGNATURE_PREFIX + static)
    )
    for name, value in fields.items():
        setattr(payload, name, value)
    return payload.SerializeToString()


BAD_PAYLOADS = {
    "garbage protobuf": lambda hs: b"\xff\xff\xff",
    "no identity key": lambda hs: noise_pb2.NoiseHandshakePayload(identity_sig=b"x" * 64).SerializeToString(),
    "no signature": lambda hs: noise_pb2.NoiseHandshakePayload(identity_key=BOB.public_key.to_protobuf()).SerializeToString(),
    "unparsable key": lambda hs: _signed(BOB, public_bytes(hs.static), identity_key=b"\x08\x09\x12\x01\x00"),
    "signature over another static key": lambda hs: _signed(BOB, b"\x07" * 32),
    "signature by another identity": lambda hs: _signed(BOB, public_bytes(hs.static), identity_sig=ALICE.sign(SIGNATURE_PREFIX + public_bytes(hs.static))),
    "too many muxers": lambda hs: encode_payload(BOB, public_bytes(hs.static))
    + noise_pb2.NoiseHandshakePayload(extensions=noise_pb2.NoiseExtensions(stream_muxers=["/m"] * 100)).SerializeToString(),
    "huge payload": lambda hs: encode_payload(BOB, public_bytes(hs.static)) + b"\x1a\x80\x80\x01" + b"\x00" * 16384,
}


@pytest.mark.parametrize("name", sorted(BAD_PAYLOADS))
def test_bad_payloads_are_refused(name):
    initiator, responder = pair(cls_b=_responder_sending(BAD_PAYLOADS[name]))
    responder.receive_data(initiator.write_message())
    with pytest.raises(HandshakeError) as excinfo:
        initiator.receive_data(responder.write_message())
    assert not isinstance(excinfo.value, PeerIDMismatch)
    assert initiator.remote_peer is None and initiator.remote_muxers == []


def test_payload_round_trip_and_local_limits():
    static = public_bytes(fixed_key(9))
    identity = verify_payload(encode_payload(ALICE, static, [YAMUX]), static, ALICE.peer_id)
    assert identity.peer_id == ALICE.peer_id and identity.muxers == [YAMUX]
    with pytest.raises(LocalProtocolError):
        encode_payload(ALICE, static, ["/m"] * 100)
    with pytest.raises(PeerIDMismatch):
        verify_payload(encode_payload(ALICE, static), static, BOB.peer_id)


# --- random and mutated input ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=6))
def test_random_bytes_to_a_responder(chunks):
    _, responder = pair()
    try:
        for chunk in chunks:
            if responder.receive_data(chunk) and responder.our_turn:
                responder.write_message()
    except HandshakeError:
        assert responder.failed
    assert len(responder._buffer) <= 2 + 65535


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_random_message_2_to_an_initiator(data):
    initiator, _ = pair()
    initiator.write_message()
    with pytest.raises(HandshakeError):
        initiator.read_message(data)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_message_3(data):
    message = bytearray(body(_message(2)))
    position = data.draw(st.integers(0, len(message) - 1))
    message[position] ^= data.draw(st.integers(1, 255))
    insert = data.draw(st.binary(max_size=8))
    message[position:position] = insert
    reader = _reader_before(2)
    with pytest.raises(HandshakeError):
        reader.read_message(bytes(message))
