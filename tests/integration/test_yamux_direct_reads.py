"""yamux's direct reads (``volunteer/net/yamux/driver.py``) over Noise over real sockets: a
handler's task reads the connection itself, and whatever happens to it there (cancelled while it
waits, mid-frame; a protocol violation; the peer's ping) the connection loses no byte and ends as
it would have with the reader task reading."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from tests.integration.test_stream_contracts import noise_pair
from volunteer.errors import StreamReset
from volunteer.net.transport.tcpstream import FAIR_TURNS, TcpStream
from volunteer.net.yamux import YamuxConnection
from volunteer.net.yamux.frames import DATA, encode_header


@asynccontextmanager
async def _connections(fair_turns: int = FAIR_TURNS) -> AsyncIterator[tuple[YamuxConnection, YamuxConnection, TcpStream]]:
    """A client and a server yamux connection over Noise over a socket pair, both running; and
    the client's raw stream (to write past Noise). Closed on the way out."""
    left, right = (TcpStream(end, fair_turns=fair_turns) for end in socket.socketpair())
    try:
        secure_client, secure_server = await noise_pair(lambda: (left, right))
        client = YamuxConnection(secure_client, is_client=True)
        server = YamuxConnection(secure_server, is_client=False)
        assert server._direct and client._direct  # Noise over TCP loses nothing to a cancel: direct reads on
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            await nursery.start(server.run)
            try:
                yield client, server, left
            finally:
                with trio.CancelScope(shield=True):
                    await client.aclose()
                    await server.aclose()
                nursery.cancel_scope.cancel()
    finally:
        for end in (left, right):
            await trio.aclose_forcefully(end)


async def _handler_stream(client: YamuxConnection, server: YamuxConnection, nursery: trio.Nursery):
    """(outbound, inbound) after one exchange that leaves the handler's task able to read the
    connection itself at once: its last data came from a read that woke it, and the reader waits
    to be woken by it (as a handler's next read, right after its reply, finds it)."""
    outbound = await client.open_stream()
    await outbound.send_all(b"hi")
    inbound = await server.accept_stream()
    assert await inbound.receive_some() == b"hi"
    await trio.testing.wait_all_tasks_blocked()  # the reader waits on the socket again
    nursery.start_soon(outbound.send_all, b"hello")
    assert await inbound.receive_some() == b"hello"  # woken by the reader, which lent it the connection
    return outbound, inbound


def _handler_reads_the_socket(server: YamuxConnection) -> bool:
    """A stream's task reads the connection directly while the reader task waits its turn."""
    return server._reading and len(server._reader_turn) == 1


async def _read_exactly(stream, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = await stream.receive_some(count - len(data))
        assert chunk, "the stream ended early"
        data += chunk
    return bytes(data)


async def test_a_handler_reads_its_next_request_itself_and_every_byte_arrives() -> None:
    """Requests of every size one after another on one stream: the server's handler reads its
    next request from the socket itself after each reply (the reader only starts it), and every
    byte of every request and reply arrives in order."""
    rng = random.Random(7)
    sizes = [rng.choice([1, 100, 5000, 16 * 1024, 70 * 1024]) for _ in range(60)]
    async with _connections() as (client, server, _), trio.open_nursery() as nursery:
        outbound = await client.open_stream()

        async def handle() -> None:
            inbound = await server.accept_stream()
            for size in sizes:
                request = await _read_exactly(inbound, size)
                await inbound.send_all(request[::-1])

        nursery.start_soon(handle)
        for size in sizes:
            request = os.urandom(size)
            await outbound.send_all(request)
            assert await _read_exactly(outbound, size) == request[::-1]
        # all but the first request (the reader's, which started the handler), less any that
        # arrived split in two reads; the caller's replies go through the reader task
        assert server.direct_reads >= len(sizes) - 10, server.direct_reads
        nursery.cancel_scope.cancel()


async def test_a_direct_reader_cancelled_mid_frame_loses_no_byte() -> None:
    """The handler waits on the socket itself, with half of a Noise frame read, when its
    deadline cancels it: the half stays in Noise, and the next read returns the whole message."""
    async with _connections() as (client, server, raw), trio.open_nursery() as nursery:
        outbound, inbound = await _handler_stream(client, server, nursery)
        message = os.urandom(20_000)
        sent = []
        real_send_all = raw.send_all

        async def send_in_halves(data) -> None:  # what the client writes reaches the socket in two parts
            data = bytes(data)
            sent.append(len(data))
            await real_send_all(data[: len(data) // 2])
            await send_half.wait()
            await real_send_all(data[len(data) // 2:])

        send_half = trio.Event()
        raw.send_all = send_in_halves  # type: ignore[method-assign]
        nursery.start_soon(outbound.send_all, message)
        seen: list[bool] = []

        async def look() -> None:
            await trio.testing.wait_all_tasks_blocked()
            seen.append(_handler_reads_the_socket(server))

        nursery.start_soon(look)
        with trio.move_on_after(0.2) as waited:
            await inbound.receive_some()  # reads the first half directly, then waits for the rest
        assert waited.cancelled_caught and sent and seen == [True]
        send_half.set()
        assert await _read_exactly(inbound, len(message)) == message
        assert server.direct_reads >= 1
        nursery.cancel_scope.cancel()


async def test_a_direct_reader_answers_pings_and_carries_other_streams_data() -> None:
    """While one handler waits on the socket itself, a ping is answered and another stream's
    data reaches its own waiting task."""
    async with _connections() as (client, server, _), trio.open_nursery() as nursery:
        first, second = await client.open_stream(), await client.open_stream()
        await first.send_all(b"a")
        await second.send_all(b"b")
        one, two = await server.accept_stream(), await server.accept_stream()
        assert await one.receive_some() == b"a" and await two.receive_some() == b"b"
        got: dict[str, bytes] = {}

        async def wait(name: str, stream) -> None:
            got[name] = await stream.receive_some()

        nursery.start_soon(wait, "one", one)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wait, "two", two)
        await trio.testing.wait_all_tasks_blocked()
        assert server._reading  # somebody waits on the socket: the reader or a handler
        with trio.fail_after(5):
            rtt = await client.ping()
            await second.send_all(b"for two")
            while "two" not in got:
                await trio.sleep(0.001)
        assert rtt >= 0 and got["two"] == b"for two" and "one" not in got
        await first.send_all(b"for one")
        with trio.fail_after(5):
            while "one" not in got:
                await trio.sleep(0.001)
        assert got["one"] == b"for one"
        nursery.cancel_scope.cancel()


async def test_a_protocol_violation_found_by_a_direct_read_ends_the_connection() -> None:
    """The handler reads, directly, a data frame larger than its stream's window: its read ends
    with the stream reset, and the reader says GoAway and closes as it would have."""
    async with _connections() as (client, server, _), trio.open_nursery() as nursery:
        outbound, inbound = await _handler_stream(client, server, nursery)
        before = server.direct_reads
        flood = 2 * server.config.max_window
        # past yamux's window checks on our side: a frame no honest peer sends
        nursery.start_soon(client.secure.send_all, encode_header(DATA, 0, outbound.stream_id, flood) + bytes(64))
        with trio.fail_after(5), pytest.raises(StreamReset):
            await inbound.receive_some()
        assert server.direct_reads == before + 1
        with trio.fail_after(5):
            await server.closed.wait()
            await client.closed.wait()  # the GoAway reached it (or the socket closed)


async def test_closing_the_connection_ends_a_direct_read_at_once() -> None:
    """The connection closes under a handler that waits on the socket itself: its read ends with
    the stream reset, as it would parked on the reader (the socket's close wakes its wait)."""
    async with _connections() as (client, server, _), trio.open_nursery() as nursery:
        _, inbound = await _handler_stream(client, server, nursery)
        seen: list[bool] = []

        async def close_under_it() -> None:
            await trio.testing.wait_all_tasks_blocked()
            seen.append(_handler_reads_the_socket(server))
            await server.aclose()

        nursery.start_soon(close_under_it)
        with trio.fail_after(5), pytest.raises(StreamReset):
            await inbound.receive_some()
        assert seen == [True] and server.closed.is_set()


async def test_the_stream_contract_holds_with_direct_reads() -> None:
    """trio's own half-closeable stream checks (cancellation included) over sockets, where yamux
    streams read the connection themselves."""
    async with trio.open_nursery() as nursery:

        async def make():
            # trio's checks want every operation to yield: TcpStream's fair_turns=1
            client, server, _ = await nursery.start(_serve_pair)
            opened = await client.open_stream()
            await opened.send_all(b"x")
            accepted = await server.accept_stream()
            assert await accepted.receive_some(1) == b"x"
            return opened, accepted

        await trio.testing.check_half_closeable_stream(make, None)
        nursery.cancel_scope.cancel()


async def _serve_pair(task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with _connections(fair_turns=1) as found:
        task_status.started(found)
        await trio.sleep_forever()
