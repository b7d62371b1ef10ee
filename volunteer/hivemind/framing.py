"""hivemind's two RPC framings, sans-I/O: encoders are pure functions, decoders take bytes and
return whole messages, and every length is checked against volunteer.hivemind.limits.

Unary calls (what hivemind's p2pd puts on a libp2p stream named after the handler,
``DHTProtocol.rpc_find`` say): the caller writes one uvarint-delimited
``PersistentConnectionRequest{callId, callUnary{peer, proto, data}}`` and the callee answers with one
``PersistentConnectionRequest{callId, unaryResponse{response | error}}``. The caller must keep its
write side open until the answer arrives: p2pd takes an EOF from the caller as a cancellation.

Stream calls (``ConnectionHandler.rpc_forward_stream`` and the like): each message is a 1-byte
marker (0: a protobuf message, 1: an ``RPCError``) and an 8-byte big-endian length, then the bytes.
An error frame with an empty body ends the caller's input; the callee answers with message frames
(or one error frame) and closes its side.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass

from ..errors import RemoteProtocolError
from ..net.pb.decode import parse
from ..net.varint import decode_uvarint, encode_uvarint
from . import limits
from .errors import HivemindFrameError
from .pb.hm_p2pd_pb2 import CallUnaryRequest, CallUnaryResponse, PersistentConnectionRequest, RPCError

MESSAGE_MARKER = 0
ERROR_MARKER = 1
STREAM_HEADER = 1 + 8


def new_call_id() -> bytes:
    """A fresh call id: p2pd parses it as a UUID and drops calls whose id is not 16 bytes."""
    return uuid.uuid4().bytes


# --- unary calls -----------------------------------------------------------------------------


@dataclass(frozen=True)
class UnaryCall:
    """A unary request as it arrived. ``peer`` is what the caller wrote (the callee's id, in
    p2pd's case): never trust it as the caller's identity, take that from the connection."""

    call_id: bytes
    protocol: str
    data: bytes
    peer: bytes = b""


@dataclass(frozen=True)
class UnaryReply:
    """A unary answer: ``response`` bytes, or ``error`` text when the handler failed."""

    call_id: bytes
    response: bytes | None = None
    error: str | None = None


def _delimited(message: PersistentConnectionRequest) -> bytes:
    body = message.SerializeToString()
    if len(body) > limits.MAX_UNARY_MESSAGE:
        raise ValueError(f"unary message of {len(body)} bytes exceeds {limits.MAX_UNARY_MESSAGE}")
    return encode_uvarint(len(body)) + body


def encode_call(call: UnaryCall) -> bytes:
    """The bytes a caller writes for ``call`` (raises ValueError above the 4 MiB unary bound)."""
    _check_call_id(call.call_id, ValueError)
    request = PersistentConnectionRequest(
        callId=call.call_id, callUnary=CallUnaryRequest(peer=call.peer, proto=call.protocol, data=call.data)
    )
    return _delimited(request)


def encode_reply(reply: UnaryReply) -> bytes:
    """The bytes a callee writes for ``reply``; an answer over the bound becomes an error reply,
    as hivemind's own client does, so the caller hears why instead of waiting."""
    if reply.error is not None:
        result = CallUnaryResponse(error=reply.error[: limits.MAX_ERROR_MESSAGE].encode())
    else:
        result = CallUnaryResponse(response=reply.response or b"")
    message = PersistentConnectionRequest(callId=reply.call_id, unaryResponse=result)
    if message.ByteSize() > limits.MAX_UNARY_MESSAGE:
        message = PersistentConnectionRequest(
            callId=reply.call_id, unaryResponse=CallUnaryResponse(error=b"response size exceeds message size limit")
        )
    return _delimited(message)


def _check_call_id(call_id: bytes, error: type[Exception]) -> None:
    if len(call_id) != limits.CALL_ID_BYTES:
        raise error(f"call id of {len(call_id)} bytes (expected {limits.CALL_ID_BYTES})")


class DelimitedDecoder:
    """Collects one uvarint-delimited message of at most ``max_size`` bytes.

    ``receive_data`` returns the message body once it is complete (and None until then); bytes
    after it are kept in ``trailing``. A length over the bound raises before anything is buffered.
    """

    def __init__(self, max_size: int = limits.MAX_UNARY_MESSAGE) -> None:
        self.max_size = max_size
        self._buffer = bytearray()
        self._length: int | None = None
        self._skipping = False
        self._skipped = 0
        self.trailing = b""

    @property
    def started(self) -> bool:
        """Whether any byte of a message has arrived (an EOF now would cut it)."""
        return self._length is not None or bool(self._buffer)

    @property
    def announced(self) -> int | None:
        """The body length the prefix announced (None until the prefix is complete): what a
        server reserves before it reads the body."""
        return self._length

    def skip(self) -> None:
        """Stop keeping the body: only its first ``SKIP_KEEP`` bytes are kept (enough for the
        call id, so a refusal can still be answered) and ``receive_data`` returns that prefix once
        the whole announced body went by. Call it after ``announced`` is known."""
        if self._length is None:
            raise RuntimeError("skip() before the length prefix is complete")
        self._skipping = True
        self._skipped = len(self._buffer)  # body bytes that arrived with the prefix
        del self._buffer[SKIP_KEEP:]

    def receive_data(self, data: bytes | bytearray) -> bytes | None:
        """Add bytes; the whole message once it is complete (its prefix, after ``skip``)."""
        if self._skipping:
            return self._receive_skipping(data)
        self._buffer += data
        if self._length is None:
            try:
                header = decode_uvarint(self._buffer)
            except RemoteProtocolError as exc:
                raise HivemindFrameError(f"bad unary length prefix: {exc}") from None
            if header is None:
                return None
            self._length, offset = header
            if self._length > self.max_size:
                raise HivemindFrameError(f"unary message of {self._length} bytes exceeds {self.max_size}")
            del self._buffer[:offset]
        if len(self._buffer) < self._length:
            return None
        # one copy of the body (a slice of a bytearray would copy it twice)
        with memoryview(self._buffer) as view:
            body = bytes(view[: self._length])
            self.trailing = bytes(view[self._length :])
        self._buffer.clear()
        return body

    def _receive_skipping(self, data: bytes | bytearray) -> bytes | None:
        assert self._length is not None
        room = max(0, SKIP_KEEP - len(self._buffer))
        self._buffer += data[:room]
        self._skipped += len(data)
        if self._skipped < self._length:
            return None
        self.trailing = bytes(data[len(data) - (self._skipped - self._length) :]) if self._skipped > self._length else b""
        prefix = bytes(self._buffer[: self._length])
        self._buffer.clear()
        return prefix


# Bytes of a skipped unary body kept: protobuf writes field 1 (the 16-byte call id) first.
SKIP_KEEP = 64


def peek_call_id(prefix: bytes) -> bytes | None:
    """The call id at the start of a unary request's body (field 1, 16 bytes), or None when the
    prefix does not start with one: how a request refused unread is still answered by id."""
    if len(prefix) >= 2 + limits.CALL_ID_BYTES and prefix[0] == 0x0A and prefix[1] == limits.CALL_ID_BYTES:
        return bytes(prefix[2 : 2 + limits.CALL_ID_BYTES])
    return None


def parse_call(body: bytes) -> UnaryCall:
    """A unary request from its body; anything but a well-formed ``callUnary`` raises."""
    message = parse(PersistentConnectionRequest, body, "hivemind unary request")
    if message.WhichOneof("message") != "callUnary":
        raise HivemindFrameError("hivemind unary request carries no callUnary")
    _check_call_id(message.callId, HivemindFrameError)
    call = message.callUnary
    if len(call.proto) > limits.MAX_PROTOCOL_NAME:
        raise HivemindFrameError("hivemind unary request names an over-long protocol")
    return UnaryCall(call_id=bytes(message.callId), protocol=call.proto, data=bytes(call.data), peer=bytes(call.peer))


def parse_reply(body: bytes) -> UnaryReply:
    """A unary answer from its body; a cancellation or a missing result raises."""
    message = parse(PersistentConnectionRequest, body, "hivemind unary reply")
    if message.WhichOneof("message") != "unaryResponse":
        raise HivemindFrameError("hivemind unary reply carries no unaryResponse")
    result = message.unaryResponse
    kind = result.WhichOneof("result")
    if kind == "error":
        text = bytes(result.error)[: limits.MAX_ERROR_MESSAGE].decode(errors="replace")
        return UnaryReply(call_id=bytes(message.callId), error=text)
    # an empty response is a valid empty protobuf: proto3 omits an empty bytes field
    return UnaryReply(call_id=bytes(message.callId), response=bytes(result.response))


# --- how fast a request must arrive ---------------------------------------------------------


class BodyPace:
    """When the next bytes of a request are due, so that a peer that trickles a request to hold
    our memory (or its reservation) loses the stream; Apache's ``mod_reqtimeout`` (``MinRate``)
    is the model. The first bytes have ``grace`` seconds; after that, the bytes received so far
    must average at least ``min_rate`` a second since the start. Bytes that arrive early bank
    time: a request that came fast may pause for as long as its bytes bought.

    Pure: ``now`` is passed in; the driver waits for data until ``deadline`` and drops the
    stream if none came."""

    def __init__(self, min_rate: float, grace: float, now: float) -> None:
        if min_rate <= 0 or grace < 0:
            raise ValueError("BodyPace needs min_rate > 0 and grace >= 0")
        self.min_rate = min_rate
        self.grace = grace
        self.start = now
        self.received = 0

    def on_data(self, nbytes: int) -> None:
        """``nbytes`` more bytes arrived."""
        self.received += nbytes

    @property
    def deadline(self) -> float:
        """The time by which more bytes must arrive (``now`` past it: the request is too slow)."""
        return self.start + self.grace + self.received / self.min_rate

    def too_slow(self, now: float) -> bool:
        """Whether the request is behind its pace at ``now``."""
        return now >= self.deadline


# --- stream calls ----------------------------------------------------------------------------


class FrameKind(enum.Enum):
    """What a stream frame carries."""

    MESSAGE = MESSAGE_MARKER
    ERROR = ERROR_MARKER


@dataclass(frozen=True)
class Frame:
    """One frame of a stream call. An ERROR frame with an empty ``message`` ends the input."""

    kind: FrameKind
    payload: bytes

    @property
    def is_end(self) -> bool:
        """True for the empty error frame that ends a caller's input."""
        return self.kind is FrameKind.ERROR and not self.error_message

    @property
    def error_message(self) -> str:
        """The text of an ERROR frame (empty for the end marker)."""
        if self.kind is not FrameKind.ERROR:
            return ""
        error = parse(RPCError, self.payload, "hivemind RPCError")
        return error.message[: limits.MAX_ERROR_MESSAGE]


def encode_frame(payload: bytes, kind: FrameKind = FrameKind.MESSAGE, max_frame: int = limits.MAX_STREAM_FRAME) -> bytes:
    """One frame: marker, 8-byte big-endian length, payload."""
    if len(payload) > max_frame:
        raise ValueError(f"stream frame of {len(payload)} bytes exceeds {max_frame}")
    return bytes((kind.value,)) + len(payload).to_bytes(8, "big") + payload


def encode_error(message: str) -> bytes:
    """An error frame carrying ``message`` (what a failed handler sends before closing)."""
    text = message[: limits.MAX_ERROR_MESSAGE] or "error"
    return encode_frame(RPCError(message=text).SerializeToString(), FrameKind.ERROR)


def encode_end() -> bytes:
    """The empty error frame that ends a caller's input."""
    return encode_frame(b"", FrameKind.ERROR)


class FrameDecoder:
    """Splits a stream call's bytes into frames, bounded per frame, in count and in total bytes."""

    def __init__(
        self,
        max_frame: int = limits.MAX_STREAM_FRAME,
        max_frames: int = limits.MAX_STREAM_FRAMES,
        max_total: int = limits.MAX_STREAM_TOTAL,
    ) -> None:
        self.max_frame = max_frame
        self.max_frames = max_frames
        self.max_total = max_total
        self._buffer = bytearray()
        self._frames = 0
        self._total = 0
        self._pending = 0  # announced length of the frame whose header arrived, body not yet whole

    @property
    def announced(self) -> int:
        """Payload bytes announced so far by frame headers, the frame still arriving included: what
        a server reserves as a call's frames arrive, before their bodies are read."""
        return self._total + self._pending

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet make a whole frame (0 at a clean frame boundary)."""
        return len(self._buffer)

    def receive_data(self, data: bytes | bytearray) -> list[Frame]:
        """Add bytes; every frame they complete, in order."""
        self._buffer += data
        frames: list[Frame] = []
        while len(self._buffer) >= STREAM_HEADER:
            marker = self._buffer[0]
            if marker not in (MESSAGE_MARKER, ERROR_MARKER):
                raise HivemindFrameError(f"unknown stream frame marker {marker}")
            length = int.from_bytes(self._buffer[1:STREAM_HEADER], "big")
            if length > self.max_frame:
                raise HivemindFrameError(f"stream frame of {length} bytes exceeds {self.max_frame}")
            if len(self._buffer) < STREAM_HEADER + length:
                self._pending = length
                break
            self._pending = 0
            self._frames += 1
            self._total += length
            if self._frames > self.max_frames or self._total > self.max_total:
                raise HivemindFrameError("stream call exceeds its frame budget")
            with memoryview(self._buffer) as view:  # one copy of the payload
                payload = bytes(view[STREAM_HEADER : STREAM_HEADER + length])
            del self._buffer[: STREAM_HEADER + length]
            frames.append(Frame(FrameKind(marker), payload))
        return frames


__all__ = [
    "BodyPace",
    "DelimitedDecoder",
    "Frame",
    "FrameDecoder",
    "FrameKind",
    "UnaryCall",
    "UnaryReply",
    "encode_call",
    "encode_end",
    "encode_error",
    "encode_frame",
    "encode_reply",
    "new_call_id",
    "parse_call",
    "parse_reply",
    "peek_call_id",
]
