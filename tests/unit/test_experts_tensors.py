"""Tensor wire format: round trips, compression error bounds, streaming, strict decoding."""

from __future__ import annotations

import math
import random

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from volunteer.errors import LocalProtocolError, TensorFormatError
from volunteer.experts.config import ExpertsConfig
from volunteer.experts.tensors import (
    COMPRESSIONS,
    DTYPES,
    TensorReader,
    deserialize,
    encode,
    pick_compression,
    quantize_blockwise,
    dequantize_blockwise,
    serialize,
)

SMALL = ExpertsConfig(max_payload_bytes=4096, max_tensors=5, max_ndim=3, chunk_size=7)


def sample(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    if dtype is torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape) * 3).to(dtype)
    return torch.randint(-100 if dtype.is_signed else 0, 100, shape, dtype=dtype)


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
def test_round_trip_exact_without_compression(dtype):
    tensors = [sample(dtype), sample(dtype, (0, 4)), sample(dtype, ())]
    header, payload = encode(tensors)
    msgpack.packb(header)  # the header must be msgpack-able as is
    out = deserialize(msgpack.unpackb(msgpack.packb(header)), payload)
    for original, decoded in zip(tensors, out):
        assert decoded.dtype == original.dtype and decoded.shape == original.shape
        assert torch.equal(decoded, original)


def test_non_contiguous_and_views():
    base = torch.randn(6, 8)
    tensors = [base.t(), base[::2, 1:5], base[2]]
    out = deserialize(*encode(tensors))
    assert all(torch.equal(a, b) for a, b in zip(tensors, out))


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_integers_and_bools_are_never_compressed(compression):
    tensors = [sample(torch.int64), sample(torch.bool), sample(torch.uint8)]
    header, payload = encode(tensors, compression)
    assert [meta["c"] for meta in header["t"]] == ["none"] * 3
    assert all(torch.equal(a, b) for a, b in zip(tensors, deserialize(header, payload)))


def test_float16_compression_halves_and_bounds_error():
    x = torch.randn(64, 128)
    header, payload = encode([x, x.double()], "float16")
    assert header["t"][0]["c"] == "float16" and header["t"][0]["n"] == x.numel() * 2
    y, z = deserialize(header, payload)
    assert y.dtype == torch.float32 and z.dtype == torch.float64
    assert torch.allclose(y, x, rtol=2**-10, atol=1e-4)
    bf = torch.randn(8).bfloat16()  # half would overflow bf16's range: bf16 goes raw
    assert encode([bf], "float16")[0]["t"][0]["c"] == "none"


@pytest.mark.parametrize("compression,block", [("blockwise8_64", 64), ("blockwise8_256", 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_blockwise_error_is_at_most_half_a_step(compression, block, dtype):
    x = (torch.randn(1000) * torch.logspace(-3, 3, 1000)).to(dtype)  # blocks of very different scales
    header, payload = encode([x], compression)
    blocks = math.ceil(1000 / block)
    assert header["t"][0]["n"] == blocks * 4 + 1000
    (y,) = deserialize(header, payload)
    assert y.dtype == dtype and y.shape == x.shape
    ref = x.float()
    padded = torch.nn.functional.pad(ref, (0, blocks * block - 1000)).view(blocks, block)
    bound = (padded.abs().amax(dim=1) / 254).repeat_interleave(block)[:1000]
    slack = 1e-6 + (0 if dtype in (torch.float32, torch.float64) else 0.01 * ref.abs())  # output cast
    assert bool(((y.float() - ref).abs() <= bound * 1.0001 + slack).all())


def test_blockwise_zero_blocks_and_edge_sizes():
    for numel in (0, 1, 63, 64, 65, 257):
        x = torch.zeros(numel)
        scales, codes = quantize_blockwise(x, 64)
        assert codes.numel() == numel and scales.numel() == math.ceil(numel / 64)
        assert torch.equal(dequantize_blockwise(scales, codes, 64), x)


def test_streaming_any_chunking():
    tensors = [torch.randn(5, 3), torch.arange(11), torch.tensor([True, False, True]), torch.randn(0), torch.randn(2).half()]
    header, chunks = serialize(tensors, "none", config=SMALL)
    chunks = list(chunks)
    assert all(0 < c.nbytes <= SMALL.chunk_size for c in chunks)
    payload = b"".join(chunks)
    rng = random.Random(7)
    for _ in range(20):
        reader = TensorReader(header, config=SMALL)
        position = 0
        while position < len(payload):
            step = rng.randint(0, 13)
            reader.feed(payload[position : position + step])
            position += step
        assert reader.done and reader.remaining == 0
        out = reader.finish()
        assert all(torch.equal(a, b) for a, b in zip(tensors, out))


def test_truncated_and_overlong_payloads():
    header, payload = encode([torch.randn(4)])
    reader = TensorReader(header)
    reader.feed(payload[:-1])
    with pytest.raises(TensorFormatError, match="truncated"):
        reader.finish()
    with pytest.raises(TensorFormatError, match="longer"):
        reader.feed(b"ab")
    with pytest.raises(TensorFormatError):
        deserialize(header, payload + b"\0")


@pytest.mark.parametrize(
    "mutate",
    [
        lambda h: h["t"][0].update(d="complex64"),
        lambda h: h["t"][0].update(c="zstd"),
        lambda h: h["t"][0].update(n=h["t"][0]["n"] + 1),
        lambda h: h.update(n=h["n"] - 1),
        lambda h: h["t"][0].update(s=[-1, 4]),
        lambda h: h["t"][0].update(s=[1, 2, 3, 4]),  # ndim beyond SMALL.max_ndim
        lambda h: h["t"][0].update(s="12"),
        lambda h: h["t"][0].update(s=[1.0, 4]),
        lambda h: h["t"][0].update(s=[True, 4]),
        lambda h: h["t"][0].update(extra=1),
        lambda h: h["t"][0].pop("n"),
        lambda h: h.update(t=h["t"] * 3),  # more tensors than SMALL.max_tensors
        lambda h: h.update(t="x"),
        lambda h: h.update(x=1),
        lambda h: h["t"][1].update(c="float16"),  # float16 of an int64 tensor is not a thing
        lambda h: h["t"][0].update(s=[1000, 1000], n=4_000_000),  # beyond max_payload_bytes
    ],
)
def test_bad_headers_raise_typed_errors(mutate):
    header, payload = encode([torch.randn(2, 4), torch.arange(3)], config=SMALL)
    mutate(header)
    with pytest.raises(TensorFormatError):
        deserialize(header, payload, config=SMALL)


def test_decoded_size_is_bounded_even_when_compressed():
    x = torch.randn(3000)  # 12000 bytes decoded, ~3000 on the wire
    header, payload = encode([x], "blockwise8_256")
    with pytest.raises(TensorFormatError, match="decode"):
        deserialize(header, payload, config=ExpertsConfig(max_payload_bytes=8000))


def test_encode_refuses_what_it_cannot_send():
    with pytest.raises(LocalProtocolError, match="compression"):
        encode([torch.randn(2)], "gzip")
    with pytest.raises(LocalProtocolError, match="dtype"):
        encode([torch.randn(2, dtype=torch.complex64)])
    with pytest.raises(LocalProtocolError, match="tensors"):
        encode([torch.randn(1)] * 6, config=SMALL)
    with pytest.raises(LocalProtocolError, match="payload"):
        encode([torch.randn(2000)], config=SMALL)


def test_bool_bytes_are_normalised():
    header, _ = encode([torch.tensor([True, False, True])])
    (out,) = deserialize(header, b"\x02\x00\xff")
    assert out.tolist() == [True, False, True]


def test_pick_compression():
    assert pick_compression("float16") == "float16"
    assert pick_compression("brotli") == "none"
    assert pick_compression(None) == "none"


# --- hypothesis: random and mutated input never crash with anything but TensorFormatError -------

_scalars = st.one_of(st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8), st.booleans(), st.none(), st.binary(max_size=8))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=5), max_leaves=20)
_meta = st.fixed_dictionaries(
    {
        "d": st.sampled_from(list(DTYPES) + ["x", ""]),
        "s": st.lists(st.integers(-2, 2**40), max_size=4),
        "c": st.sampled_from(list(COMPRESSIONS) + ["q"]),
        "n": st.integers(-1, 2**33),
    }
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=st.one_of(_values, st.fixed_dictionaries({"t": st.lists(_meta, max_size=5), "n": st.integers(-1, 2**33)})), payload=st.binary(max_size=300))
def test_random_headers_and_payloads(header, payload):
    try:
        reader = TensorReader(header, config=SMALL)
        reader.feed(payload)
        out = reader.finish()
    except TensorFormatError:
        return
    assert sum(t.numel() * t.element_size() for t in out) <= SMALL.max_payload_bytes


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_valid_headers_with_random_payload_bytes(data):
    dtype = data.draw(st.sampled_from(list(DTYPES.values())))
    shape = data.draw(st.lists(st.integers(0, 6), min_size=0, max_size=3))
    compression = data.draw(st.sampled_from(COMPRESSIONS))
    header, payload = encode([sample(dtype, tuple(shape))], compression, config=SMALL)
    garbage = data.draw(st.binary(min_size=len(payload), max_size=len(payload)))
    cut = data.draw(st.integers(0, len(payload) + 2))
    reader = TensorReader(header, config=SMALL)
    try:
        reader.feed(garbage[:cut] + (b"\0\0" if cut > len(payload) else b""))
        (out,) = reader.finish()
    except TensorFormatError:
        assert cut != len(payload)
        return
    assert out.dtype == dtype and list(out.shape) == shape


def test_a_small_call_goes_out_in_one_write_and_a_big_one_chunk_by_chunk():
    """The bytes on the stream are the same either way; only how many writes carry them differs."""
    from volunteer.experts.tensors import writes

    config = ExpertsConfig(chunk_size=1000)
    head = b"header"
    small_header, small_chunks = serialize([torch.arange(600, dtype=torch.float32)], config=config)
    small = list(writes(head, small_chunks))
    assert len(small) == 1 and small[0] == head + encode([torch.arange(600, dtype=torch.float32)], config=config)[1]
    big_chunks = list(serialize([torch.arange(600, dtype=torch.float32)], config=config)[1])
    big = list(writes(head, iter(big_chunks), limit=2000))
    assert big[0] is head and [bytes(b) for b in big[1:]] == [bytes(c) for c in big_chunks]
    assert len(big_chunks) == 3  # 2400 bytes in chunks of at most 1000
