"""The trio side of hivemind's RPC framings: serve and make unary and stream calls on our Host.

Thin: all parsing and every bound lives in ``framing``, and what a served call may hold in the
service's ``door.Door`` (its budgets and pace). One call per libp2p stream, as hivemind's p2pd
does it (it cannot share a stream between calls, so the stream pool is not used here).
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import NoReturn

import trio

from ..errors import RemoteProtocolError, describe
from ..net.connection import NetStream
from ..net.identity import PeerID
from ..net.service import HostAPI
from ..net.streams import close_quietly, reset_quietly
from . import limits
from .door import EVICTED, SLOW_BODY, SLOW_READER, TOTAL_REQUEST_BYTES, Door, Reservation
from .errors import HivemindBusy, HivemindRPCError, HivemindTooSlow
from .framing import (
    BodyPace,
    DelimitedDecoder,
    Frame,
    FrameDecoder,
    FrameKind,
    UnaryCall,
    UnaryReply,
    encode_call,
    encode_end,
    encode_error,
    encode_frame,
    encode_reply,
    new_call_id,
    parse_call,
    parse_reply,
    peek_call_id,
)

log = logging.getLogger(__name__)

UnaryHandler = Callable[[bytes, PeerID], Awaitable[bytes]]
StreamHandler = Callable[[list[bytes], PeerID], AsyncIterator[bytes]]
READ_CHUNK = 1 << 16
SEND_PART = 1 << 16  # an answer is sent, and its pace checked, in parts of this many bytes
# how long a call waits for the room its door freed by dropping a larger holder's calls (they
# unwind at their next checkpoint: well under a second, unless the machine is very busy)
EVICTION_WAIT = 5.0
# how long past its pace's deadline a request's bytes still count, if they come at once
PACE_SLACK = 1.0


class _Refused(Exception):
    """A reservation refused a stream call while its frames arrived (``reason``: its exception)."""

    def __init__(self, reason: Exception) -> None:
        super().__init__(str(reason))
        self.reason = reason


def error_text(exc: BaseException) -> str:
    """How a failed handler's exception reaches a hivemind caller (hivemind sends ``repr(e)``)."""
    return f"{type(exc).__name__}({str(exc)!r})"


async def receive_paced(stream: trio.abc.ReceiveStream, pace: BodyPace | None) -> bytes | bytearray:
    """The next bytes of a request, or HivemindTooSlow when none came by ``pace``'s deadline
    (``pace`` None: wait as long as it takes). Past the deadline, bytes that arrive within
    ``PACE_SLACK`` still count: our own busy event loop may be what kept them waiting."""
    if pace is None:
        return await stream.receive_some(READ_CHUNK)
    for deadline in (pace.deadline, max(pace.deadline, trio.current_time()) + PACE_SLACK):
        with trio.move_on_at(deadline):
            data = await stream.receive_some(READ_CHUNK)
            pace.on_data(len(data))
            return data
    raise HivemindTooSlow(f"request arrived slower than {pace.min_rate:.0f} B/s ({pace.received} bytes)")


async def _read_delimited(
    stream: trio.abc.ReceiveStream, max_size: int, served: "_Served | None" = None
) -> tuple[bytes, Exception | None]:
    """One delimited message, and None; or, when ``served``'s door refused the announced length,
    the message's first bytes (read past, never held) and the refusal."""
    decoder = DelimitedDecoder(max_size)
    refusal: Exception | None = None
    reserved = served is None
    pace = served.pace if served is not None else None
    while True:
        data = await receive_paced(stream, pace)
        if not data:
            raise RemoteProtocolError("stream ended inside a hivemind unary message")
        body = decoder.receive_data(data)
        if not reserved and decoder.announced is not None:
            reserved = True
            assert served is not None
            try:
                await served.reserve(decoder.announced)  # before the body is read
            except HivemindBusy as exc:
                if body is None:
                    decoder.skip()
                refusal = exc
        if body is not None:
            return body, refusal


class _Served:
    """One served call at its door (or at none): the reservation of what it holds, the pace its
    request must keep, and how its answer goes out. The answer's bytes are reserved too, and due
    at the door's pace: a caller that does not read its answer loses the stream, and with it what
    the answer held. ``scope`` is the call's own: the door cancels it to drop the call when its
    address holds the most of a full door and a smaller holder needs room."""

    def __init__(self, stream: NetStream, door: Door | None) -> None:
        self.stream = stream
        self.door = door
        self.scope = trio.CancelScope()
        self.reservation: Reservation | None = None
        self.pace: BodyPace | None = None
        self._answer_bytes = 0
        if door is not None:
            self.reservation = door.open(stream.remote_peer, stream.connection.remote_addr)
            self.reservation.evict = self.scope.cancel
            self.pace = door.pace(trio.current_time())

    async def reserve(self, nbytes: int) -> None:
        """Reserve ``nbytes`` more; when all peers' share is full, the door may drop a larger
        holder's calls, and this call waits (``EVICTION_WAIT`` at most) for the room they free.
        HivemindBusy when it does not fit."""
        if self.reservation is None or self.door is None:
            return
        try:
            self.reservation.grow(nbytes, trio.current_time())
            return
        except HivemindBusy as refused:
            full = refused.reason == TOTAL_REQUEST_BYTES
            if not (full and self.door.evict_for(self.reservation, nbytes, now=trio.current_time())):
                raise
        with trio.move_on_after(EVICTION_WAIT):
            while self.door.held + nbytes > self.door.limits.total:
                released = trio.Event()
                self.door.listen(released.set)
                await released.wait()
        self.reservation.grow(nbytes, trio.current_time())  # HivemindBusy if the room did not come

    def dropped(self) -> None:
        """Raise if the door dropped this call (the Host then resets its stream)."""
        if self.scope.cancelled_caught:
            raise HivemindBusy(f"{self.stream.protocol}: dropped to make room for a smaller holder's calls", EVICTED)

    @property
    def max_request(self) -> int:
        """The largest unary request this call may send."""
        return self.door.max_request if self.door is not None else limits.MAX_UNARY_MESSAGE

    def too_slow(self, exc: HivemindTooSlow, reason: str = SLOW_BODY) -> NoReturn:
        """Count ``exc`` against the caller and raise it (the Host resets the stream)."""
        if self.door is not None:
            self.door.refuse(reason, self.stream.remote_peer, now=trio.current_time())
        raise exc

    async def reserve_answer(self, nbytes: int) -> None:
        """Reserve what ``nbytes`` more of the answer hold (HivemindBusy past a budget). By then
        the request's bytes are parsed and dropped, so the call holds the larger of its request
        and its answer: only an answer larger than the request reserves more."""
        self._answer_bytes += nbytes
        if self.reservation is not None:
            await self.reserve(self._answer_bytes - self.reservation.held)

    async def send(self, data: bytes, *, eof: bool = False) -> None:
        """Send ``data`` (then EOF, with ``eof``) as the caller reads it: in parts of
        ``SEND_PART`` bytes, each of which must go within the door's ``answer_grace`` (and its own
        bytes at the door's rate) of its start. A reader that stalls is caught after that grace,
        however large the answer."""
        if self.door is None:
            await (self.stream.send_all_then_eof(data) if eof else self.stream.send_all(data))
            return
        limits = self.door.limits
        view = memoryview(data)
        for start in range(0, max(len(view), 1), SEND_PART):
            part = view[start : start + SEND_PART]
            last = start + SEND_PART >= len(view)
            with trio.move_on_after(limits.answer_grace + len(part) / limits.min_rate) as scope:
                await (self.stream.send_all_then_eof(part) if eof and last else self.stream.send_all(part))
            if scope.cancelled_caught:
                stalled = HivemindTooSlow(f"the caller stopped reading its answer after {start} bytes")
                self.too_slow(stalled, SLOW_READER)

    def release(self) -> None:
        """Give back all the call holds (idempotent)."""
        if self.reservation is not None:
            self.reservation.release()


async def serve_unary(stream: NetStream, handler: UnaryHandler, *, timeout: float, door: Door | None = None) -> None:
    """Answer one unary call on ``stream``. The caller's identity is the connection's peer, never
    the ``peer`` field of its message. With a ``door``, the request is bounded by its
    ``max_request``, its announced length is reserved before its body is read (a refused request
    is read past, not kept, and answered with the refusal), its bytes must keep the door's pace,
    and so must the caller reading the answer, which is reserved too when it is larger than the
    request (past the budget, the answer is the refusal). A handler's failure goes back as the
    call's error; a malformed or too slow request, or a call the door dropped, raises (the Host
    resets the stream)."""
    served = _Served(stream, door)
    with served.scope:
        await _serve_unary(stream, handler, timeout, served)
    served.dropped()


async def _serve_unary(stream: NetStream, handler: UnaryHandler, timeout: float, served: "_Served") -> None:
    try:
        try:
            with trio.fail_after(timeout):
                body, refusal = await _read_delimited(stream, served.max_request, served)
        except trio.TooSlowError:
            served.too_slow(HivemindTooSlow(f"request did not arrive within {timeout:g} s"))
        except HivemindTooSlow as exc:
            served.too_slow(exc)
        if refusal is not None:
            call_id = peek_call_id(body)
            if call_id is None:
                raise RemoteProtocolError("refused hivemind unary request carries no call id first")
            await served.send(encode_reply(UnaryReply(call_id, error=error_text(refusal))), eof=True)
            return
        call = parse_call(body)
        del body
        call_id, pending = call.call_id, handler(call.data, stream.remote_peer)
        del call  # the handler holds the request's bytes, and may drop them once parsed
        try:
            reply = UnaryReply(call_id, response=await pending)
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except Exception as exc:
            log.debug(
                "hivemind handler %s failed for %s: %s", stream.protocol, stream.remote_peer.short(), describe(exc)
            )
            reply = UnaryReply(call_id, error=error_text(exc))
        answer = encode_reply(reply)
        del reply
        try:
            await served.reserve_answer(len(answer))
        except HivemindBusy as exc:
            answer = encode_reply(UnaryReply(call_id, error=error_text(exc)))
        # the reply ends the call: it and the FIN leave in one write
        await served.send(answer, eof=True)
    finally:
        served.release()


async def call_unary(host: HostAPI, peer: PeerID, protocol: str, data: bytes, *, timeout: float) -> bytes:
    """Call ``protocol`` at ``peer`` with ``data``; its response bytes. A handler error raises
    HivemindRPCError; a broken or malformed answer raises what the network layer raises."""
    with trio.fail_after(timeout):
        stream = await host.new_stream(peer, [protocol])
        try:
            call = UnaryCall(new_call_id(), protocol, data, peer=peer.to_bytes())
            await stream.send_all(encode_call(call))
            # keep our side open until the answer: p2pd reads our EOF as a cancellation
            body, _ = await _read_delimited(stream, limits.MAX_UNARY_MESSAGE)
            reply = parse_reply(body)
        except BaseException:
            await reset_quietly(stream)
            raise
    await close_quietly(stream)
    if reply.error is not None:
        raise HivemindRPCError(reply.error, protocol)
    return reply.response or b""


async def _read_frames(
    stream: trio.abc.ReceiveStream, decoder: FrameDecoder, served: "_Served | None" = None
) -> AsyncGenerator[tuple[FrameKind, bytes], None]:
    reserved = 0
    pace = served.pace if served is not None else None
    while True:
        data = await receive_paced(stream, pace)
        if not data:
            if decoder.buffered:
                raise RemoteProtocolError("stream ended inside a hivemind frame")
            return
        frames = decoder.receive_data(data)
        if served is not None and decoder.announced > reserved:
            # reserve what the headers announced before the bodies they announce are read
            try:
                await served.reserve(decoder.announced - reserved)
            except HivemindBusy as exc:
                raise _Refused(exc) from exc
            reserved = decoder.announced
        for frame in frames:
            yield frame.kind, frame.payload


async def drain(stream: trio.abc.ReceiveStream, *, timeout: float) -> None:
    """Read and drop what the caller still sends, up to its EOF or ``timeout``: a refused call is
    answered at once, and the caller's writes finish instead of failing on a reset."""
    with trio.move_on_after(timeout):
        while await stream.receive_some(READ_CHUNK):
            pass


async def serve_stream(stream: NetStream, handler: StreamHandler, *, timeout: float, door: Door | None = None) -> None:
    """Answer one stream call: read message frames up to the end marker (bounded by
    ``FrameDecoder``; with a ``door``, each frame's announced length reserved before its body is
    read, a refusal answered at once as an error frame, and the frames due at the door's pace),
    run ``handler`` on them (it may empty the list as it parses it, so that the frames are not
    held twice), send its outputs as frames (reserved and read at the door's pace, as a unary
    answer) or its failure as one error frame, and close our side."""
    served = _Served(stream, door)
    with served.scope:
        await _serve_stream(stream, handler, timeout, served)
    served.dropped()


async def _serve_stream(stream: NetStream, handler: StreamHandler, timeout: float, served: "_Served") -> None:
    requests: list[bytes] = []
    try:
        try:
            with trio.fail_after(timeout):
                async with aclosing(_read_frames(stream, FrameDecoder(), served)) as frames:
                    async for kind, payload in frames:
                        if kind is FrameKind.ERROR:
                            break  # hivemind ends its input with an (empty) error frame
                        requests.append(payload)
        except _Refused as refused:
            requests.clear()
            served.release()  # what it read so far: draining the rest keeps nothing
            await served.send(encode_error(error_text(refused.reason)))
            await stream.send_eof()
            await drain(stream, timeout=timeout)
            return
        except trio.TooSlowError:
            served.too_slow(HivemindTooSlow(f"request did not arrive within {timeout:g} s"))
        except HivemindTooSlow as exc:
            served.too_slow(exc)
        try:
            async with aclosing(handler(requests, stream.remote_peer)) as outputs:  # type: ignore[type-var]
                async for output in outputs:
                    frame = encode_frame(output)
                    await served.reserve_answer(len(frame))
                    await served.send(frame)
        except (trio.Cancelled, KeyboardInterrupt, HivemindTooSlow):
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except Exception as exc:
            log.debug("hivemind stream handler %s failed: %s", stream.protocol, describe(exc))
            await served.send(encode_error(error_text(exc)))
        await stream.send_eof()
    finally:
        served.release()


async def call_stream(
    host: HostAPI, peer: PeerID, protocol: str, requests: Sequence[bytes], *, timeout: float
) -> list[bytes]:
    """Make a stream call: send ``requests`` and the end marker, collect every answer frame until
    the callee closes. An error frame raises HivemindRPCError."""
    outputs: list[bytes] = []
    with trio.fail_after(timeout):
        stream = await host.new_stream(peer, [protocol])
        try:
            for request in requests:
                await stream.send_all(encode_frame(request))
            await stream.send_all(encode_end())
            async with aclosing(_read_frames(stream, FrameDecoder())) as frames:
                async for kind, payload in frames:
                    if kind is FrameKind.ERROR:
                        raise HivemindRPCError(Frame(kind, payload).error_message or "error", protocol)
                    outputs.append(payload)
        except BaseException:
            await reset_quietly(stream)
            raise
    await close_quietly(stream)
    return outputs


__all__ = [
    "StreamHandler",
    "UnaryHandler",
    "call_stream",
    "call_unary",
    "drain",
    "error_text",
    "receive_paced",
    "serve_stream",
    "serve_unary",
]
