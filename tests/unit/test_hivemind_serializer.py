"""hivemind's msgpack dialect and DHT ids: byte-exact with hivemind 1.1.12 (golden bytes produced
by hivemind itself), and fuzzing of the decoder."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.hivemind.dhtid import id_from_bytes, id_to_bytes, key_id, random_id
from volunteer.hivemind.errors import HivemindFrameError
from volunteer.hivemind.limits import DecodeLimits
from volunteer.hivemind.serializer import (
    DictionaryValue,
    MalformedValue,
    TensorDescriptor,
    dumps,
    loads,
)

# MSGPackSerializer.dumps(...) in hivemind 1.1.12
GOLDEN_TUPLE = "c70c4093a86578706572742e3003c0"  # ("expert.0", 3, None)
GOLDEN_DICTIONARY = (  # DictionaryDHTValue with 'a' → b'x' @ 4e9+0.5 and ('t', 1) → b'y' @ 4e9+1
    "c7365093cb7ff0000000000000cb41edcd65002000009293a161c40178cb41edcd650010000093d64092a17401c40179cb41edcd6500200000"
)
GOLDEN_DESCRIPTOR = (  # BatchTensorDescriptor(16, dtype=torch.float32)
    "c7785188a473697a65c7034092c010a56474797065ad746f7263682e666c6f61743332a66c61796f7574ad746f7263682e73747269"
    "646564ad72657175697265735f67726164c2aa70696e5f6d656d6f7279c2ab636f6d7072657373696f6e00ab6465766963655f7479"
    "7065c0ac6465766963655f696e646578c0"
)


def test_tuple_is_byte_exact_and_round_trips():
    assert dumps(("expert.0", 3, None)).hex() == GOLDEN_TUPLE
    assert loads(bytes.fromhex(GOLDEN_TUPLE)) == ("expert.0", 3, None)
    assert loads(dumps([1, (2, (3,))])) == [1, (2, (3,))]


def test_dictionary_value_is_byte_exact_and_round_trips():
    value = DictionaryValue()
    value.store("a", b"x", 4000000000.5)
    value.store(("t", 1), b"y", 4000000001.0)
    assert dumps(value).hex() == GOLDEN_DICTIONARY
    decoded = loads(bytes.fromhex(GOLDEN_DICTIONARY))
    assert decoded == value and decoded.maxsize == math.inf
    assert decoded.latest_expiration_time == 4000000001.0


def test_dictionary_later_expiration_wins():
    value = DictionaryValue()
    assert value.store("k", b"1", 10.0)
    assert not value.store("k", b"0", 5.0)
    assert value.store("k", b"2", 20.0)
    assert value.items["k"].value == b"2"
    value.drop_expired(15.0)
    assert "k" in value
    value.drop_expired(25.0)
    assert len(value) == 0


def test_tensor_descriptor_is_byte_exact():
    descriptor = TensorDescriptor((None, 16), dtype="torch.float32")
    assert dumps(descriptor).hex() == GOLDEN_DESCRIPTOR
    assert loads(bytes.fromhex(GOLDEN_DESCRIPTOR)) == descriptor


def test_key_ids_match_hivemind():
    # DHTID.generate(source=...).to_bytes() in hivemind 1.1.12
    assert id_to_bytes(key_id("expert.0.1")).hex() == "c561bde5bc04b522d129e9e020fb51214e6ae11c"
    assert id_to_bytes(key_id(b"raw")).hex() == "ce15802a8c5e8e9db0ffaf10130ef265296e9ea4"
    assert id_to_bytes(key_id(("a", 1))).hex() == "edd01de4b5be93353047fae489cc36b2e8f20fb1"


def test_node_ids_are_random_160_bit():
    ids = {random_id() for _ in range(8)}
    assert len(ids) == 8 and all(0 <= i < 2**160 for i in ids)
    ident = random_id()
    assert id_from_bytes(id_to_bytes(ident)) == ident
    with pytest.raises(HivemindFrameError):
        id_from_bytes(b"\x00" * 19)


@pytest.mark.parametrize("data", [
    msgpack.packb(msgpack.ExtType(0x40, msgpack.packb(5))),  # a tuple that holds no array
    msgpack.packb(msgpack.ExtType(0x50, msgpack.packb([None, 1.0]))),
    msgpack.packb(msgpack.ExtType(0x50, msgpack.packb([None, 1.0, [[[1], b"v", 2.0]]]))),  # list sub-key
    msgpack.packb(msgpack.ExtType(0x50, msgpack.packb([None, 1.0, [["k", "str", 2.0]]]))),  # str value
    msgpack.packb(msgpack.ExtType(0x51, msgpack.packb({"size": ["x"]}))),
    b"\xc1",  # never used
    b"\x92\x01",  # truncated array
    b"\x01\x02",  # extra data
])
def test_malformed_values_raise_one_error(data):
    with pytest.raises(MalformedValue):
        loads(data)


def test_ext_nesting_is_bounded():
    data = msgpack.packb(1)
    for _ in range(40):
        data = msgpack.packb(msgpack.ExtType(0x40, msgpack.packb([msgpack.ExtType(0x40, data)])))
    with pytest.raises(MalformedValue, match="deep"):
        loads(data)


def test_unknown_ext_types_stay_raw_bytes():
    assert loads(msgpack.packb(msgpack.ExtType(0x33, b"abc"))) == b"abc"


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256))
def test_fuzz_loads(data):
    try:
        loads(data)
    except MalformedValue:
        pass


values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=10) | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(values)
def test_fuzz_round_trip(value):
    assert loads(dumps(value)) == value


# --- the decoder's object budget -------------------------------------------------------------


def objects_in(value) -> int:
    """How many objects the decoder counts for ``value``: each scalar, array and map once (a map
    entry as its key and its value), a tuple twice (its ext type and the array inside)."""
    if isinstance(value, tuple):
        return 2 + sum(objects_in(item) for item in value)
    if isinstance(value, list):
        return 1 + sum(objects_in(item) for item in value)
    if isinstance(value, dict):
        return 1 + sum(objects_in(k) + objects_in(v) for k, v in value.items())
    return 1


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(values, st.integers(1, 64))
def test_the_object_budget_holds_exactly(value, budget):
    limits = DecodeLimits(max_objects=budget)
    if objects_in(value) <= budget:
        assert loads(dumps(value), limits) == value
    else:
        with pytest.raises(MalformedValue, match="objects"):
            loads(dumps(value), limits)


@pytest.mark.parametrize("bomb", [
    b"\xdd" + (200_000).to_bytes(4, "big") + b"\x80" * 200_000,  # empty maps
    b"\xdd" + (100).to_bytes(4, "big") + (b"\xdc" + (2000).to_bytes(2, "big") + b"\x90" * 2000) * 100,  # nested
    msgpack.packb([msgpack.ExtType(0x40, msgpack.packb([1] * 1000))] * 100),  # tuples
])
def test_object_bombs_are_refused_within_the_budget(bomb):
    with pytest.raises(MalformedValue, match="max_array_len|objects"):
        loads(bomb)


def test_lengths_are_bounded_before_anything_is_built():
    limits = DecodeLimits(max_bytes=100, max_container=10)
    with pytest.raises(MalformedValue, match="exceeds"):
        loads(msgpack.packb(b"x" * 120), limits)  # the input
    with pytest.raises(MalformedValue, match="max_array_len"):
        loads(msgpack.packb(list(range(11))), limits)
    with pytest.raises(MalformedValue, match="max_map_len"):
        loads(msgpack.packb({i: i for i in range(11)}), limits)
    assert loads(msgpack.packb(list(range(10))), limits) == list(range(10))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512), st.integers(1, 32), st.integers(1, 8))
def test_fuzz_loads_within_small_limits(data, budget, container):
    # random bytes under tight limits: a value within them, or MalformedValue, and nothing else
    try:
        value = loads(data, DecodeLimits(max_objects=budget, max_container=container, max_bytes=256))
    except MalformedValue:
        return
    assert len(data) <= 256
    assert not isinstance(value, (list, dict)) or len(value) <= container
