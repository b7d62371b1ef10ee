"""Our experts served to unmodified hivemind clients, as a Host service of its own.

    service = HivemindExperts(runtime, dht=host.service(HivemindDHT))
    await host.add_service(service)     # serves ConnectionHandler.rpc_*, declares every 30 s

The calls go to our ``Runtime`` (its batching, queue bounds and schema checks), behind the
hivemind door (``door.Door``, scope ``hivemind-experts``): request bytes reserved from the Host's
resource manager, per peer, per address and in all (``ExpertsConfig.hivemind_request_bytes_*``),
as the call's lengths are announced and before its bytes are read, a minimum rate for their
arrival (``ExpertLimits.min_body_rate``), and a backward served only to a peer that ran forward
on that expert within ``backward_window``, as our own server admits calls. Any failure goes back
to the hivemind caller as its RPC error (hivemind's client raises it as ``P2PHandlerError``) and
the service keeps serving everyone else.

Declarations follow hivemind's ``DHTHandlerThread``: uid → peer id, and prefix records, written
every ``declare_period`` (30 s) and expiring ``declare_expiration`` (60 s) after each write.
Wire formats are in ``expert_wire`` (pure); this module moves bytes and reads clocks.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TypedDict, final

import numpy as np
import torch
import trio

from ..errors import ExpertBackwardRefusedError, VolunteerError, describe
from ..experts.admission import BACKWARD_WITHOUT_FORWARD, ForwardRecord
from ..experts.config import DEFAULT_CONFIG, ExpertsConfig
from ..experts.inflight import InFlight
from ..net.connection import NetStream
from ..net.identity import PeerID
from ..net.service import BaseService, Handler, HostAPI
from . import expert_wire as wire
from .dht import HivemindDHT
from .door import Door, door_for
from .errors import HivemindError
from .limits import DEFAULT_EXPERT_LIMITS, ExpertLimits
from .pb.hm_runtime_pb2 import NONE
from .rpc import serve_stream, serve_unary

log = logging.getLogger(__name__)


def _to_torch(arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
    return [torch.from_numpy(np.ascontiguousarray(array)) for array in arrays]


def _to_numpy(outputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    return [tensor.detach().cpu().numpy() for tensor in outputs]



@final  # no other keys: a view tells it from ours by its keys
class HivemindServingStatus(TypedDict):
    """``HivemindExperts.snapshot()``: calls served and being served, errors, refusals by
    reason, what was declared last (DHT time, None: never)."""

    active_requests: int
    calls: int
    errors: int
    refusals: dict[str, int]
    declared: int
    last_declared: float | None


class HivemindExperts(BaseService):
    """Serves a Runtime's experts on hivemind's ``ConnectionHandler.rpc_*`` protocols and declares
    them in a hivemind DHT (``dht``; None: serve without declaring). ``compression`` is the
    hivemind compression our answers and schemas ask for (NONE: exact). ``clock`` is DHT time."""

    def __init__(
        self,
        runtime,
        *,
        dht: HivemindDHT | None = None,
        config: ExpertsConfig = DEFAULT_CONFIG,
        limits: ExpertLimits = DEFAULT_EXPERT_LIMITS,
        compression: int = NONE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.runtime = runtime
        self.dht = dht
        self.config = config
        self.limits = limits
        self.compression = compression
        self.clock = clock
        self._door: Door | None = None  # the Host's resource manager is known once we run
        self.forwards = ForwardRecord(config)
        self.refusals: Counter[str] = Counter()
        self.calls = 0
        self.errors = 0
        self.in_flight = InFlight()  # forward/backward calls being served now
        self.last_declared: float | None = None  # DHT time of the last round that reached anyone
        self.declared: list[str] = []  # uids declared in the last round
        self.skipped = [uid for uid in runtime.uids if not wire.is_hivemind_uid(uid)]
        if self.skipped:
            log.warning(
                "experts %s are not hivemind uids (a name, then '.'-separated numbers): served, never declared",
                ", ".join(self.skipped),
            )

    def handlers(self) -> Mapping[str, Handler]:
        return {
            wire.INFO: self._serve_info,
            wire.FORWARD: self._serve_forward,
            wire.BACKWARD: self._serve_backward,
            wire.FORWARD_STREAM: self._serve_forward_stream,
            wire.BACKWARD_STREAM: self._serve_backward_stream,
        }

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        config = self.config
        door = self.limits.door(
            config.hivemind_request_bytes_per_peer, config.hivemind_request_bytes_per_address,
            config.hivemind_request_bytes_total,
        )
        self._door = door_for(host, "hivemind-experts", door)
        task_status.started()
        if self.dht is None:
            return
        while True:
            try:
                await self.declare()
            except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                log.info("declaring experts in the hivemind DHT failed: %s", describe(exc))
            await trio.sleep(self.limits.declare_period)

    @property
    def active_requests(self) -> int:
        """Calls being served now (the runtime's queue counts the rest)."""
        return self.in_flight.count

    async def wait_idle(self) -> None:
        """Return once no call is being served (at once when none is)."""
        await self.in_flight.wait_idle()

    def snapshot(self) -> HivemindServingStatus:
        """Calls served and being served, errors, refusals by reason, what was declared last."""
        return {
            "active_requests": self.in_flight.count,
            "calls": self.calls,
            "errors": self.errors,
            "refusals": dict(self.refusals),
            "declared": len(self.declared),
            "last_declared": self.last_declared,
        }

    # --- declaring -----------------------------------------------------------------------------

    async def declare(self) -> int:
        """Write our experts' records (uid → peer id, prefixes) once; how many records were kept."""
        if self.dht is None:
            return 0
        # a paused runtime refuses calls: stop declaring and let the records expire (hivemind has
        # no tombstones), as our declarer withdraws
        uids = [] if self.runtime.paused else [uid for uid in self.runtime.uids if wire.is_hivemind_uid(uid)]
        expiration = self.clock() + self.limits.declare_expiration
        kept = 0

        async def store(record: wire.Declaration) -> None:
            nonlocal kept
            assert self.dht is not None
            if record.subkey is None:
                ok = await self.dht.store(record.key, record.value, expiration)
            else:
                ok = await self.dht.store(record.key, record.value, expiration, subkey=record.subkey)
            kept += ok

        async with trio.open_nursery() as nursery:
            for record in wire.declarations(uids, self.host.peer_id.to_base58()):
                nursery.start_soon(store, record)
        self.declared = uids
        if kept:
            self.last_declared = self.clock()
        return kept

    # --- serving -------------------------------------------------------------------------------

    def _schema(self, uid: str) -> wire.Schema:
        return wire.Schema.from_info(self.runtime.info(uid), self.compression)

    @property
    def door(self) -> Door:
        """What hivemind callers may make us hold (their request bytes, reserved as announced)."""
        if self._door is None:
            raise HivemindError("the hivemind expert service is not running yet")
        return self._door

    async def _serve_info(self, stream: NetStream) -> None:
        async def answer(data: bytes, sender: PeerID) -> bytes:
            return wire.info_response(self._schema(wire.parse_info_request(data)))

        await serve_unary(stream, answer, timeout=self.limits.read_timeout, door=self.door)

    def _unary(self, op: str):
        async def answer(data: bytes, sender: PeerID) -> bytes:
            uid, arrays = wire.parse_request(data, self.limits)
            del data  # the arrays are what the call holds while it waits for the runtime
            outputs, compressions = await self._call(op, uid, arrays, sender)
            return wire.response(outputs, compressions)

        return answer

    async def _serve_forward(self, stream: NetStream) -> None:
        await serve_unary(stream, self._unary("forward"), timeout=self.limits.read_timeout, door=self.door)

    async def _serve_backward(self, stream: NetStream) -> None:
        await serve_unary(stream, self._unary("backward"), timeout=self.limits.read_timeout, door=self.door)

    async def _serve_forward_stream(self, stream: NetStream) -> None:
        await serve_stream(stream, self._streamed("forward"), timeout=self.limits.read_timeout, door=self.door)

    async def _serve_backward_stream(self, stream: NetStream) -> None:
        await serve_stream(stream, self._streamed("backward"), timeout=self.limits.read_timeout, door=self.door)

    def _streamed(self, op: str):
        async def answer(frames: list[bytes], sender: PeerID) -> AsyncIterator[bytes]:
            uid, arrays = wire.parse_stream_request(frames, self.limits)  # empties ``frames``
            outputs, compressions = await self._call(op, uid, arrays, sender)
            for frame in wire.stream_response(outputs, compressions, self.limits):
                yield frame

        return answer

    async def _call(
        self, op: str, uid: str, arrays: list[np.ndarray], peer: PeerID
    ) -> tuple[list[np.ndarray], list[int]]:
        """Run one forward or backward through the runtime, admitted as our server admits calls;
        the answer's arrays and their compressions. Raises (the caller's RPC error) on refusal."""
        self.calls += 1
        self.in_flight.started()
        try:
            self._admit(op, uid, peer)
            schema = self._schema(uid)
            tensors = _to_torch(arrays)
            if op == "forward":
                outputs = await self.runtime.forward(uid, tensors)
                self.forwards.forwarded(peer, uid, now=trio.current_time())
                return _to_numpy(outputs), schema.output_compressions()
            n_inputs = len(schema.inputs)
            grads = await self.runtime.backward(uid, tensors[:n_inputs], tensors[n_inputs:], trainer=peer)
            return _to_numpy(grads), schema.input_compressions()
        except Exception as exc:
            self.errors += 1
            log.debug("hivemind %s of %s for %s failed: %s", op, uid, peer.short(), describe(exc))
            raise
        finally:
            self.in_flight.ended()

    def _admit(self, op: str, uid: str, peer: PeerID) -> None:
        # request bytes were reserved as they arrived (the door); what is left to check needs
        # the parsed request
        if op == "backward" and not self.forwards.may_backward(peer, uid, now=trio.current_time()):
            self.refusals[BACKWARD_WITHOUT_FORWARD] += 1
            self.door.refuse(BACKWARD_WITHOUT_FORWARD, peer, now=trio.current_time())  # status, metrics
            raise ExpertBackwardRefusedError(
                f"no forward from you on {uid!r} in the last {self.config.backward_window:g} s"
            )


__all__ = ["HivemindExperts"]
