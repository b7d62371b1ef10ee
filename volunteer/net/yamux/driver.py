"""trio driver for yamux: one reader task, one writer path under a lock, streams as trio streams.

**Direct reads.** A stream's task that finds no data while nobody reads the connection reads it
itself, once, and dispatches what came as the reader would (its own data, others', control
frames), then goes on with its data in the same step, where the reader would have woken it for
the next loop pass. For a task to find the connection unread, the reader waits after a read that
woke the task of one stream the peer opened (a handler, which reads again once it has answered)
until that task has taken its data (it is *lent* the connection), and after a direct read until
woken by it: so a server's handler that reads its next request right after sending its reply
waits on the socket itself and is woken by the request, a loop pass before the reader would
have woken it. A caller's task takes its reply and goes: the reader reads on at once for it.
Only over a channel whose ``receive_some`` loses nothing when cancelled (``receive_cancel_safe``:
Noise over TCP), since the stream's task may be cancelled while it waits there.
"""

from __future__ import annotations

import logging
from collections import deque

import trio

from ...errors import ConnectionClosed, LocalProtocolError, RemoteProtocolError, ResourceLimitExceeded
from ...errors import StreamReset as StreamResetError
from ..limits import READ_CHUNK, YAMUX_GOAWAY_FLUSH_TIMEOUT
from ..sendlock import SendLock
from ..streams import check_max_bytes
from .budget import ConnectionBudget, StreamBudget
from .frames import GO_AWAY_NORMAL
from .session import (
    ConnectionTerminated,
    DataReceived,
    GoAwayReceived,
    PingAcked,
    Session,
    StreamEOF,
    StreamOpened,
    StreamReset,
    WindowUpdated,
    YamuxConfig,
)

log = logging.getLogger(__name__)


class YamuxStream(trio.abc.HalfCloseableStream):
    """One yamux stream: ``receive_some`` returns b"" after the peer's FIN; StreamReset after RST."""

    def __init__(self, conn: "YamuxConnection", stream_id: int) -> None:
        self._conn = conn
        self.stream_id = stream_id
        self._chunks: deque[bytes] = deque()
        self._head_offset = 0  # bytes of _chunks[0] already returned
        self._buffered = 0
        self._eof = False
        self._reset = False
        self._write_closed = False
        self._read_closed = False
        self._closed = False  # aclose() was called: trio's contract then wants ClosedResourceError
        self._receiving = False
        self._readable = trio.lowlevel.ParkingLot()
        self._writable = trio.lowlevel.ParkingLot()
        self._send_conflict = SendLock()

    # --- reading ----------------------------------------------------------------------------
    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        check_max_bytes(max_bytes)
        if self._closed:
            await trio.lowlevel.checkpoint()
            raise trio.ClosedResourceError("this yamux stream was closed")
        if self._receiving:  # trio's contract: a second concurrent reader is a bug, said at once
            raise trio.BusyResourceError("another task is already receiving on this yamux stream")
        self._receiving = True
        conn = self._conn
        try:
            waited = False
            while not self._chunks:
                if self._closed:  # closed by another task while we waited
                    raise trio.ClosedResourceError("this yamux stream was closed")
                if self._reset:
                    raise StreamResetError(f"yamux stream {self.stream_id} was reset")
                if self._eof or self._read_closed:
                    await trio.lowlevel.checkpoint()
                    return b""
                if conn._direct and not conn._reading and not conn.session.terminated:
                    await conn._read_directly()  # a checkpoint too, as the raw stream's receive is
                else:
                    await self._readable.park()
                waited = True
            head = self._chunks[0]
            start = self._head_offset
            if max_bytes is not None and len(head) - start > max_bytes:
                # Hand out a slice and keep an offset into the chunk: putting the remainder back as
                # a new slice would copy it again on every small read (quadratic in the chunk size).
                chunk = head[start : start + max_bytes]
                self._head_offset = start + max_bytes
            else:
                self._chunks.popleft()
                chunk = head[start:] if start else head
                self._head_offset = 0
            self._buffered -= len(chunk)
            self._conn._consumed(self.stream_id, len(chunk))
            if not waited:  # a read that parked has been through the scheduler already: a second
                await trio.lowlevel.checkpoint()  # pass would cost each expert call a loop iteration
            return chunk
        finally:
            self._receiving = False
            if conn._lent_to is self:
                conn._lend_back()

    # --- writing ----------------------------------------------------------------------------
    async def send_all(self, data) -> None:
        async with self._send_conflict:
            view = memoryview(data)
            if not len(view):
                await trio.lowlevel.checkpoint()
                self._check_writable()
            while len(view):
                self._check_writable()
                sent = self._conn._queue_data(self.stream_id, view)
                if sent:
                    view = view[sent:]
                    await self._conn._flush()
                else:
                    await self._writable.park()

    async def send_all_then_eof(self, data) -> None:
        """``send_all(data)`` then ``send_eof()``; when the peer's window takes all of ``data``,
        the data and the FIN leave in one write (a reply that ends its stream)."""
        async with self._send_conflict:
            view = memoryview(data)
            self._check_writable()
            if len(view) <= self._conn.session.send_window(self.stream_id):
                self._conn._queue_data(self.stream_id, view)
                self._write_closed = True
                self._conn.session.close_write(self.stream_id)
                await self._conn._flush()
                self._conn._maybe_forget(self)
                return
        await self.send_all(data)
        await self.send_eof()

    @property
    def has_buffered_data(self) -> bool:
        """Received bytes wait to be read (a read would return at once with data)."""
        return bool(self._chunks)

    def _check_writable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this yamux stream was closed")
        if self._reset:
            raise StreamResetError(f"yamux stream {self.stream_id} was reset")
        if self._write_closed:
            raise trio.ClosedResourceError("stream closed for writing")
        self._conn._check_open()

    async def wait_send_all_might_not_block(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            raise trio.ClosedResourceError("this yamux stream was closed")
        while not self._reset and not self._write_closed and self._conn.session.send_window(self.stream_id) <= 0:
            await self._writable.park()
        await trio.lowlevel.checkpoint()  # trio's contract: always a checkpoint, even with window to spare

    async def send_eof(self) -> None:
        async with self._send_conflict:
            if self._write_closed or self._reset:
                await trio.lowlevel.checkpoint()
                return
            self._write_closed = True
            if not self._conn.closed.is_set():
                self._conn.session.close_write(self.stream_id)
                await self._conn._flush()
            self._conn._maybe_forget(self)

    async def aclose(self) -> None:
        """Close our side (FIN) and stop reading (go's Close). The stream counts as closed at once,
        even when the FIN cannot be sent (``trio.aclose_forcefully`` cancels us): data the peer
        sends from now on resets the stream, so its writer never waits for a reader that is gone."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self._read_closed = True
        self._conn.session.stop_reading(self.stream_id)
        if self._buffered:
            # Unread data will never be read: give the peer its window back.
            self._conn._consumed(self.stream_id, self._buffered)
        self._chunks.clear()
        self._head_offset = 0
        self._buffered = 0
        self._readable.unpark_all()
        try:
            if not self._reset and not self._conn.closed.is_set():
                await self.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except trio.Cancelled:
            # no FIN went out: abort instead of leaving the peer half-open, and let the
            # connection's control writer send the RST, since this task may not wait for it
            self._conn.session.reset(self.stream_id)
            self._conn._control_pending.set()
            raise
        finally:
            self._conn._forget(self.stream_id)
        await trio.lowlevel.checkpoint()

    async def reset(self) -> None:
        """Abort both directions (RST)."""
        if not self._reset:
            self._reset = True
            self._conn.session.reset(self.stream_id)
            self._conn._control_pending.set()  # sent even if this task is cancelled before flushing
            self._wake()
            self._conn._forget(self.stream_id)
            try:
                await self._conn._flush()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        await trio.lowlevel.checkpoint()

    def _wake(self) -> None:
        self._readable.unpark_all()
        self._writable.unpark_all()

    @property
    def budget(self) -> StreamBudget | None:
        """This stream's memory budget (None when unaccounted or already closed)."""
        return self._conn.session.stream_budget(self.stream_id)


class YamuxConnection:
    """A yamux session over a secure stream. Start it with ``await nursery.start(conn.run)``."""

    def __init__(
        self,
        secure: trio.abc.Stream,
        is_client: bool,
        config: YamuxConfig | None = None,
        clock=trio.current_time,
        budget: ConnectionBudget | None = None,
    ) -> None:
        """``budget``: the connection's memory budget (streams and windows are reserved there)."""
        self.secure = secure
        self._send_parts = getattr(secure, "send_all_parts", None)
        self.config = config or YamuxConfig()
        if clock is trio.current_time:
            try:  # the run's clock itself: one Python call a reading instead of three
                clock = trio.lowlevel.current_clock().current_time
            except RuntimeError:
                pass  # built outside a run: read it through trio each time
        self.clock = clock
        self.session = Session(is_client, self.config, budget=budget)
        self.streams: dict[int, YamuxStream] = {}
        self._accept_send, self._accept_receive = trio.open_memory_channel(float("inf"))
        self._send_lock = SendLock()
        self._control_pending = trio.Event()
        self._ping_waiters: list[trio.Event] = []
        self._open_waiters = trio.lowlevel.ParkingLot()
        self.closed = trio.Event()
        self.close_reason: BaseException | None = None
        self.rtt: float | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self._direct = bool(getattr(secure, "receive_cancel_safe", False))  # see "Direct reads"
        self._reading = False  # a task (the reader, or a stream's) is inside secure.receive_some
        self._reader_turn = trio.lowlevel.ParkingLot()  # the reader, while a stream's task reads
        self._lent_to: YamuxStream | None = None  # whose task the reader's last read woke, alone
        self._woken: list[YamuxStream] = []  # streams whose waiting task the current read woke
        self.direct_reads = 0  # reads made by a stream's own task

    @property
    def num_streams(self) -> int:
        return len(self.streams)

    # --- lifetime ------------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Read frames, write control frames, keep the connection alive, until it closes."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._control_writer)
            nursery.start_soon(self._keepalive)
            task_status.started()
            try:
                await self._reader()
            finally:
                nursery.cancel_scope.cancel()

    async def _reader(self) -> None:
        try:
            while not self.closed.is_set():
                if self._reading or self._lent_to is not None:  # woken by that stream's task
                    await self._reader_turn.park()
                    continue
                if self.session.terminated:  # a stream's direct read found the peer broke the protocol
                    await self._end_session()
                    return
                self._reading = True
                try:
                    data = await self.secure.receive_some(READ_CHUNK)
                finally:
                    self._reading = False
                if not self._absorb(data):
                    if not self.closed.is_set():
                        await self._end_session()
                    return
                if len(self._woken) == 1 and self._direct and not self.session.is_ours(self._woken[0].stream_id):
                    self._lent_to = self._woken[0]
        except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError) as exc:
            self._read_failed(exc)

    async def _read_directly(self) -> None:
        """One read of the connection by a stream's task (see "Direct reads"); the reader reads
        on after it. A broken connection ends here; a protocol error is the reader's to end."""
        self._reading = True
        try:
            data = await self.secure.receive_some(READ_CHUNK)
        except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError) as exc:
            self._read_failed(exc)
            return
        finally:
            self._reading = False
            self._reader_turn.unpark_all()
        self.direct_reads += 1
        self._absorb(data)

    def _lend_back(self) -> None:
        """The lent stream's task took its data (or gave up): the reader reads on."""
        self._lent_to = None
        self._reader_turn.unpark_all()

    def _absorb(self, data) -> bool:
        """What one read brought, frames to events, events to streams; False when the connection
        is over: the peer closed it (terminated here) or broke the protocol (``_end_session``)."""
        session = self.session
        if not data:
            self._terminate(None if session.remote_go_away or session.local_go_away else ConnectionClosed("peer closed the connection"))
            return False
        self.bytes_received += len(data)
        queued = session.queued_frames
        self._woken.clear()
        for event in session.receive_data(data, self.clock()):
            self._dispatch(event)
        if session.queued_frames > queued:
            # only what these frames asked for (pongs, window updates, RSTs): an ACK
            # already waiting rides with its stream's first write (see accept_stream)
            self._control_pending.set()
        return not session.terminated

    async def _end_session(self) -> None:
        """After a protocol violation: try to say GoAway, but a peer that floods us and never reads
        would hold the send lock forever: give it a bounded moment, then close the socket."""
        with trio.move_on_after(YAMUX_GOAWAY_FLUSH_TIMEOUT):
            await self._flush_quietly()
        self._terminate(self.close_reason)
        await trio.aclose_forcefully(self.secure)

    def _read_failed(self, exc: BaseException) -> None:
        self._terminate(exc if not isinstance(exc, trio.ClosedResourceError) or not self.closed.is_set() else None)

    def _dispatch(self, event) -> None:
        kind = type(event)
        if kind is DataReceived:
            stream = self.streams.get(event.stream_id)
            if stream is None or stream._read_closed:
                # Nobody will read it: credit the window back so the peer is not stalled forever.
                self.session.consume(event.stream_id, len(event.data), self.clock())
                return
            stream._chunks.append(event.data)
            stream._buffered += len(event.data)
            if stream._readable:
                self._woken.append(stream)
                stream._readable.unpark_all()
        elif kind is WindowUpdated:
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream._writable.unpark_all()
            self._open_waiters.unpark_all()
        elif kind is StreamOpened:
            stream = YamuxStream(self, event.stream_id)
            self.streams[event.stream_id] = stream
            self._accept_send.send_nowait(stream)
        elif kind is StreamEOF:
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream._eof = True
                stream._wake()
                self._maybe_forget(stream)
        elif kind is StreamReset:
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None:
                stream._reset = True
                stream._wake()
        elif kind is PingAcked:
            self.rtt = event.rtt
            waiters, self._ping_waiters = self._ping_waiters, []
            for waiter in waiters:
                waiter.set()
        elif kind is GoAwayReceived:
            self._open_waiters.unpark_all()
        elif kind is ConnectionTerminated:
            self.close_reason = event.error

    def _maybe_forget(self, stream: YamuxStream) -> None:
        if stream._eof and stream._write_closed and stream.stream_id not in self.session.streams:
            self.streams.pop(stream.stream_id, None)

    def _forget(self, stream_id: int) -> None:
        self.streams.pop(stream_id, None)

    def _terminate(self, reason: BaseException | None) -> None:
        if self.closed.is_set():
            return
        if reason is not None and self.close_reason is None:
            self.close_reason = reason
        self.session.terminated = True
        self.session.release_resources()
        self.closed.set()
        for stream in list(self.streams.values()):
            if not (stream._eof and stream._write_closed):
                stream._reset = True
            stream._wake()
        self.streams.clear()
        self._open_waiters.unpark_all()
        self._reader_turn.unpark_all()
        for waiter in self._ping_waiters:
            waiter.set()
        self._accept_send.close()

    def _check_open(self) -> None:
        if self.closed.is_set():
            raise ConnectionClosed("yamux connection is closed") if self.close_reason is None else StreamResetError(
                f"connection died: {self.close_reason}"
            )

    async def aclose(self) -> None:
        """GoAway, flush, close the secure stream; every stream fails from now on."""
        if self.closed.is_set():
            # Already terminated (peer EOF, protocol error): the socket underneath still needs closing.
            await trio.aclose_forcefully(self.secure)
            return
        self.session.go_away(GO_AWAY_NORMAL)
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await self._flush_quietly()
        self._terminate(None)
        await trio.aclose_forcefully(self.secure)

    # --- writing -----------------------------------------------------------------------------
    def _queue_data(self, stream_id: int, view: memoryview) -> int:
        try:
            return self.session.send_data(stream_id, view)
        except LocalProtocolError as exc:
            self._check_open()
            raise StreamResetError(str(exc)) from None

    async def _flush(self) -> None:
        async with self._send_lock:
            chunks = self.session.take_outbox()
            if not chunks:
                return
            self.bytes_sent += sum(len(chunk) for chunk in chunks)
            try:
                if self._send_parts is not None:
                    # Noise frames the header/payload list itself: no join of every payload byte.
                    await self._send_parts(chunks)
                else:
                    await self.secure.send_all(b"".join(chunks))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._terminate(exc)
                raise StreamResetError(f"connection broke: {exc}") from exc

    async def _flush_quietly(self) -> None:
        try:
            await self._flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _control_writer(self) -> None:
        # Window updates, acks and pongs queued by the reader go out here, so the reader never
        # blocks on a peer that is not reading.
        while True:
            await self._control_pending.wait()
            self._control_pending = trio.Event()
            await self._flush_quietly()

    async def _keepalive(self) -> None:
        interval, timeout = self.config.keepalive_interval, self.config.ping_timeout
        first = True
        while True:
            # Measure the RTT at once (window auto-tuning needs it), then every ``interval``.
            if not first:
                await trio.sleep(interval)
            first = False
            try:
                with trio.fail_after(timeout):
                    await self.ping()
            except trio.TooSlowError:
                log.info("yamux keepalive: no pong within %ss; closing", timeout)
                self._terminate(ConnectionClosed(f"keepalive ping timed out after {timeout}s"))
                await trio.aclose_forcefully(self.secure)
                return
            except (StreamResetError, ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                return

    def _consumed(self, stream_id: int, count: int) -> None:
        queued = self.session.queued_frames
        self.session.consume(stream_id, count, self.clock())
        if self.session.queued_frames > queued:  # a real window update, not a waiting ACK
            self._control_pending.set()

    # --- API ------------------------------------------------------------------------------------
    async def open_stream(self, *, announce: bool = True) -> YamuxStream:
        """A new outbound stream. ``announce=False``: its SYN waits in the outbox for the stream's
        first write (or any other flush) instead of costing a write of its own; only for a caller
        that writes at once (multistream's dialer always does: it proposes first)."""
        while True:
            self._check_open()
            try:
                stream_id = self.session.open_stream(self.clock())
                break
            except ResourceLimitExceeded:
                if self.session.can_open_stream():
                    raise  # a hard limit (streams, or the resource manager), not a wait for acks
                await self._open_waiters.park()  # wait for acks of earlier streams
            except LocalProtocolError as exc:
                raise ConnectionClosed(str(exc)) from None
        stream = YamuxStream(self, stream_id)
        self.streams[stream_id] = stream
        if announce:
            await self._flush()
        else:
            await trio.lowlevel.checkpoint()
        return stream

    async def accept_stream(self) -> YamuxStream:
        try:
            stream = await self._accept_receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise ConnectionClosed("yamux connection is closed") from None
        # The ACK waits in the outbox for the stream's first write (inbound negotiation answers
        # at once: header, echo or na), or for any other flush on this connection, whichever
        # comes first: one socket write less per call than waking the control writer for it.
        self.session.accept_stream(stream.stream_id)
        return stream

    async def ping(self) -> float:
        """Round-trip time of one yamux ping, in seconds."""
        self._check_open()
        waiter = trio.Event()
        self._ping_waiters.append(waiter)
        self.session.ping(self.clock())
        await self._flush()
        await waiter.wait()
        self._check_open()
        assert self.rtt is not None  # the pong that set our waiter measured it
        return self.rtt
