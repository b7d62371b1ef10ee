"""Noise trio driver over in-memory stream pairs and real loopback TCP."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from volunteer.errors import HandshakeError, PeerIDMismatch, RemoteProtocolError
from volunteer.net.identity import KeyPair
from volunteer.net.noise import Handshake, NoiseConnection, secure_inbound, secure_outbound
from volunteer.net.streams import BufferedStream

ALICE, BOB = KeyPair.generate(), KeyPair.generate()
YAMUX = "/yamux/1.0.0"


async def secure_pair(left, right, expected=None, muxers=(YAMUX,)) -> tuple[NoiseConnection, NoiseConnection]:
    """Alice dials over ``left``, Bob answers over ``right``."""
    result = {}

    async def inbound():
        result["bob"] = await secure_inbound(right, BOB, muxers)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(inbound)
        result["alice"] = await secure_outbound(left, ALICE, BOB.peer_id if expected is None else expected, muxers)
    return result["alice"], result["bob"]


async def receive_exactly(stream, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = await stream.receive_some()
        assert chunk, f"EOF after {len(out)} of {size} bytes"
        out += chunk
    return bytes(out)


async def test_handshake_both_roles_and_identities():
    with trio.fail_after(10):
        alice, bob = await secure_pair(*trio.testing.memory_stream_pair())
        assert alice.remote_peer == BOB.peer_id and bob.remote_peer == ALICE.peer_id
        assert alice.local_peer == ALICE.peer_id and bob.local_peer == BOB.peer_id
        assert alice.remote_public_key == BOB.public_key and bob.remote_public_key == ALICE.public_key
        assert alice.remote_muxers == [YAMUX] == bob.remote_muxers
        assert isinstance(alice.raw, trio.abc.Stream)


@pytest.mark.parametrize("size", [0, 1, 65519, 65520, 300_000, 3 << 20])
async def test_data_both_ways_is_byte_exact(size):
    with trio.fail_after(20):
        alice, bob = await secure_pair(*trio.testing.memory_stream_pair())
        payload = os.urandom(size)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(alice.send_all, payload)
            nursery.start_soon(bob.send_all, payload[::-1])
            assert await receive_exactly(bob, size) == payload
            assert await receive_exactly(alice, size) == payload[::-1]
        await alice.send_all(b"")  # a 0-byte send sends nothing: the next read sees the next data
        await alice.send_all(b"end")
        assert await bob.receive_some() == b"end"


async def test_max_bytes_and_receive_conflict():
    with trio.fail_after(10):
        alice, bob = await secure_pair(*trio.testing.memory_stream_pair())
        await alice.send_all(b"0123456789")
        assert await bob.receive_some(3) == b"012"
        assert await bob.receive_some(100) == b"3456789"
        with pytest.raises(ValueError):
            await bob.receive_some(0)
        payload = os.urandom(200_000)
        await alice.send_all(payload)
        pieces = []
        while sum(map(len, pieces)) < len(payload):
            pieces.append(await bob.receive_some(999))
            assert 0 < len(pieces[-1]) <= 999
        assert b"".join(pieces) == payload
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bob.receive_some)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await bob.receive_some()
            await alice.send_all(b"x")


async def test_concurrent_senders_do_not_interleave_frames():
    with trio.fail_after(20):
        alice, bob = await secure_pair(*trio.testing.memory_stream_pair())
        blobs = [bytes([i]) * 200_000 for i in range(6)]
        async with trio.open_nursery() as nursery:
            for blob in blobs:
                nursery.start_soon(alice.send_all, blob)
        data = await receive_exactly(bob, sum(map(len, blobs)))
        # Each send arrives whole (the lock orders sends; nonces follow wire order).
        runs = [data[i : i + 200_000] for i in range(0, len(data), 200_000)]
        assert sorted(runs) == sorted(blobs)


async def test_buffered_stream_with_bytes_read_ahead():
    """multistream-select may have read the start of the first Noise message already."""
    with trio.fail_after(10):
        left, right = trio.testing.memory_stream_pair()
        result = {}

        async def inbound():
            ahead = await right.receive_some(5)
            result["bob"] = await secure_inbound(BufferedStream(right, ahead), BOB)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(inbound)
            alice = await secure_outbound(BufferedStream(left), ALICE, BOB.peer_id)
        await alice.send_all(b"through buffers")
        assert await result["bob"].receive_some() == b"through buffers"


async def test_transport_data_in_the_same_read_as_message_3():
    with trio.fail_after(10):
        left, right = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            result = {}

            async def inbound():
                result["bob"] = await secure_inbound(right, BOB)

            nursery.start_soon(inbound)
            core = Handshake(True, ALICE, expected_peer=BOB.peer_id)
            await left.send_all(core.write_message())
            while not core.receive_data(await left.receive_some()):
                pass
            m3 = core.write_message()
            await left.send_all(m3 + bytes(core.transport().encrypt(b"early data")))
        assert await result["bob"].receive_some() == b"early data"


async def test_peer_id_mismatch():
    with trio.fail_after(10):
        left, right = trio.testing.memory_stream_pair()
        stranger = KeyPair.generate().peer_id
        errors = {}

        async def inbound():
            try:
                await secure_inbound(right, BOB)
            except HandshakeError as exc:
                errors["bob"] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(inbound)
            with pytest.raises(PeerIDMismatch) as excinfo:
                await secure_outbound(left, ALICE, stranger)
            await left.aclose()  # the caller owns the stream and closes it
        assert str(stranger) in str(excinfo.value) and str(BOB.peer_id) in str(excinfo.value)
        assert "bob" in errors


@pytest.mark.parametrize("garbage", [b"", b"\x00", b"\x00\x05hello", b"\x00\x60" + b"\x07" * 96, b"\x00\x20" + b"\x00" * 32])
async def test_garbage_or_eof_during_the_handshake(garbage):
    with trio.fail_after(10):
        left, right = trio.testing.memory_stream_pair()

        async def fake_responder():
            await right.receive_some()  # Alice's message 1
            await right.send_all(garbage)
            await right.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fake_responder)
            with pytest.raises(HandshakeError):
                await secure_outbound(left, ALICE, BOB.peer_id)


async def test_broken_stream_during_the_handshake_is_a_handshake_error():
    with trio.fail_after(10):
        left, right = trio.testing.memory_stream_pair()
        await right.aclose()
        with pytest.raises(HandshakeError):
            await secure_inbound(left, BOB)


async def test_garbage_after_the_handshake_closes_the_connection():
    with trio.fail_after(10):
        left, right = trio.testing.memory_stream_pair()
        alice, bob = await secure_pair(left, right)
        await left.send_all(b"\x00\x20" + os.urandom(32))  # a well-framed forgery
        with pytest.raises(RemoteProtocolError):
            await bob.receive_some()
        with pytest.raises(trio.BrokenResourceError):
            await bob.receive_some()
        with pytest.raises(trio.BrokenResourceError):
            await bob.send_all(b"anything")
        assert await left.receive_some() == b""  # Bob closed the raw stream


async def test_eof_handling():
    with trio.fail_after(10):
        alice, bob = await secure_pair(*trio.testing.memory_stream_pair())
        await alice.send_all(b"last words")
        await alice.send_eof()
        assert await bob.receive_some() == b"last words"
        assert await bob.receive_some() == b""
        assert await bob.receive_some() == b""
        await bob.send_all(b"half-closed: the other way still works")
        assert await alice.receive_some() == b"half-closed: the other way still works"
        with pytest.raises(trio.ClosedResourceError):
            await alice.send_all(b"after eof")


async def test_peer_vanishing_mid_frame():
    with trio.fail_after(10):
        left, right = trio.testing.memory_stream_pair()
        alice, bob = await secure_pair(left, right)
        wire = bytes(alice.transport.encrypt(b"cut short"))
        await left.send_all(wire[:-3])
        await left.aclose()
        with pytest.raises(trio.BrokenResourceError):
            await bob.receive_some()


async def test_aclose_then_use():
    with trio.fail_after(10):
        alice, bob = await secure_pair(*trio.testing.memory_stream_pair())
        await alice.aclose()
        await alice.aclose()  # idempotent
        with pytest.raises(trio.ClosedResourceError):
            await alice.send_all(b"x")
        with pytest.raises(trio.ClosedResourceError):
            await alice.receive_some()
        assert await bob.receive_some() == b""


async def test_cancelled_send_breaks_later_sends():
    with trio.fail_after(10):
        left, right = trio.testing.lockstep_stream_pair()
        alice, bob = await secure_pair(left, right)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(alice.send_all, b"x" * 100_000)
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
        with pytest.raises(trio.BrokenResourceError):
            await alice.send_all(b"more")


async def test_loopback_tcp_echo():
    with trio.fail_after(30):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        size = 8 << 20
        payload = os.urandom(size)

        async def echo(stream):
            conn = await secure_inbound(stream, BOB, [YAMUX])
            while data := await conn.receive_some():
                await conn.send_all(data)
            await conn.send_eof()

        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, echo, listeners)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            conn = await secure_outbound(stream, ALICE, BOB.peer_id, [YAMUX])
            assert conn.remote_muxers == [YAMUX]
            received = bytearray()

            async def writer():
                view = memoryview(payload)
                for start in range(0, size, 1 << 20):
                    await conn.send_all(view[start : start + (1 << 20)])
                await conn.send_eof()

            nursery.start_soon(writer)
            while data := await conn.receive_some():
                received += data
            assert bytes(received) == payload
            await conn.aclose()
            nursery.cancel_scope.cancel()
