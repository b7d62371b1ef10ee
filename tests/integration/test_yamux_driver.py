"""yamux driver over an in-memory stream pair: reads of any size against big chunks."""

from __future__ import annotations

import os

import trio
import trio.testing

from volunteer.net.yamux import YamuxConnection
from volunteer.net.yamux.frames import ACK, DATA, FIN, HEADER_SIZE, SYN, WINDOW_UPDATE, decode_header
from volunteer.net.yamux.session import YamuxConfig
from tests.recording import RecordingStream, TaskSteps


async def test_small_reads_from_a_big_chunk_return_every_byte_in_order_and_free_the_window():
    """A 1 MiB payload read 1000 bytes at a time comes back exactly, and the peer's window is
    credited for every byte read (the writer of a second MiB is not stalled)."""
    left, right = trio.testing.memory_stream_pair()
    client, server = YamuxConnection(left, is_client=True), YamuxConnection(right, is_client=False)
    payload = os.urandom(1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        outbound = await client.open_stream()

        async def write() -> None:
            await outbound.send_all(payload)
            await outbound.send_all(payload)  # needs the window the reader gives back
            await outbound.send_eof()

        nursery.start_soon(write)
        inbound = await server.accept_stream()
        received = bytearray()
        while data := await inbound.receive_some(1000):
            assert len(data) <= 1000 and type(data) is bytes
            received += data
        assert received == payload + payload
        assert inbound._buffered == 0 and inbound._head_offset == 0
        await inbound.aclose()
        await outbound.aclose()
        nursery.cancel_scope.cancel()



def frames_of(write: bytes) -> list[tuple[int, int, int, int]]:
    """(type, flags, stream id, length) of every yamux frame in one write."""
    found, offset = [], 0
    while offset < len(write):
        frame_type, flags, stream_id, length = decode_header(write, offset)
        found.append((frame_type, flags, stream_id, length))
        offset += HEADER_SIZE + (length if frame_type == DATA else 0)
    return found


async def _opened(client, server, first: bytes):
    """A stream from ``client`` to ``server`` (both running) whose first bytes were read:
    (outbound, inbound)."""
    outbound = await client.open_stream()
    await outbound.send_all(first)
    inbound = await server.accept_stream()
    assert await inbound.receive_some() == first
    return outbound, inbound


async def _pair():
    left, right = trio.testing.memory_stream_pair()
    recorded = RecordingStream(right)
    return YamuxConnection(left, is_client=True), YamuxConnection(recorded, is_client=False), recorded


async def test_the_ack_of_an_accepted_stream_rides_with_its_first_write():
    """Accepting a stream writes nothing by itself: the ACK leaves with the first data, in one write."""
    client, server, recorded = await _pair()
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        outbound, inbound = await _opened(client, server, b"request")
        await trio.testing.wait_all_tasks_blocked()
        before = len(recorded.writes)  # the keepalive's first ping and pong are behind us
        await trio.testing.wait_all_tasks_blocked()
        assert len(recorded.writes) == before  # accepting and reading sent nothing on their own
        await inbound.send_all(b"reply")
        assert len(recorded.writes) == before + 1
        assert frames_of(recorded.writes[-1]) == [
            (WINDOW_UPDATE, ACK, inbound.stream_id, 0),
            (DATA, 0, inbound.stream_id, len(b"reply")),
        ]
        assert await outbound.receive_some() == b"reply"
        nursery.cancel_scope.cancel()


async def test_send_all_then_eof_is_one_write_when_the_window_allows_and_correct_when_not():
    client, server, recorded = await _pair()
    big = os.urandom(3 * YamuxConfig().initial_window)  # three windows: must wait for credit
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        for reply in (b"small reply", big):
            outbound, inbound = await _opened(client, server, b"call")
            await trio.testing.wait_all_tasks_blocked()
            before = len(recorded.writes)
            received = bytearray()

            async def read_all(stream=outbound, into=received) -> None:
                while data := await stream.receive_some():
                    into.extend(data)

            async with trio.open_nursery() as readers:
                readers.start_soon(read_all)
                await inbound.send_all_then_eof(reply)
            assert received == reply  # every byte, then the EOF
            if reply is not big:
                assert len(recorded.writes) == before + 1
                assert [f[:2] for f in frames_of(recorded.writes[before])] == [
                    (WINDOW_UPDATE, ACK), (DATA, 0), (WINDOW_UPDATE, FIN)
                ]
            await outbound.aclose()
            await inbound.aclose()
        nursery.cancel_scope.cancel()


async def test_an_unannounced_stream_sends_its_syn_with_its_first_write():
    left, right = trio.testing.memory_stream_pair()
    recorded = RecordingStream(left)
    client, server = YamuxConnection(recorded, is_client=True), YamuxConnection(right, is_client=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        await trio.testing.wait_all_tasks_blocked()
        before = len(recorded.writes)  # the keepalive's first ping and pong are behind us
        outbound = await client.open_stream(announce=False)
        await trio.testing.wait_all_tasks_blocked()
        assert len(recorded.writes) == before
        await outbound.send_all(b"proposal")
        assert len(recorded.writes) == before + 1
        assert [f[:3] for f in frames_of(recorded.writes[-1])] == [
            (WINDOW_UPDATE, SYN, outbound.stream_id), (DATA, 0, outbound.stream_id)
        ]
        inbound = await server.accept_stream()
        assert await inbound.receive_some() == b"proposal"
        nursery.cancel_scope.cancel()


async def test_a_read_that_waited_for_data_is_not_rescheduled_again_before_it_returns():
    """Woken by the reader task, a read returns in that step: a second pass through the
    scheduler would cost every expert call a loop iteration. A read of data already buffered
    still yields once (trio's checkpoint)."""
    client, server, _ = await _pair()
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        outbound, inbound = await _opened(client, server, b"first")
        steps = TaskSteps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(steps)
        try:
            async def later() -> None:
                await trio.sleep(0.01)
                await outbound.send_all(b"second")

            nursery.start_soon(later)
            assert await inbound.receive_some() == b"second"
            assert steps.steps == 1  # woken once, and returned in that step
            await outbound.send_all(b"third")
            await trio.sleep(0.01)  # arrives and waits in the stream's buffer
            steps.steps = 0
            assert await inbound.receive_some() == b"third"
            assert steps.steps == 1  # data at hand: one checkpoint
        finally:
            trio.lowlevel.remove_instrument(steps)
        await inbound.aclose()
        await outbound.aclose()
        nursery.cancel_scope.cancel()
