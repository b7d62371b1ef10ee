"""expert_wire, pure: hivemind's expert requests and answers round-trip, streamed tensors split
and join, declarations match hivemind's declare_experts, and every decoder refuses random,
truncated and oversized input with a RemoteProtocolError only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import RemoteProtocolError
from volunteer.hivemind import HivemindUnsupported
from volunteer.hivemind import expert_wire as wire
from volunteer.hivemind.limits import ExpertLimits
from volunteer.hivemind.pb.hm_runtime_pb2 import FLOAT16, ExpertRequest, Tensor

DECODERS = [wire.parse_request, wire.parse_response, wire.parse_info_request,
            lambda data: wire.parse_stream_request([data]), lambda data: wire.parse_stream_response([data])]


def test_requests_and_answers_round_trip_unary_and_streamed():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    ids = np.arange(4, dtype=np.int64)
    uid, (x2, ids2) = wire.parse_request(wire.request("ffn.1", [x, ids], [FLOAT16, FLOAT16]))
    assert uid == "ffn.1" and ids2.dtype == np.int64 and np.array_equal(ids2, ids)  # ints never compressed
    np.testing.assert_allclose(x2, x, rtol=1e-3)
    small = ExpertLimits(stream_part_bytes=10)
    frames = wire.stream_request("ffn.1", [x, ids], limits=small)
    assert len(frames) == 10 + 4  # 96 and 32 bytes in parts of 10
    uid, (x3, ids3) = wire.parse_stream_request(frames)
    assert np.array_equal(x3, x) and np.array_equal(ids3, ids)
    assert np.array_equal(wire.parse_stream_response(wire.stream_response([x], limits=small))[0], x)
    assert np.array_equal(wire.parse_response(wire.response([x]))[0], x)


def test_stream_parts_that_disagree_are_refused():
    x = np.zeros((2, 8), np.float32)
    frames = wire.stream_request("ffn.1", [x], limits=ExpertLimits(stream_part_bytes=16))
    with pytest.raises(RemoteProtocolError, match="announced 4 parts, 3 arrived"):
        wire.parse_stream_request(frames[:-1])
    other = ExpertRequest(uid="ffn.2", tensors=[Tensor(buffer=b"")]).SerializeToString()
    with pytest.raises(RemoteProtocolError, match="uids differ"):
        wire.parse_stream_request([frames[0], other])
    headless = ExpertRequest(uid="ffn.1", tensors=[Tensor(buffer=b"abc")]).SerializeToString()
    with pytest.raises(RemoteProtocolError, match="first part has no dtype"):
        wire.parse_stream_request([headless])
    with pytest.raises(RemoteProtocolError, match="exceed 2"):
        wire.parse_request(wire.request("ffn.1", [x, x, x]), ExpertLimits(max_tensors=2))
    with pytest.raises(RemoteProtocolError, match="carried no message"):
        wire.parse_stream_request([])


def test_a_streamed_request_is_consumed_as_it_is_joined_into_writable_arrays():
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    frames = wire.stream_request("ffn.1", [x, x * 2], limits=ExpertLimits(stream_part_bytes=100))
    assert len(frames) == 6
    uid, (a, b) = wire.parse_stream_request(frames)
    assert frames == []  # each frame dropped once parsed: the request is held about once
    assert uid == "ffn.1" and np.array_equal(a, x) and np.array_equal(b, x * 2)
    # arrays over their own joined buffers: writable (torch takes them without a copy or a warning)
    assert a.flags.writeable and b.flags.writeable and a.base is not b.base
    # a tensor's parts may not add up past its bound
    frames = wire.stream_request("ffn.1", [x], limits=ExpertLimits(stream_part_bytes=100))
    with pytest.raises(RemoteProtocolError, match="byte bound"):
        wire.parse_stream_request(frames, ExpertLimits(max_tensor_bytes=200))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=6), st.integers(1, 64))
def test_random_frames_never_crash_the_streamed_request_decoder(frames, part):
    # a real request's frames with random ones mixed in: decoded, or refused as a protocol error
    x = np.ones((2, 4), np.float32)
    mixed = wire.stream_request("ffn.1", [x], limits=ExpertLimits(stream_part_bytes=part)) + frames
    try:
        wire.parse_stream_request(mixed)
    except (RemoteProtocolError, HivemindUnsupported):
        pass


def test_declarations_match_hivemind_declare_experts():
    records = {(d.key, d.subkey): d.value for d in wire.declarations(["ffn.3", "grid.1.2", "deep.1.2.3"], "QmPeer")}
    assert records == {
        ("ffn.3", None): "QmPeer", ("ffn.3.", -1): ("ffn.3", "QmPeer"),
        ("grid.1.2", None): "QmPeer", ("grid.1.", 2): ("grid.1.2", "QmPeer"),
        ("deep.1.2.3", None): "QmPeer", ("deep.1.2.", 3): ("deep.1.2.3", "QmPeer"), ("deep.1.", 2): ("deep.1.2.3", "QmPeer"),
    }
    assert wire.is_hivemind_uid("expert.0.12") and not wire.is_hivemind_uid("expert") and not wire.is_hivemind_uid("e.01")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512), st.integers(0, len(DECODERS) - 1))
def test_random_bytes_never_crash_a_decoder(data, which):
    try:
        DECODERS[which](data)
    except (RemoteProtocolError, HivemindUnsupported):
        pass


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.integers(0, 200), st.integers(1, 2**31))
def test_truncated_requests_and_oversized_sizes_are_refused(cut, claimed):
    good = wire.request("ffn.1", [np.ones((3, 5), np.float32)])
    try:
        wire.parse_request(good[:cut])
    except (RemoteProtocolError, HivemindUnsupported):
        pass
    lying = ExpertRequest(uid="ffn.1", tensors=[Tensor(buffer=b"\0" * 8, size=[claimed, claimed], dtype="float32")])
    with pytest.raises(RemoteProtocolError):
        wire.parse_request(lying.SerializeToString(), ExpertLimits(max_tensor_bytes=1 << 20))
