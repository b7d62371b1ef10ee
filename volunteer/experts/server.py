"""The expert server: answers ``/volunteer/<swarm>/experts/1.0.0`` calls with a Runtime.

Any exception while serving one call (a malformed header, a truncated or oversized payload, wrong
shapes or dtypes, an unknown uid or compression, NaN, CUDA OOM, a bug in a custom expert) becomes
an error reply to that caller, with the exception's type, message and traceback, the expert uid
and our PeerID; the server goes on serving everyone else.
"""

from __future__ import annotations

import logging

import trio

from ..errors import ExpertProtocolError, TensorFormatError, VolunteerError, describe
from ..net.streams import BufferedStream
from .config import DEFAULT_CONFIG, ExpertsConfig
from .failures import to_failure
from ..net.pool import SERVE_IDLE
from .protocol import MAX_HEADER, check_request, pack, protocol_id, unpack
from .tensors import TensorReader, serialize

log = logging.getLogger(__name__)

READ_TIMEOUT = 60.0  # a caller has this long to deliver its request (slowloris bound)
DRAIN_LIMIT = 8 * 1024 * 1024  # after an early error, bytes still read so the caller sees the reply
RECEIVE_CHUNK = 1024 * 1024


async def _wait_readable(reader: BufferedStream) -> bool:
    """Wait for the next request's first bytes; False at end of stream."""
    if reader._buffer:
        return True
    chunk = await reader.stream.receive_some(RECEIVE_CHUNK)
    if not chunk:
        return False
    reader._buffer += chunk
    return True


class UploadLimiter:
    """Token bucket on reply bytes (``volunteer join --max-upload``), shared by every call."""

    def __init__(self, rate: float) -> None:
        self.rate = float(rate)
        self.tokens = self.rate
        self.last = trio.current_time()

    async def take(self, nbytes: int) -> None:
        while True:
            now = trio.current_time()
            self.tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= min(nbytes, self.rate):
                self.tokens -= nbytes
                return
            await trio.sleep((min(nbytes, self.rate) - self.tokens) / self.rate)


class ExpertServer:
    """Serves a Runtime's experts on a Host. ``install()`` registers the protocol handler."""

    def __init__(self, host, runtime, swarm_id: str, config: ExpertsConfig = DEFAULT_CONFIG) -> None:
        self.host = host
        self.runtime = runtime
        self.config = config
        self.protocol = protocol_id(swarm_id)
        self.active_requests = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.errors = 0
        self.upload: UploadLimiter | None = None

    @property
    def upload_limit(self) -> float | None:
        return self.upload.rate if self.upload else None

    @upload_limit.setter
    def upload_limit(self, rate: float | None) -> None:
        self.upload = UploadLimiter(rate) if rate else None

    def install(self) -> None:
        self.host.set_handler(self.protocol, self.handle)

    def uninstall(self) -> None:
        self.host.remove_handler(self.protocol)

    async def handle(self, stream) -> None:
        """Calls on one stream, one after another: a caller reuses an idle stream for its next
        call. An error reply ends the stream (the caller may still be sending a bad payload)."""
        reader = BufferedStream(stream)
        while await self._one_call(reader, stream):
            with trio.move_on_after(SERVE_IDLE) as idle:
                more = await _wait_readable(reader)
            if idle.cancelled_caught or not more:
                return

    async def _one_call(self, reader: BufferedStream, stream) -> bool:
        """Serve one call; True if the stream may carry another."""
        uid = ""
        pending = 0  # request payload bytes not read yet (drained after an early error)
        self.active_requests += 1
        try:
            try:
                with trio.fail_after(READ_TIMEOUT):
                    message = unpack(await reader.receive_length_prefixed(MAX_HEADER, "expert request header"))
                    uid = str(message.get("uid", ""))[:256]
                    if isinstance(message.get("t"), dict) and isinstance(message["t"].get("n"), int):
                        pending = max(0, message["t"]["n"])
                    op, uid, compression, header, n_inputs = check_request(message)
                    if op == "info":
                        await reader.send_all(pack({"ok": True, "info": self.runtime.info(uid)}))
                        return True
                    tensors = TensorReader(header, config=self.config)
                    while not tensors.done:
                        chunk = await reader.receive_some(min(tensors.remaining, RECEIVE_CHUNK))
                        if not chunk:
                            raise TensorFormatError(
                                f"request payload truncated: {tensors.received} of {tensors.expected} bytes arrived"
                            )
                        tensors.feed(chunk)
                        pending = tensors.remaining
                    self.bytes_in += tensors.expected
                    inputs = tensors.finish()
                if op == "forward":
                    outputs = await self.runtime.forward(uid, inputs)
                else:
                    outputs = await self.runtime.backward(uid, inputs[:n_inputs], inputs[n_inputs:])
                reply, chunks = serialize(outputs, compression, config=self.config)
            except trio.TooSlowError:
                raise ExpertProtocolError(f"request not received within {READ_TIMEOUT:.0f} s") from None
            await reader.send_all(pack({"ok": True, "t": reply}))
            for chunk in chunks:
                if self.upload is not None:
                    await self.upload.take(len(chunk))
                await reader.send_all(chunk)
                self.bytes_out += len(chunk)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise  # the caller went away: nobody to tell
        except Exception as exc:  # noqa: BLE001 - every failure of one call goes back to its caller
            self.errors += 1
            failure = to_failure(exc, expert_uid=uid, peer_id=str(self.host.peer_id), config=self.config)
            if failure["kind"] == "error":
                log.warning("expert %s failed for %s: %s", uid or "?", stream.remote_peer.short(), describe(exc))
            await reader.send_all(pack({"ok": False, "e": failure}))
            await reader.send_eof()
            await self._drain(reader, pending)
            return False
        finally:
            self.active_requests -= 1

    async def _drain(self, reader: BufferedStream, pending: int) -> None:
        # the caller may still be sending its payload: read (and drop) a bounded amount so it
        # reads our error reply instead of a reset
        left = min(pending, DRAIN_LIMIT)
        with trio.move_on_after(5):
            try:
                while left > 0:
                    chunk = await reader.receive_some(min(left, RECEIVE_CHUNK))
                    if not chunk:
                        return
                    left -= len(chunk)
            except (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError):
                return


__all__ = ["ExpertServer", "UploadLimiter"]
