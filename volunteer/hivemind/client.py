"""Calling experts that hivemind servers host (``hivemind.moe.Server``, or our HivemindExperts),
with our timeouts and our error types, which hivemind's own client lacks.

    expert = HivemindExpert(host, "ffn.3", peer_id)
    (y,) = await expert.forward([x])                       # numpy arrays in and out
    (grad_x,) = await expert.backward([x], [grad_y])

Failures come out as the experts layer's errors: a remote failure as ``RemoteExpertError`` (or,
for the refusals our own servers send, their ``ExpertUnavailableError`` subclass by name), no
answer within the timeout as ``ExpertTimeoutError``, a peer we cannot reach or that drops the
call as ``ExpertUnavailableError``. ``find_experts`` reads hivemind's ``uid → peer id`` records.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import trio

from ..errors import (
    ExpertBackwardRefusedError,
    ExpertBusyError,
    ExpertPausedError,
    ExpertPeerUnreachableError,
    ExpertTimeoutError,
    ExpertUnavailableError,
    PeerIDError,
    RemoteExpertError,
    UnknownExpertError,
    VolunteerError,
    describe,
)
from ..experts.config import DEFAULT_BACKWARD_TIMEOUT, DEFAULT_FORWARD_TIMEOUT
from ..net.identity import PeerID
from ..net.service import HostAPI
from . import expert_wire as wire
from .dht import HivemindDHT
from .errors import HivemindRPCError
from .kad import ensure_routable
from .limits import DEFAULT_EXPERT_LIMITS, MAX_UNARY_PAYLOAD, ExpertLimits
from .pb.hm_runtime_pb2 import ExpertInfo
from .rpc import call_stream, call_unary
from .serializer import loads

# hivemind sends repr(exception): "KeyError('ffn.9')"
_REPR = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)\((.*)\)$", re.DOTALL)
# refusals our own servers send, raised as the same types here
_REFUSALS: dict[str, type[ExpertUnavailableError]] = {
    cls.__name__: cls for cls in (ExpertBusyError, ExpertPausedError, UnknownExpertError, ExpertBackwardRefusedError)
}


def remote_error(exc: HivemindRPCError, uid: str, peer: PeerID) -> Exception:
    """A hivemind RPC error as the experts layer's error type."""
    match = _REPR.match(exc.message)
    error_type, message = (match.group(1), match.group(2).strip("'\"")) if match else ("RemoteError", exc.message)
    refusal = _REFUSALS.get(error_type)
    if refusal is not None:
        return refusal(f"{message} (expert {uid!r} on {peer})")
    return RemoteExpertError(error_type, message, expert_uid=uid, peer_id=str(peer))


class HivemindExpert:
    """One expert on a hivemind server, called over hivemind's ``ConnectionHandler.rpc_*``."""

    def __init__(
        self,
        host: HostAPI,
        uid: str,
        peer: PeerID,
        *,
        forward_timeout: float = DEFAULT_FORWARD_TIMEOUT,
        backward_timeout: float = DEFAULT_BACKWARD_TIMEOUT,
        limits: ExpertLimits = DEFAULT_EXPERT_LIMITS,
    ) -> None:
        self.host = host
        self.uid = uid
        self.peer = peer
        self.forward_timeout = forward_timeout
        self.backward_timeout = backward_timeout
        self.limits = limits
        self._info: dict | None = None

    async def info(self) -> dict:
        """The server's info record (``forward_schema``, ``outputs_schema``, ``keyword_names``)."""
        if self._info is None:
            data = await self._unary(wire.INFO, wire.info_request(self.uid), self.forward_timeout)
            info = loads(ExpertInfo.FromString(data).serialized_info)
            if not isinstance(info, dict):
                raise ExpertUnavailableError(f"expert {self.uid!r} on {self.peer}: malformed info record")
            self._info = info
        return self._info

    async def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The expert's outputs for ``inputs``."""
        return await self._call(wire.FORWARD, wire.FORWARD_STREAM, list(inputs), self.forward_timeout)

    async def backward(self, inputs: Sequence[np.ndarray], grad_outputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Gradients of ``inputs`` (the server steps its optimizer)."""
        return await self._call(wire.BACKWARD, wire.BACKWARD_STREAM, [*inputs, *grad_outputs], self.backward_timeout)

    async def _route(self) -> None:
        # hivemind records name a peer id only: its addresses come from kad peer routing
        try:
            await ensure_routable(self.host, self.peer)
        except (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ExpertPeerUnreachableError(f"cannot find {self.peer} for expert {self.uid!r}: {describe(exc)}") from None

    async def _call(self, unary: str, streamed: str, arrays: list[np.ndarray], timeout: float) -> list[np.ndarray]:
        # hivemind's client switches to the stream RPC above this payload, and so do we
        if sum(array.nbytes for array in arrays) <= MAX_UNARY_PAYLOAD:
            return wire.parse_response(await self._unary(unary, wire.request(self.uid, arrays), timeout), self.limits)
        requests = wire.stream_request(self.uid, arrays, limits=self.limits)
        try:
            with trio.fail_after(timeout):
                await self._route()
                frames = await call_stream(self.host, self.peer, streamed, requests, timeout=timeout)
        except BaseException as exc:
            raise self._translate(exc, timeout) from None
        return wire.parse_stream_response(frames, self.limits)

    async def _unary(self, protocol: str, data: bytes, timeout: float) -> bytes:
        try:
            with trio.fail_after(timeout):
                await self._route()
            return await call_unary(self.host, self.peer, protocol, data, timeout=timeout)
        except BaseException as exc:
            raise self._translate(exc, timeout) from None

    def _translate(self, exc: BaseException, timeout: float) -> BaseException:
        if isinstance(exc, HivemindRPCError):
            return remote_error(exc, self.uid, self.peer)
        if isinstance(exc, ExpertPeerUnreachableError):
            return exc
        if isinstance(exc, trio.TooSlowError):
            return ExpertTimeoutError(f"expert {self.uid!r} on {self.peer} did not answer within {timeout:g} s")
        if isinstance(exc, (VolunteerError, OSError, trio.BrokenResourceError, trio.ClosedResourceError)):
            return ExpertUnavailableError(f"expert {self.uid!r} on {self.peer}: {describe(exc)}")
        return exc


async def find_experts(dht: HivemindDHT, uids: Sequence[str]) -> dict[str, PeerID | None]:
    """Who serves each of ``uids`` according to hivemind's ``uid → peer id`` records (None: nobody
    declared it, or the record has expired)."""
    found: dict[str, PeerID | None] = {}

    async def one(uid: str) -> None:
        record = await dht.get(uid)
        peer = None
        if record is not None and isinstance(record.value, str):
            try:
                peer = PeerID.from_string(record.value)
            except (PeerIDError, ValueError):
                peer = None
        found[uid] = peer

    async with trio.open_nursery() as nursery:
        for uid in uids:
            nursery.start_soon(one, uid)
    return {uid: found.get(uid) for uid in uids}


__all__ = ["HivemindExpert", "find_experts", "remote_error"]
