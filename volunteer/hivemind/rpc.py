"""The trio side of hivemind's RPC framings: serve and make unary and stream calls on our Host.

Thin: all parsing and every bound lives in ``framing``. One call per libp2p stream, as hivemind's
p2pd does it (it cannot share a stream between calls, so the stream pool is not used here).
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

import trio

from ..errors import RemoteProtocolError, describe
from ..net.connection import NetStream
from ..net.identity import PeerID
from ..net.service import HostAPI
from ..net.streams import close_quietly, reset_quietly
from . import limits
from .errors import HivemindRPCError
from .framing import (
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


class Reservation(Protocol):
    """Request bytes one served call holds (the expert service's admission): ``grow`` reserves
    more as lengths are announced and raises to refuse the call; ``release`` gives all back."""

    def grow(self, nbytes: int) -> None: ...

    def release(self) -> None: ...


# Opens the reservation of one call from the connection's peer.
Admission = Callable[[PeerID], Reservation]


class _Refused(Exception):
    """A reservation refused a stream call while its frames arrived (``reason``: its exception)."""

    def __init__(self, reason: Exception) -> None:
        super().__init__(str(reason))
        self.reason = reason


def error_text(exc: BaseException) -> str:
    """How a failed handler's exception reaches a hivemind caller (hivemind sends ``repr(e)``)."""
    return f"{type(exc).__name__}({str(exc)!r})"


async def _read_delimited(
    stream: trio.abc.ReceiveStream, max_size: int, reservation: Reservation | None = None
) -> tuple[bytes, Exception | None]:
    """One delimited message, and None; or, when ``reservation`` refused the announced length, the
    message's first bytes (read past, never held) and the refusal."""
    decoder = DelimitedDecoder(max_size)
    refusal: Exception | None = None
    reserved = reservation is None
    while True:
        data = await stream.receive_some(READ_CHUNK)
        if not data:
            raise RemoteProtocolError("stream ended inside a hivemind unary message")
        body = decoder.receive_data(data)
        if not reserved and decoder.announced is not None:
            reserved = True
            assert reservation is not None
            try:
                reservation.grow(decoder.announced)  # before the body is read
            except Exception as exc:
                if body is None:
                    decoder.skip()
                refusal = exc
        if body is not None:
            return body, refusal


async def serve_unary(
    stream: NetStream, handler: UnaryHandler, *, timeout: float, admission: Admission | None = None
) -> None:
    """Answer one unary call on ``stream``. The caller's identity is the connection's peer, never
    the ``peer`` field of its message. With ``admission``, the announced request length is reserved
    before its body is read; a refused request is read past (not kept) and answered with the
    refusal. A handler's failure goes back as the call's error; a malformed request raises (the
    Host resets the stream)."""
    reservation = admission(stream.remote_peer) if admission is not None else None
    try:
        with trio.fail_after(timeout):
            body, refusal = await _read_delimited(stream, limits.MAX_UNARY_MESSAGE, reservation)
        if refusal is not None:
            call_id = peek_call_id(body)
            if call_id is None:
                raise RemoteProtocolError("refused hivemind unary request carries no call id first")
            await stream.send_all_then_eof(encode_reply(UnaryReply(call_id, error=error_text(refusal))))
            return
        call = parse_call(body)
        try:
            reply = UnaryReply(call.call_id, response=await handler(call.data, stream.remote_peer))
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except Exception as exc:
            log.debug(
                "hivemind handler %s failed for %s: %s", stream.protocol, stream.remote_peer.short(), describe(exc)
            )
            reply = UnaryReply(call.call_id, error=error_text(exc))
    finally:
        if reservation is not None:
            reservation.release()
    # the reply ends the call: it and the FIN leave in one write
    await stream.send_all_then_eof(encode_reply(reply))


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
    stream: trio.abc.ReceiveStream, decoder: FrameDecoder, reservation: Reservation | None = None
) -> AsyncGenerator[tuple[FrameKind, bytes], None]:
    reserved = 0
    while True:
        data = await stream.receive_some(READ_CHUNK)
        if not data:
            if decoder.buffered:
                raise RemoteProtocolError("stream ended inside a hivemind frame")
            return
        frames = decoder.receive_data(data)
        if reservation is not None and decoder.announced > reserved:
            # reserve what the headers announced before the bodies they announce are read
            try:
                reservation.grow(decoder.announced - reserved)
            except Exception as exc:
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


async def serve_stream(
    stream: NetStream, handler: StreamHandler, *, timeout: float, admission: Admission | None = None
) -> None:
    """Answer one stream call: read message frames up to the end marker (bounded by
    ``FrameDecoder``; with ``admission``, each frame's announced length reserved before its body is
    read, and a refusal answered at once as an error frame), run ``handler`` on them, send its
    outputs as frames (or its failure as one error frame) and close our side."""
    reservation = admission(stream.remote_peer) if admission is not None else None
    requests: list[bytes] = []
    try:
        try:
            with trio.fail_after(timeout):
                async with aclosing(_read_frames(stream, FrameDecoder(), reservation)) as frames:
                    async for kind, payload in frames:
                        if kind is FrameKind.ERROR:
                            break  # hivemind ends its input with an (empty) error frame
                        requests.append(payload)
        except _Refused as refused:
            requests.clear()
            await stream.send_all(encode_error(error_text(refused.reason)))
            await stream.send_eof()
            await drain(stream, timeout=timeout)
            return
        try:
            async with aclosing(handler(requests, stream.remote_peer)) as outputs:  # type: ignore[type-var]
                async for output in outputs:
                    await stream.send_all(encode_frame(output))
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except Exception as exc:
            log.debug("hivemind stream handler %s failed: %s", stream.protocol, describe(exc))
            await stream.send_all(encode_error(error_text(exc)))
    finally:
        if reservation is not None:
            reservation.release()
    await stream.send_eof()


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


__all__ = ["Admission", "Reservation", "StreamHandler", "drain", "UnaryHandler", "call_stream", "call_unary", "error_text", "serve_stream", "serve_unary"]
