"""Hostile hivemind-speaking peers, built from our own modules: what the attacks on the hivemind
door send (held requests, object bombs, sub-key floods), shared by the integration and interop
tests of the door. Every loop is bounded in count; the attacker shares the node's process, so
what it sends comes from one shared buffer."""

from __future__ import annotations

import time

import trio

from volunteer.errors import VolunteerError
from volunteer.hivemind import key_id
from volunteer.hivemind.dht_protocol import STORE
from volunteer.hivemind.dhtid import id_to_bytes
from volunteer.hivemind.pb import hm_dht_pb2 as pb
from volunteer.hivemind.rpc import call_unary
from volunteer.hivemind.serializer import dumps
from volunteer.net.varint import encode_uvarint

PEER_ERRORS = (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError)
FILLER = memoryview(bytes(1 << 20))


async def send_filler(stream, nbytes: int) -> None:
    """Send ``nbytes`` zeros from one shared buffer (the attacker shares the node's process)."""
    while nbytes:
        part = min(nbytes, len(FILLER))
        await stream.send_all(FILLER[:part])
        nbytes -= part


async def held_unary(attacker, target, protocol: str, size: int, count: int) -> list:
    """``count`` streams that each announce a ``size``-byte unary request and send all of it but
    its last byte: bodies held open. Streams the node refuses are skipped."""
    streams = []
    for _ in range(count):
        try:
            stream = await attacker.new_stream(target, [protocol])
            await stream.send_all(encode_uvarint(size))
            await send_filler(stream, size - 1)
        except PEER_ERRORS:
            continue
        streams.append(stream)
    return streams


async def resets(streams) -> int:
    """How many of ``streams`` the node has reset (without reading what they carry)."""
    count = 0
    for stream in streams:
        try:
            await stream.send_all(b"")
        except PEER_ERRORS:
            count += 1
    return count


async def reset_all(streams) -> None:
    """Drop every one of ``streams`` (the attack ends)."""
    for stream in streams:
        await stream.reset()


def store_request(key: str, tag: bytes, value: bytes, count: int = 1) -> bytes:
    """A hivemind StoreRequest of ``count`` items (``value`` under ``key``, sub-key tag ``tag``)."""
    return pb.StoreRequest(
        keys=[id_to_bytes(key_id(key))] * count, subkeys=[tag] * count, values=[value] * count,
        expiration_time=[time.time() + 3600] * count, in_cache=[False] * count,
    ).SerializeToString()


async def try_call(attacker, target, protocol: str, data: bytes) -> bytes | None:
    """A unary call's answer, or None when the node refused or dropped the call."""
    try:
        return await call_unary(attacker, target, protocol, data, timeout=20)
    except PEER_ERRORS:
        return None


def stored(answer: bytes | None) -> bool:
    """Whether a store's answer says every item was kept (None: the node refused the call)."""
    return answer is not None and all(pb.StoreResponse.FromString(answer).store_ok)


def map_bomb(size: int, run: int | None = None) -> bytes:
    """About ``size`` bytes of msgpack: an array of ``{0: {}}`` maps, or (``run``) an array of
    arrays of ``run`` such maps each."""
    element = b"\x81\x00\x80"
    if run is None:
        count = (size - 256) // len(element)
        return b"\xdd" + count.to_bytes(4, "big") + element * count
    inner = b"\xdc" + run.to_bytes(2, "big") + element * run
    count = (size - 256) // len(inner)
    return b"\xdd" + count.to_bytes(4, "big") + inner * count


def string_tuple(count: int) -> bytes:
    """A tuple (hivemind's ext 0x40) of ``count`` two-character strings, packed: ~59 bytes of
    memory each once decoded, 3 on the wire."""
    payload = b"\xdd" + count.to_bytes(4, "big") + b"\xa2ab" * count
    return b"\xc9" + len(payload).to_bytes(4, "big") + b"\x40" + payload


async def flood(peer, target, name: str, items: int, strings: int) -> None:
    """One store request of ``items`` sub-keys under a few keys, each sub-key a tuple of a
    number and ``strings`` two-character strings (as large in memory as the door lets one be)."""
    request = pb.StoreRequest()
    expiration = time.time() + 3600
    filler = tuple(f"{i % 100:02d}" for i in range(strings))
    for count in range(items):
        request.keys.append(id_to_bytes(key_id(f"{name}.{count % 8}")))
        request.subkeys.append(dumps((count, *filler)))
        request.values.append(b"\x01")
        request.expiration_time.append(expiration)
        request.in_cache.append(False)
    await try_call(peer, target, STORE, request.SerializeToString())
