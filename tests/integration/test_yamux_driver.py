"""yamux driver over an in-memory stream pair: reads of any size against big chunks."""

from __future__ import annotations

import os

import trio
import trio.testing

from volunteer.net.yamux import YamuxConnection


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
