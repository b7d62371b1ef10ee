"""hivemind's RPC framings, sans-I/O: round trips, byte-level compatibility, bounds, and fuzzing
of every decoder (random and truncated input never crashes with anything but a protocol error)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import RemoteProtocolError
from volunteer.hivemind import limits
from volunteer.hivemind.framing import (
    DelimitedDecoder,
    FrameDecoder,
    FrameKind,
    UnaryCall,
    UnaryReply,
    encode_call,
    encode_end,
    encode_error,
    encode_frame,
    encode_reply,
    new_call_id,
    parse_call,
    parse_reply,
    peek_call_id,
)
from volunteer.hivemind.pb.hm_p2pd_pb2 import PersistentConnectionRequest
from volunteer.net.varint import encode_uvarint

FUZZ = settings(max_examples=300, deadline=None)


def decode_one(data: bytes) -> bytes:
    body = DelimitedDecoder().receive_data(data)
    assert body is not None
    return body


def test_unary_call_and_reply_round_trip_byte_by_byte():
    call = UnaryCall(new_call_id(), "DHTProtocol.rpc_find", b"payload", peer=b"\x00\x01")
    wire = encode_call(call)
    decoder = DelimitedDecoder()
    bodies = [decoder.receive_data(wire[i : i + 1]) for i in range(len(wire))]
    assert bodies[:-1] == [None] * (len(wire) - 1)
    assert parse_call(bodies[-1]) == call
    ok = UnaryReply(call.call_id, response=b"answer")
    assert parse_reply(decode_one(encode_reply(ok))) == ok
    failed = UnaryReply(call.call_id, error="ValueError('no')")
    assert parse_reply(decode_one(encode_reply(failed))) == failed


def test_unary_messages_use_p2pd_field_numbers():
    # callId = 1, callUnary = 3 {peer = 1, proto = 2, data = 3}: what go-libp2p-daemon parses
    call_id = bytes(range(16))
    wire = encode_call(UnaryCall(call_id, "P", b"D", peer=b"Q"))
    assert wire == bytes([29, 0x0A, 16]) + call_id + bytes([0x1A, 9, 0x0A, 1]) + b"Q" + bytes([0x12, 1]) + b"P" + bytes([0x1A, 1]) + b"D"


def test_empty_response_is_a_response_not_an_error():
    reply = parse_reply(decode_one(encode_reply(UnaryReply(new_call_id(), response=b""))))
    assert reply.response == b"" and reply.error is None


def test_oversized_reply_becomes_an_error_reply():
    big = UnaryReply(new_call_id(), response=b"x" * (limits.MAX_UNARY_MESSAGE + 1))
    reply = parse_reply(decode_one(encode_reply(big)))
    assert reply.error == "response size exceeds message size limit"


def test_oversized_call_is_refused_locally():
    with pytest.raises(ValueError):
        encode_call(UnaryCall(new_call_id(), "p", b"x" * (limits.MAX_UNARY_MESSAGE + 1)))


def test_oversized_unary_length_is_refused_before_buffering():
    decoder = DelimitedDecoder()
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        decoder.receive_data(encode_uvarint(limits.MAX_UNARY_MESSAGE + 1))


@pytest.mark.parametrize("message", [
    PersistentConnectionRequest(callId=b"short", callUnary={"peer": b"", "proto": "p", "data": b""}),
    PersistentConnectionRequest(callId=bytes(16), cancel={}),
    PersistentConnectionRequest(callId=bytes(16)),
])
def test_calls_without_a_proper_call_unary_are_refused(message):
    with pytest.raises(RemoteProtocolError):
        parse_call(message.SerializeToString())


def test_stream_frames_round_trip_and_end_marker():
    wire = encode_frame(b"one") + encode_frame(b"") + encode_error("boom") + encode_end()
    frames = FrameDecoder().receive_data(wire)
    assert [(f.kind, f.payload) for f in frames[:2]] == [(FrameKind.MESSAGE, b"one"), (FrameKind.MESSAGE, b"")]
    assert frames[2].kind is FrameKind.ERROR and frames[2].error_message == "boom" and not frames[2].is_end
    assert frames[3].is_end
    # hivemind's own bytes: marker, 8-byte big-endian length, payload
    assert encode_frame(b"ab") == b"\x00" + (2).to_bytes(8, "big") + b"ab"
    assert encode_end() == b"\x01" + bytes(8)


def test_stream_frame_bounds():
    with pytest.raises(RemoteProtocolError, match="marker"):
        FrameDecoder().receive_data(b"\x02" + bytes(8))
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        FrameDecoder(max_frame=10).receive_data(b"\x00" + (11).to_bytes(8, "big"))
    with pytest.raises(RemoteProtocolError, match="budget"):
        FrameDecoder(max_frames=2).receive_data(encode_frame(b"") * 3)
    with pytest.raises(RemoteProtocolError, match="budget"):
        FrameDecoder(max_total=5).receive_data(encode_frame(b"abc") * 2)
    with pytest.raises(ValueError):
        encode_frame(b"x" * 11, max_frame=10)


@FUZZ
@given(st.binary(max_size=512), st.integers(min_value=1, max_value=64))
def test_fuzz_delimited_decoder(data, chunk):
    decoder = DelimitedDecoder(max_size=256)
    try:
        for i in range(0, len(data), chunk):
            body = decoder.receive_data(data[i : i + chunk])
            if body is not None:
                assert len(body) <= 256
                try:
                    parse_call(body)
                except RemoteProtocolError:
                    pass
                try:
                    parse_reply(body)
                except RemoteProtocolError:
                    pass
                break
    except RemoteProtocolError:
        pass


@FUZZ
@given(st.binary(max_size=1024), st.integers(min_value=1, max_value=64))
def test_fuzz_frame_decoder(data, chunk):
    decoder = FrameDecoder(max_frame=128, max_frames=16, max_total=512)
    try:
        for i in range(0, len(data), chunk):
            for frame in decoder.receive_data(data[i : i + chunk]):
                assert len(frame.payload) <= 128
                try:
                    frame.error_message
                except RemoteProtocolError:
                    pass
    except RemoteProtocolError:
        pass
    assert decoder.buffered <= 128 + 9 + chunk


@FUZZ
@given(st.binary(min_size=16, max_size=16), st.text(max_size=40), st.binary(max_size=300), st.integers(0, 200))
def test_fuzz_truncated_calls_never_decode_wrongly(call_id, proto, data, cut):
    wire = encode_call(UnaryCall(call_id, proto, data))
    body = DelimitedDecoder().receive_data(wire[: min(cut, len(wire))])
    if cut >= len(wire):
        assert parse_call(body) == UnaryCall(call_id, proto, data, peer=b"")
    else:
        assert body is None


# --- admission before reading: announced lengths, skipping a refused body ------------------------


def test_delimited_decoder_announces_the_length_before_the_body_and_skips_it_unkept():
    call = UnaryCall(new_call_id(), "ConnectionHandler.rpc_forward", b"x" * 100_000)
    data = encode_call(call)
    decoder = DelimitedDecoder()
    assert decoder.receive_data(data[:2]) is None
    assert decoder.announced is None  # a 100 kB body needs a 3-byte prefix
    assert decoder.receive_data(data[2:40]) is None
    assert decoder.announced == len(data) - 3
    decoder.skip()
    for start in range(40, len(data), 4096):
        prefix = decoder.receive_data(data[start : start + 4096])
        assert len(decoder._buffer) <= 64  # a skipped body is never held
    assert prefix is not None and len(prefix) == 64
    assert peek_call_id(prefix) == call.call_id


def test_skip_returns_trailing_bytes_and_peek_needs_a_call_id_first():
    data = encode_call(UnaryCall(new_call_id(), "p", b"y" * 500))
    decoder = DelimitedDecoder()
    assert decoder.receive_data(data[:10]) is None
    decoder.skip()
    assert decoder.receive_data(data[10:] + b"tail") is not None
    assert decoder.trailing == b"tail"
    assert peek_call_id(b"\x12\x10" + bytes(16)) is None
    assert peek_call_id(b"\x0a\x10" + bytes(5)) is None


def test_frame_decoder_announces_a_frame_before_its_body_arrives():
    decoder = FrameDecoder()
    frame = encode_frame(b"z" * 1000)
    assert decoder.receive_data(frame[:5]) == [] and decoder.announced == 0  # header incomplete
    assert decoder.receive_data(frame[5:20]) == [] and decoder.announced == 1000
    assert len(decoder.receive_data(frame[20:] + encode_frame(b"ab"))) == 2
    assert decoder.announced == 1002
