"""Noise transport core: framing, partial input, tampering, nonce limits (no trio)."""

from __future__ import annotations

import array
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import LocalProtocolError, RemoteProtocolError
from volunteer.net.limits import NOISE_MAX_PLAINTEXT
from volunteer.net.noise.transport import CipherState, NoiseTransport, nonce_bytes

KEY_AB, KEY_BA = b"\x01" * 32, b"\x02" * 32


def transports(max_nonce: int = 2**64 - 1) -> tuple[NoiseTransport, NoiseTransport]:
    a = NoiseTransport(CipherState(KEY_AB, max_nonce), CipherState(KEY_BA, max_nonce))
    b = NoiseTransport(CipherState(KEY_BA, max_nonce), CipherState(KEY_AB, max_nonce))
    return a, b


def frames(wire) -> list[int]:
    """The lengths of the frames in ``wire``."""
    lengths, pos = [], 0
    while pos < len(wire):
        length = int.from_bytes(wire[pos : pos + 2], "big")
        lengths.append(length)
        pos += 2 + length
    assert pos == len(wire)
    return lengths


def test_nonce_encoding():
    assert nonce_bytes(0) == bytes(12)
    assert nonce_bytes(0x0102) == b"\x00" * 4 + b"\x02\x01" + b"\x00" * 6


@pytest.mark.parametrize(
    "size",
    [1, 100, NOISE_MAX_PLAINTEXT - 1, NOISE_MAX_PLAINTEXT, NOISE_MAX_PLAINTEXT + 1, 3 * NOISE_MAX_PLAINTEXT + 5, 1 << 20],
)
def test_sizes_round_trip_and_frame_limits(size):
    a, b = transports()
    payload = os.urandom(size)
    wire = a.encrypt(payload)
    lengths = frames(wire)
    assert all(16 < length <= 65535 for length in lengths)
    assert len(lengths) == -(-size // NOISE_MAX_PLAINTEXT) == a.send_nonce
    assert b.receive_data(wire) == payload and b.pending == 0
    assert b.receive_nonce == len(lengths)


def test_empty_send_uses_no_nonce_and_empty_frames_are_legal():
    a, b = transports()
    assert a.encrypt(b"") == b"" and a.send_nonce == 0
    # A peer may send a frame with an empty plaintext: it consumes a nonce and yields nothing.
    tag_only = a._send.encrypt(None, b"")
    assert b.receive_data(len(tag_only).to_bytes(2, "big") + tag_only) == b""
    assert b.receive_data(a.encrypt(b"after")) == b"after"


def test_any_buffer_type_is_accepted():
    a, b = transports()
    words = array.array("I", range(1000))
    for data in (bytearray(b"xyz"), memoryview(b"0123456789")[2:7], words, memoryview(words)):
        expected = bytes(memoryview(data).cast("B"))
        assert b.receive_data(memoryview(a.encrypt(data))) == expected


def test_several_sends_in_one_read_and_byte_by_byte():
    a, b = transports()
    parts = [os.urandom(n) for n in (5, 70_000, 0, 1, 200_000)]
    wire = b"".join(bytes(a.encrypt(part)) for part in parts)
    assert b.receive_data(wire) == b"".join(parts)
    small = bytes(a.encrypt(b"byte by byte"))
    out = b"".join(b.receive_data(small[i : i + 1]) for i in range(len(small)))
    assert out == b"byte by byte" and b.pending == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 150_000), min_size=1, max_size=4), st.lists(st.integers(1, 90_000), max_size=30))
def test_arbitrary_chunking_is_byte_exact(sizes, cuts):
    a, b = transports()
    payload = os.urandom(sum(sizes))
    wire = bytearray()
    pos = 0
    for size in sizes:
        wire += a.encrypt(payload[pos : pos + size])
        pos += size
    out, pos = [], 0
    for cut in cuts:
        out.append(b.receive_data(wire[pos : pos + cut]))
        pos += cut
        assert b.pending <= 2 + 65535
    out.append(b.receive_data(wire[pos:]))
    assert b"".join(out) == payload and b.pending == 0


@pytest.mark.parametrize("position", [0, 1, 2, 10, 65536, 65537, 65538, 65538 + 50, -1])
def test_tampering_anywhere_is_detected_and_sticks(position):
    a, b = transports()
    wire = bytearray(a.encrypt(os.urandom(100_000)))
    wire[position] ^= 0x04
    with pytest.raises(RemoteProtocolError):
        # A flipped length may leave the frame incomplete; the tail of a short frame then garbles the next.
        b.receive_data(wire)
        b.receive_data(a.encrypt(os.urandom(70_000)))
    with pytest.raises(RemoteProtocolError):
        b.receive_data(b"")  # the transport is dead from now on


def test_frames_out_of_order_or_replayed_fail():
    a, b = transports()
    first, second = bytes(a.encrypt(b"one")), bytes(a.encrypt(b"two"))
    with pytest.raises(RemoteProtocolError):
        b.receive_data(second + first)
    a, b = transports()
    first = bytes(a.encrypt(b"one"))
    assert b.receive_data(first) == b"one"
    with pytest.raises(RemoteProtocolError):
        b.receive_data(first)


@pytest.mark.parametrize("length", [0, 1, 15])
def test_frames_shorter_than_a_tag_fail(length):
    _, b = transports()
    with pytest.raises(RemoteProtocolError):
        b.receive_data(length.to_bytes(2, "big") + b"\x00" * length)
    _, b = transports()
    assert b.receive_data(b"\x00") == b""
    with pytest.raises(RemoteProtocolError):
        b.receive_data(bytes([length]))  # the length completed across reads


def test_wrong_key_fails():
    a, _ = transports()
    other = NoiseTransport(CipherState(KEY_AB), CipherState(b"\x03" * 32))
    with pytest.raises(RemoteProtocolError):
        other.receive_data(a.encrypt(b"secret"))


def test_nonce_exhaustion_on_send_is_refused_before_reuse():
    a, b = transports(max_nonce=3)
    a.encrypt(b"x" * (NOISE_MAX_PLAINTEXT + 1))  # nonces 0 and 1
    with pytest.raises(LocalProtocolError):
        a.encrypt(b"y" * (NOISE_MAX_PLAINTEXT + 1))  # would need 2 and 3
    assert a.send_nonce == 2  # nothing was used up by the refused call
    a.encrypt(b"z")  # nonce 2, the last one
    with pytest.raises(LocalProtocolError):
        a.encrypt(b"z")
    cipher = CipherState(KEY_AB, max_nonce=1)
    cipher.encrypt(None, b"x")
    with pytest.raises(LocalProtocolError):
        cipher.encrypt(None, b"x")


def test_nonce_exhaustion_on_receive_is_the_peers_fault():
    sender, _ = transports()
    _, receiver = transports(max_nonce=2)
    wire = bytes(sender.encrypt(b"x" * (2 * NOISE_MAX_PLAINTEXT + 1)))  # 3 frames
    with pytest.raises(RemoteProtocolError):
        receiver.receive_data(wire)


def test_keyless_cipher_states_are_refused():
    with pytest.raises(LocalProtocolError):
        NoiseTransport(CipherState(None), CipherState(KEY_AB))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=3000), max_size=5))
def test_random_bytes_only_raise_protocol_errors(chunks):
    _, b = transports()
    try:
        for chunk in chunks:
            b.receive_data(chunk)
            assert b.pending <= 2 + 65535
    except RemoteProtocolError:
        pass


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 12, 100, NOISE_MAX_PLAINTEXT - 1, NOISE_MAX_PLAINTEXT, NOISE_MAX_PLAINTEXT + 1,
                                 3 * NOISE_MAX_PLAINTEXT + 7, 1 << 20]), max_size=6))
@pytest.mark.slow
def test_encrypt_parts_gives_the_same_frames_as_encrypting_the_join(sizes):
    """yamux hands Noise its header/payload list: the wire bytes must not depend on how it is split."""
    parts = [os.urandom(size) for size in sizes]
    joined_sender, joined_receiver = transports()
    parts_sender, _ = transports()
    for _ in range(2):  # and the nonce carries on identically across calls
        wire = parts_sender.encrypt_parts([memoryview(part) for part in parts])
        assert wire == joined_sender.encrypt(b"".join(parts))
        assert joined_receiver.receive_data(wire) == b"".join(parts)
    assert parts_sender.send_nonce == joined_sender.send_nonce


def test_a_batch_of_frames_is_returned_without_another_copy():
    """Several frames decrypted in one call come back as the buffer they were decrypted into."""
    a, b = transports()
    payload = os.urandom(3 * NOISE_MAX_PLAINTEXT)
    plaintext = b.receive_data(a.encrypt(payload))
    assert isinstance(plaintext, bytearray) and plaintext == payload
    assert isinstance(b.receive_data(a.encrypt(b"one frame")), bytes)
