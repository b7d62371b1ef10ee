"""hivemind's Tensor messages: golden bytes from hivemind 1.1.12 (serialize_torch_tensor), round
trips, bounds, and fuzzing of the decoder."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import RemoteProtocolError
from volunteer.hivemind.errors import HivemindError
from volunteer.hivemind.pb.hm_runtime_pb2 import Tensor
from volunteer.hivemind.tensors import FLOAT16, MEANSTD_16BIT, NONE, decode, decode_bytes, encode

VALUES = np.array([[1.0, -2.5, 3.25], [0.5, 4.0, -1.0]], dtype=np.float32)
GOLDEN = {
    NONE: "0a180000803f000020c0000050400000003f00008040000080bf120202032207666c6f61743332",
    FLOAT16: "0a0c003c00c180420038004400bc120202032207666c6f617433322802",
    MEANSTD_16BIT: "0a1ca33137bd823c17b5693d23bc5555153f5555953f016a1740f3130640120202032207666c6f617433322801",
}
GOLDEN_INT64 = "0a100300000000000000ffffffffffffffff1201022205696e743634"


@pytest.mark.parametrize("compression", [NONE, FLOAT16])
def test_exact_compressions_are_byte_exact(compression):
    assert encode(VALUES, compression).SerializeToString().hex() == GOLDEN[compression]
    assert np.array_equal(decode_bytes(bytes.fromhex(GOLDEN[compression])), VALUES)


def test_meanstd_decodes_hivemind_bytes_and_round_trips():
    assert np.allclose(decode_bytes(bytes.fromhex(GOLDEN[MEANSTD_16BIT])), VALUES, atol=1e-2)
    ours = decode(encode(VALUES, MEANSTD_16BIT))
    assert ours.dtype == np.float32 and np.allclose(ours, VALUES, atol=1e-2)


def test_integers_and_grad_flag():
    ints = np.array([3, -1], dtype=np.int64)
    assert encode(ints).SerializeToString().hex() == GOLDEN_INT64
    message = encode(VALUES, requires_grad=True)
    assert message.requires_grad and np.array_equal(decode(message), VALUES)
    with pytest.raises(ValueError):
        encode(ints, FLOAT16)


@pytest.mark.parametrize("message", [
    Tensor(buffer=b"\x00" * 7, size=[2], dtype="float32"),
    Tensor(buffer=b"", size=[2**31, 2**31], dtype="float32"),
    Tensor(buffer=b"", size=[1] * 9, dtype="float32"),
    Tensor(buffer=b"\x00" * 4, size=[2], dtype="float32", compression=FLOAT16 + 5),
    Tensor(buffer=b"\x00" * 4, size=[2], dtype="bfloat16"),
    Tensor(buffer=b"\x00" * 4, size=[2], dtype="int16", compression=FLOAT16),
    Tensor(buffer=b"\x00" * 4, size=[2, 0], dtype="float32", compression=MEANSTD_16BIT),
    Tensor(buffer=b"\x00" * 11, size=[2], dtype="float32", compression=MEANSTD_16BIT),
    Tensor(buffer=b"\x00" * 4, size=[1], dtype="float32", chunks=2),
])
def test_inconsistent_tensors_are_refused(message):
    with pytest.raises((HivemindError, RemoteProtocolError)):
        decode(message)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_decode(data):
    try:
        array = decode_bytes(data, max_bytes=1 << 16)
        assert array.nbytes <= 8 << 16
    except (RemoteProtocolError, HivemindError):
        pass


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=24), st.sampled_from([NONE, FLOAT16, MEANSTD_16BIT]))
def test_fuzz_round_trip(values, compression):
    array = np.array(values, dtype=np.float32).reshape(1, -1)
    restored = decode(encode(array, compression))
    assert restored.shape == array.shape
    if compression == NONE:
        assert np.array_equal(restored, array)
