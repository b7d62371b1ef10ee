"""The one guard for untrusted msgpack (``volunteer.wire.unpack_bounded``) and the decoders built
on it: every hostile input (oversize, the wrong container, truncated, not msgpack at all) raises
the caller's error type, a vouch the DHT's (``DHTRecordError``), a receipt the expert protocol's."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from volunteer.dht.vouches import MAX_VOUCH, Vouch, VouchBook
from volunteer.errors import DHTRecordError, ExpertProtocolError
from volunteer.experts.receipts import DIGEST, FORWARD, MAX_RECEIPT, Receipt
from volunteer.net.identity import KeyPair
from volunteer.wire import unpack_bounded

NOW = 1_700_000_000.0


class Refused(Exception):
    pass


def a_vouch() -> bytes:
    book = VouchBook(KeyPair.generate(), "swarm", NOW)
    book.accept(KeyPair.generate().peer_id.to_bytes(), 3)
    [vouch] = book.due(NOW)
    return vouch.encode()


def a_receipt() -> bytes:
    keys = KeyPair.generate()
    return Receipt(keys.peer_id.to_bytes(), "ffn.0", FORWARD, "ffn", 32, 1, bytes(DIGEST), bytes(DIGEST),
                   bytes(DIGEST), 4, "torch.float32", "cpu", 1, "none").sign(keys).encode()


def hostile(valid: bytes, limit: int) -> dict[str, bytes]:
    return {
        "oversize": msgpack.packb([b"x" * limit]),
        "wrong type": msgpack.packb({"a": 1}),
        "a bare number": msgpack.packb(7),
        "truncated": valid[: len(valid) // 2],
        "not msgpack": b"\xc1" + valid,
        "trailing bytes": valid + b"\x00",
        "empty": b"",
        "extension type": msgpack.packb(msgpack.ExtType(1, b"abc")),
    }


def test_the_guard_returns_the_container_it_was_asked_for():
    assert unpack_bounded(msgpack.packb([1, "a", b"b"]), 100, "thing", Refused, list) == [1, "a", b"b"]
    assert unpack_bounded(msgpack.packb({"k": 2}), 100, "thing", Refused, dict) == {"k": 2}
    assert unpack_bounded(msgpack.packb(3), 100, "thing", Refused) == 3  # no kind: any value


@pytest.mark.parametrize("case", ["oversize", "wrong type", "a bare number", "truncated", "not msgpack",
                                  "trailing bytes", "empty", "extension type"])
def test_the_guard_raises_the_callers_error_naming_the_thing(case):
    data = hostile(msgpack.packb([1, 2, 3]), 64)[case]
    with pytest.raises(Refused, match="thing"):
        unpack_bounded(data, 64, "thing", Refused, list)


def test_the_guard_refuses_what_is_not_bytes():
    with pytest.raises(Refused):
        unpack_bounded("text", 64, "thing", Refused)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", ["oversize", "wrong type", "a bare number", "truncated", "not msgpack",
                                  "trailing bytes", "empty", "extension type"])
def test_a_hostile_vouch_is_a_refused_dht_record(case):
    valid = a_vouch()
    assert Vouch.decode(valid).encode() == valid
    with pytest.raises(DHTRecordError) as refused:
        Vouch.decode(hostile(valid, MAX_VOUCH)[case])
    assert refused.value.code == "bad-vouch"
    assert not isinstance(refused.value, ExpertProtocolError)  # the DHT's error, not an expert call's


@pytest.mark.parametrize("case", ["oversize", "wrong type", "a bare number", "truncated", "not msgpack",
                                  "trailing bytes", "empty", "extension type"])
def test_a_hostile_receipt_is_an_expert_protocol_error(case):
    valid = a_receipt()
    assert Receipt.decode(valid).encode() == valid
    with pytest.raises(ExpertProtocolError):
        Receipt.decode(hostile(valid, MAX_RECEIPT)[case])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=MAX_VOUCH + 16))
def test_random_bytes_raise_nothing_but_a_refused_record_from_the_vouch_decoder(data):
    try:
        Vouch.decode(data)
    except DHTRecordError:
        pass


class _Record:
    def __init__(self, value: bytes, signer) -> None:
        self.value, self.expiration, self.signer = value, NOW + 60, signer


class _DHT:
    """The two things the health service's vouch reader asks of a DHT node."""

    def __init__(self, records: dict) -> None:
        self.records = records

    def clock(self) -> float:
        return NOW

    async def get(self, key: bytes) -> dict:
        return self.records


async def test_the_health_page_skips_a_malformed_vouch_and_keeps_the_good_one():
    import trio

    from relay.healthservice import HealthService

    trainer = KeyPair.generate()
    book = VouchBook(trainer, "swarm", NOW)
    book.accept(KeyPair.generate().peer_id.to_bytes(), 3)
    [vouch] = book.due(NOW)
    dht = _DHT({b"bad": _Record(b"\xc1 not msgpack", trainer.peer_id),
                b"good": _Record(vouch.encode(), trainer.peer_id)})
    with trio.fail_after(5):
        assert await HealthService._vouches(dht) == [vouch]
