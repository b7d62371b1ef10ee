"""uvarint codec (multiformats rules) and BufferedStream exact reads."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import RemoteProtocolError
from volunteer.net.streams import BufferedStream, send_all_then_eof
from volunteer.net.varint import decode_uvarint, decode_uvarint_exact, encode_uvarint


@pytest.mark.parametrize(
    "value, encoded",
    [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (255, b"\xff\x01"), (300, b"\xac\x02"), (16384, b"\x80\x80\x01")],
)
def test_spec_vectors(value, encoded):
    assert encode_uvarint(value) == encoded
    assert decode_uvarint(encoded) == (value, len(encoded))


def test_limits_and_minimality():
    assert decode_uvarint(b"\x80") is None  # needs more bytes
    with pytest.raises(RemoteProtocolError):
        decode_uvarint(b"\x80\x00")  # non-minimal
    with pytest.raises(RemoteProtocolError):
        decode_uvarint(b"\xff" * 10)  # longer than 9 bytes
    with pytest.raises(RemoteProtocolError):
        decode_uvarint_exact(b"\x81")
    with pytest.raises(ValueError):
        encode_uvarint(-1)
    with pytest.raises(ValueError):
        encode_uvarint(1 << 63)


@given(st.integers(min_value=0, max_value=(1 << 63) - 1))
def test_roundtrip(value):
    data = encode_uvarint(value)
    assert decode_uvarint(data + b"tail") == (value, len(data))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=20))
def test_random_bytes_never_crash(data):
    try:
        result = decode_uvarint(data)
    except RemoteProtocolError:
        return
    if result is not None:
        value, end = result
        assert encode_uvarint(value) == data[:end]


async def test_buffered_stream_exact_reads_keep_leftovers():
    left, right = trio.testing.memory_stream_pair()
    reader = BufferedStream(right)
    with trio.fail_after(5):
        await left.send_all(encode_uvarint(5) + b"hello" + b"rest-of-stream")
        assert await reader.receive_length_prefixed(10) == b"hello"
        assert await reader.receive_exactly(4) == b"rest"
        assert await reader.receive_some() == b"-of-stream"
        await left.send_all(encode_uvarint(100))
        with pytest.raises(RemoteProtocolError):
            await reader.receive_length_prefixed(10)
        await left.send_all(b"ab")
        await left.aclose()
        with pytest.raises(RemoteProtocolError):
            await reader.receive_exactly(3)


async def test_receive_until_eof_is_bounded():
    left, right = trio.testing.memory_stream_pair()
    reader = BufferedStream(right)
    with trio.fail_after(5):
        await left.send_all(b"x" * 100)
        with pytest.raises(RemoteProtocolError):
            await reader.receive_until_eof(50)


async def test_send_all_then_eof_falls_back_to_send_all_and_send_eof():
    """A stream without the one-write form still gets its data, then its EOF."""
    left, right = trio.testing.memory_stream_pair()
    await send_all_then_eof(BufferedStream(left), b"last reply")
    assert await BufferedStream(right).receive_until_eof(100) == b"last reply"
