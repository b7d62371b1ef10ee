"""A QUIC stream as a trio ``HalfCloseableStream``: what the Host negotiates protocols on.

Received bytes wait in the stream until read, charged to the stream's budget (``budget.StreamBudget``); reading
them is what earns the peer more credit (``Engine.consumed``). Writes are queued in pieces and
wait while the peer has not acknowledged ``send_buffer`` bytes, so a peer that never reads holds
at most that much of ours.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import trio

from ....errors import StreamReset
from ... import limits
from ...sendlock import SendLock
from ...streams import check_max_bytes

if TYPE_CHECKING:
    from .budget import StreamBudget

# Application error codes on RESET_STREAM / STOP_SENDING (libp2p uses 0 for a plain reset).
RESET = 0


class StreamOwner(Protocol):
    """What a stream needs of its connection (the QUIC session provides it)."""

    def consumed(self, stream_id: int, count: int) -> None: ...

    async def wait_send_room(self, stream: "QuicStream") -> None: ...

    def write(self, stream_id: int, data: bytes, *, end_stream: bool = False) -> None: ...

    def stop_reading(self, stream_id: int, code: int) -> None: ...

    def reset_stream(self, stream_id: int, code: int, *, reading: bool) -> None: ...

    def maybe_forget(self, stream: "QuicStream") -> None: ...


class QuicStream(trio.abc.HalfCloseableStream):
    """One bidirectional QUIC stream (see the module docstring)."""

    def __init__(self, session: StreamOwner, stream_id: int, scope: "StreamBudget | None" = None) -> None:
        self._session = session
        self.stream_id = stream_id
        self._scope = scope  # None when unaccounted
        self._buffer = bytearray()
        self._held = 0  # bytes reserved from the scope for the buffer
        self._eof = False
        self._error: BaseException | None = None  # reset by the peer or the connection's end
        self._write_error: BaseException | None = None  # the peer sent STOP_SENDING
        self._fin_sent = False
        self._closed = False
        self._readable = trio.lowlevel.ParkingLot()
        self._send_lock = SendLock()

    # --- called by the session -------------------------------------------------------------
    def _on_data(self, data: bytes, end_stream: bool, now: float) -> bool:
        """Bytes arrived; False when the scope refused to hold them (the session resets us)."""
        if data and not self._closed:
            if self._scope is not None and not self._scope.reserve_memory(len(data), now=now):
                return False
            self._held += len(data) if self._scope is not None else 0
            self._buffer += data
        elif data:
            # read side closed by us: the bytes are not wanted, but they were the peer's to send
            self._session.consumed(self.stream_id, len(data))
        if end_stream:
            self._eof = True
        self._readable.unpark_all()
        return True

    def _on_reset(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._release_buffer()
        self._readable.unpark_all()

    def _on_stop_sending(self) -> None:
        self._write_error = StreamReset(f"stream {self.stream_id}: the peer stopped reading")

    def _release_buffer(self) -> None:
        if self._scope is not None and self._held:
            self._scope.release_memory(self._held)
        self._held = 0
        self._buffer.clear()

    def _release_scope(self) -> None:
        self._release_buffer()
        if self._scope is not None:
            self._scope.close()
            self._scope = None

    @property
    def finished(self) -> bool:
        """Both directions are over (FIN or reset each way): the session may forget the stream."""
        reading_done = self._eof and not self._buffer or self._error is not None or self._closed
        writing_done = self._fin_sent or self._error is not None or self._write_error is not None
        return reading_done and writing_done

    @property
    def budget(self) -> "StreamBudget | None":
        """This stream's memory budget (None when unaccounted or closed)."""
        return self._scope

    # --- HalfCloseableStream ---------------------------------------------------------------
    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        check_max_bytes(max_bytes)
        if self._closed:
            raise trio.ClosedResourceError("stream was closed")
        while not self._buffer:
            if self._error is not None:
                raise self._error
            if self._eof:
                self._session.maybe_forget(self)  # read to the end: over, once our side is too
                await trio.lowlevel.checkpoint()
                return b""
            await self._readable.park()
            if self._closed:
                raise trio.ClosedResourceError("stream was closed")
        count = len(self._buffer) if max_bytes is None else min(max_bytes, len(self._buffer))
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        if self._scope is not None:
            self._scope.release_memory(count)
            self._held -= count
        self._session.consumed(self.stream_id, count)
        await trio.lowlevel.checkpoint()
        return data

    def _check_writable(self) -> None:
        if self._closed or self._fin_sent:
            raise trio.ClosedResourceError("stream is closed for writing")
        if self._error is not None:
            raise self._error
        if self._write_error is not None:
            raise self._write_error

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._send_lock:
            self._check_writable()
            view = memoryview(data)
            if not len(view):
                await trio.lowlevel.checkpoint()
                return
            for start in range(0, len(view), limits.QUIC_SEND_CHUNK):
                await self._session.wait_send_room(self)
                self._check_writable()
                self._session.write(self.stream_id, bytes(view[start : start + limits.QUIC_SEND_CHUNK]))

    async def send_all_then_eof(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` and close our side (the FIN rides with the last piece when it fits)."""
        await self.send_all(data)
        await self.send_eof()

    async def wait_send_all_might_not_block(self) -> None:
        self._check_writable()
        await self._session.wait_send_room(self)

    async def send_eof(self) -> None:
        async with self._send_lock:
            if self._fin_sent or self._closed:
                await trio.lowlevel.checkpoint()
                return
            if self._error is not None:
                raise self._error
            self._fin_sent = True
            if self._write_error is None:
                self._session.write(self.stream_id, b"", end_stream=True)
            self._session.maybe_forget(self)
            await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        """Close both directions: a FIN for what we wrote, STOP_SENDING for what we would not read."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        if not self._fin_sent and self._error is None and self._write_error is None:
            self._fin_sent = True
            self._session.write(self.stream_id, b"", end_stream=True)
        if not self._eof and self._error is None:
            self._session.stop_reading(self.stream_id, RESET)
        self._closed = True
        self._release_buffer()
        self._readable.unpark_all()
        self._session.maybe_forget(self)
        await trio.lowlevel.checkpoint()

    async def reset(self) -> None:
        """Abort the stream in both directions (RESET_STREAM and STOP_SENDING)."""
        if self._error is None:
            self._session.reset_stream(self.stream_id, RESET, reading=not self._eof)
            self._error = StreamReset(f"stream {self.stream_id} was reset by us")
        self._closed = True
        self._release_buffer()
        self._readable.unpark_all()
        self._session.maybe_forget(self)
        await trio.lowlevel.checkpoint()


__all__ = ["QuicStream", "RESET", "StreamOwner"]
