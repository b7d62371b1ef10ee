"""The echo handler and round trip the transport tests share: bytes in, the same bytes back."""

from __future__ import annotations

import trio


async def echo(stream) -> None:
    """Serve one stream: send back whatever arrives, then close our side at the peer's EOF."""
    while data := await stream.receive_some(1 << 20):
        await stream.send_all(data)
    await stream.send_eof()


async def roundtrip(stream, payload: bytes) -> bytes:
    """Send ``payload`` and our EOF while reading everything that comes back, until EOF."""
    received = bytearray()
    async with trio.open_nursery() as nursery:

        async def send() -> None:
            await stream.send_all(payload)
            await stream.send_eof()

        nursery.start_soon(send)
        while data := await stream.receive_some(1 << 20):
            received += data
    return bytes(received)
