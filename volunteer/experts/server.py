"""The expert server: answers ``/volunteer/<swarm>/experts/1.0.0`` calls with a Runtime.

Any exception while serving one call (a malformed header, a truncated or oversized payload, wrong
shapes or dtypes, an unknown uid or compression, NaN, CUDA OOM, a bug in a custom expert) becomes
an error reply to that caller, with the exception's type, message and traceback (as much as
``ExpertsConfig.share_tracebacks`` allows), the expert uid and our PeerID; the server goes on
serving everyone else.

Admission (``admission.py``): a call reserves the payload bytes its header announces, per peer
and in all, before a payload byte is read (BUSY past either bound); the bytes it then holds grow
only with what arrives. A backward is served only to a peer that ran forward on that expert
within ``backward_window``. Refusals are counted by reason in ``refusals``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypedDict, final
from collections.abc import Callable, Iterable, Mapping

import trio

from ..errors import (
    TrainerRefusedError,
    ExpertBackwardRefusedError,
    ExpertBusyError,
    ExpertInputsForgottenError,
    ExpertProtocolError,
    TensorFormatError,
    VolunteerError,
    describe,
)
from ..net.identity import PeerID
from ..net.streams import BufferedStream
from ..net.pool import SERVE_IDLE
from ..net.service import BaseService, Handler, HostAPI
from ..net.upload import REPLIES, UploadMeter, UploadStatus
from .activations import KeptInputs
from .admission import BACKWARD_WITHOUT_FORWARD, ForwardRecord, RequestBudget
from .config import DEFAULT_CONFIG, ExpertsConfig
from .failures import to_failure
from .inflight import InFlight
from .protocol import MAX_HEADER, Reply, Request, announced_payload, protocol_id, unpack
from .receipts import BACKWARD, FORWARD, Receipt, StateBinding, payload_digest, tensor_digest
from .trainers import TrainerCounts
from .runtime import Runtime
from .snapshots import SnapshotsReport
from .trainers import NOT_ADMITTED, OPEN, TRAINER_REFUSED, TrainerAdmission, TrainerPolicy
from .tensors import TensorReader, serialize, writes

log = logging.getLogger(__name__)

READ_TIMEOUT = 60.0  # a caller has this long to deliver its request (slowloris bound)
DRAIN_LIMIT = 8 * 1024 * 1024  # after an early error, bytes still read so the caller sees the reply
RECEIVE_CHUNK = 1024 * 1024
# Request payloads from this size have their receipt's inputs digest taken on a thread while the
# expert computes (hashlib releases the GIL): 0.3 to 0.5 ms of sha256 a call at h1024 b64 left the
# reply's path. Smaller ones hash in microseconds, less than a hand-off to a thread costs.
DIGEST_BESIDE_COMPUTE = 64 * 1024
_digester: ThreadPoolExecutor | None = None


def _digest_beside(inputs: list) -> Future:
    """``tensor_digest(inputs)`` on the server's digest thread."""
    global _digester
    if _digester is None:
        _digester = ThreadPoolExecutor(1, thread_name_prefix="volunteer-receipt-digest")
    return _digester.submit(tensor_digest, inputs)


async def _wait_readable(reader: BufferedStream) -> bool:
    """Wait for the next request's first bytes; False at end of stream."""
    if reader._buffer:
        return True
    chunk = await reader.stream.receive_some(RECEIVE_CHUNK)
    if not chunk:
        return False
    reader._buffer += chunk
    return True


# told of each call answered with a result: (caller, request op); the CLI counts the distinct
# trainers a volunteer served with it (its contributions)
ServedHook = Callable[[PeerID, str], None]
# told of each forward/backward's outcome: (uid, None) answered, (uid, error) failed in the expert
# itself (refusals and protocol errors are not the expert's failures); the CLI sets aside an
# expert that keeps failing
OutcomeHook = Callable[[str, "str | None"], None]



@final  # no other keys: a view tells it from hivemind's by its keys (``"upload" in status``)
class ServerStatus(TypedDict):
    """``ExpertServer.snapshot()``: what ``volunteer status`` and the dashboard show of serving."""

    active_requests: int
    bytes_in: int
    bytes_out: int
    errors: int
    refusals: dict[str, int]  # refused calls by reason (admission.py)
    trainer_policy: str
    trainers: dict[str, TrainerCounts]
    rollbacks: int
    snapshots: SnapshotsReport  # the states replies were answered from, kept for exact audits
    upload_limit_bps: float | None
    upload: UploadStatus  # the volunteer's whole upload, replicas' included


class ExpertServer(BaseService):
    """Serves a Runtime's experts on a Host, as a Host service: ``await host.add_service(server)``.

    ``upload``: the volunteer's shared upload meter (capped and counted with its replica traffic);
    without one, ``upload_limit`` bytes per second of reply payload for this server alone;
    ``on_served(peer, op)``: told of each call answered with a result; ``on_outcome(uid, error)``:
    told of each call's outcome (error None: answered). ``wait_idle`` returns once
    no call is being served (a leaving node waits on it after pausing the runtime)."""

    def __init__(
        self,
        host: HostAPI,
        runtime: Runtime,
        swarm_id: str,
        config: ExpertsConfig = DEFAULT_CONFIG,
        *,
        upload: UploadMeter | None = None,
        upload_limit: float | None = None,
        on_served: ServedHook | None = None,
        on_outcome: OutcomeHook | None = None,
        trainers: TrainerPolicy = OPEN,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.host = host
        self.runtime = runtime
        self.config = config
        self.protocol = protocol_id(swarm_id)
        self.in_flight = InFlight()  # calls being served now
        self.bytes_in = 0
        self.bytes_out = 0
        self.errors = 0
        self.upload = upload if upload is not None else UploadMeter(upload_limit)
        self.budget = RequestBudget(config)  # request bytes reserved now, per peer and in all
        self.forwards = ForwardRecord(config)  # who may call backward on what
        # a forward's inputs, for the backward its caller announced (it then sends only gradients)
        self.kept_inputs = KeptInputs(config.kept_inputs_entries, config.kept_inputs_bytes, config.activation_cache_ttl)
        self.refusals: Counter[str] = Counter()  # refused calls by reason (admission.py)
        self.on_served = on_served
        self.on_outcome = on_outcome
        # who may train (the swarm file's trainers): certificates expire by the wall clock
        self.admission = TrainerAdmission(trainers, swarm_id)
        self.wall_clock = wall_clock
        self._told: set = set()  # (peer, reason) refusals logged once

    @property
    def upload_limit(self) -> float | None:
        """Reply payload bytes per second (None: unlimited)."""
        return self.upload.rate

    @property
    def active_requests(self) -> int:
        """Calls being served now."""
        return self.in_flight.count

    def handlers(self) -> Mapping[str, Handler]:
        return {self.protocol: self.handle}

    async def wait_idle(self) -> None:
        """Return once no call is being served (at once when none is)."""
        await self.in_flight.wait_idle()

    def snapshot(self) -> ServerStatus:
        """Calls being served, bytes, errors and refusals by reason (``volunteer status``)."""
        trainers = self.runtime.trainer_report()
        return {
            "active_requests": self.active_requests,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "errors": self.errors,
            "refusals": dict(self.refusals),
            "trainer_policy": self.admission.policy.describe(),
            "trainers": trainers["trainers"],  # per trainer: applied, clipped, refused
            "rollbacks": trainers["rollbacks"],
            # the states replies were answered from, kept for exact audits, and the budget stated for them
            "snapshots": self.runtime.snapshots.report(),
            "upload_limit_bps": self.upload_limit,
            "upload": self.upload.snapshot(),  # the volunteer's whole upload, replicas' included
        }


    async def handle(self, stream) -> None:
        """Calls on one stream, one after another: a caller reuses an idle stream for its next
        call. An error reply ends the stream (the caller may still be sending a bad payload)."""
        reader = BufferedStream(stream)
        # One scope for the stream's life, its deadline moved for each wait between calls:
        # entering and leaving a scope per call cost about 40 Python calls of trio's.
        with trio.CancelScope() as idle:
            while await self._one_call(reader, stream):
                idle.deadline = trio.current_time() + SERVE_IDLE
                if not await _wait_readable(reader):
                    return
                idle.deadline = math.inf  # a call is served to its end, however long it takes

    async def _one_call(self, reader: BufferedStream, stream) -> bool:
        """Serve one call; True if the stream may carry another."""
        uid = ""
        pending = 0  # request payload bytes not read yet (drained after an early error)
        peer = stream.remote_peer
        reserved = 0
        owes_step = False  # a backward ran: its optimizer step waits until the reply is out
        now = trio.lowlevel.current_clock().current_time  # trio.current_time without its two wrappers
        self.in_flight.started()
        try:
            try:
                # a bare scope, not fail_after's context manager: about 30 fewer Python calls a call
                reading = trio.CancelScope(deadline=now() + READ_TIMEOUT)
                with reading:
                    message = unpack(await reader.receive_length_prefixed(MAX_HEADER, "expert request header"))
                    uid = str(message.get("uid", ""))[:256]
                    pending = announced_payload(message)
                    request = Request.from_message(message)
                    if request.op == "info":
                        await reader.send_all(Reply.of_info(self.runtime.info(uid)).encode())
                        return True
                    if request.op == "snapshot":
                        await self._send_snapshot(reader, uid, request.digest)
                        return True
                    tensors = TensorReader(request.tensors, config=self.config)  # validates sizes
                    self._admit(peer, request, tensors.expected, now=now())
                    reserved = tensors.expected
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
                if reading.cancelled_caught:
                    raise trio.TooSlowError
                n_inputs = request.n_inputs
                kept = None
                stamps: list = []  # the state that computed the reply, for its receipt
                inputs_digest: Future | None = None  # the receipt's, taken beside the compute
                started = now()
                if request.op == "forward":
                    if self.config.receipts and tensors.expected >= DIGEST_BESIDE_COMPUTE:
                        inputs_digest = _digest_beside(inputs)
                    outputs = await self.runtime.forward(uid, inputs, keep_graph=request.keep_graph, stamps=stamps)
                    self.forwards.forwarded(peer, uid, now=now())
                    if request.keep_graph:
                        kept = self.kept_inputs.put(str(peer), uid, inputs, now=now())
                else:
                    if request.kept is not None:
                        kept_inputs = self.kept_inputs.take(str(peer), uid, request.kept, now=started)
                        if kept_inputs is None:
                            raise ExpertInputsForgottenError(f"inputs {request.kept} of {uid!r} are no longer kept")
                        inputs, n_inputs = [*kept_inputs, *inputs], len(kept_inputs)
                    if self.config.receipts and sum(t.nelement() * t.element_size() for t in inputs) >= DIGEST_BESIDE_COMPUTE:
                        inputs_digest = _digest_beside(inputs)
                    owes_step = True
                    outputs = await self.runtime.backward(
                        uid, inputs[:n_inputs], inputs[n_inputs:], settle_later=True, trainer=peer, stamps=stamps,
                    )
                server_s = now() - started
                reply, produced = serialize(outputs, request.compression, config=self.config)
                chunks: Iterable[memoryview] = produced
                receipt = None
                if stamps and stamps[0] is not None:  # a receipt digests the reply's bytes before they go
                    chunks = list(chunks)
                    receipt = self._receipt(request, inputs, reply, chunks, stamps,
                                            inputs_digest.result() if inputs_digest is not None else None)
            except trio.TooSlowError:
                raise ExpertProtocolError(f"request not received within {READ_TIMEOUT:.0f} s") from None
            finally:
                if reserved:
                    self.budget.release(peer, reserved)
            head = Reply.result(reply, server_s=server_s, kept=kept, receipt=receipt).encode()
            buffers = list(writes(head, chunks))
            for buffer in buffers:
                # payload bytes in this write (the header is not limited or counted)
                payload = 0 if buffer is head else len(buffer) - (len(head) if len(buffers) == 1 else 0)
                await self.upload.take(payload, REPLIES)
                await reader.send_all(buffer)
                self.bytes_out += payload
            if self.on_served is not None:
                self.on_served(peer, request.op)
            if self.on_outcome is not None:
                self.on_outcome(uid, None)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise  # the caller went away: nobody to tell
        except Exception as exc:  # noqa: BLE001 - every failure of one call goes back to its caller
            self.errors += 1
            failure = to_failure(exc, expert_uid=uid, peer_id=str(self.host.peer_id), config=self.config)
            if failure["kind"] == "error":
                log.warning("expert %s failed for %s: %s", uid or "?", stream.remote_peer.short(), describe(exc))
                if self.on_outcome is not None and uid:
                    self.on_outcome(uid, describe(exc))
            await reader.send_all(Reply.error(failure).encode())
            await reader.send_eof()
            await self._drain(reader, pending)
            return False
        finally:
            self.in_flight.ended()
            if owes_step:
                # not earlier: taken during the send, the step would slow the reply down
                self.runtime.apply_owed_steps()

    def _receipt(self, request: Request, inputs, header: dict, chunks, stamps: list,
                 inputs_digest: bytes | None = None) -> list:
        """The signed receipt of a forward/backward reply (``receipts.py``): one hash of the
        inputs (``inputs_digest`` when it was taken beside the compute), one of the reply's bytes,
        one signature; the state is named by the id of its snapshot, copied once per version
        (``snapshots.py``); ``stamps`` holds the runtime's word on that state."""
        stamp, rows = stamps[0]
        receipt = Receipt(
            self.host.peer_id.to_bytes(), request.uid, FORWARD if request.op == "forward" else BACKWARD,
            stamp.expert_class, stamp.hidden_dim, stamp.version, stamp.state,
            inputs_digest if inputs_digest is not None else tensor_digest(inputs),
            payload_digest(header, chunks), rows, str(inputs[0].dtype) if inputs else "", stamp.device,
            stamp.threads, request.compression,
        )
        return receipt.sign(self.host.keypair).to_wire()

    async def _send_snapshot(self, reader: BufferedStream, uid: str, state: bytes | None) -> None:
        """Serve a kept state by the id a receipt named, with its signed digest (taken here, on
        a thread, the first time it is served); ``forgotten`` if it is not kept."""
        snapshot = self.runtime.snapshots.get(state) if state is not None else None
        if snapshot is None or snapshot.uid != uid:
            raise ExpertInputsForgottenError(f"no snapshot of {uid!r} with that id is kept here")
        digest = await trio.to_thread.run_sync(snapshot.digest)
        binding = StateBinding(self.host.peer_id.to_bytes(), uid, snapshot.state, snapshot.version, digest)
        header, chunks = serialize(snapshot.tensors, "none", config=self.config)
        head = Reply.of_snapshot(header, {"u": uid, "v": snapshot.version, "n": snapshot.names,
                                          "b": binding.sign(self.host.keypair).to_wire()}).encode()
        buffers = list(writes(head, chunks))
        for buffer in buffers:
            payload = 0 if buffer is head else len(buffer) - (len(head) if len(buffers) == 1 else 0)
            await self.upload.take(payload, REPLIES)
            await reader.send_all(buffer)
            self.bytes_out += payload

    def _admit(self, peer, request: Request, nbytes: int, *, now: float) -> None:
        """Authorize a forward/backward and reserve its announced bytes, or raise the typed
        refusal (counted by reason). Nothing is reserved when it raises."""
        self._admit_trainer(peer, request)
        if request.op == "backward" and not self.forwards.may_backward(peer, request.uid, now=now):
            self.refusals[BACKWARD_WITHOUT_FORWARD] += 1
            raise ExpertBackwardRefusedError(
                f"no forward from you on {request.uid!r} in the last {self.config.backward_window:g} s"
            )
        refused = self.budget.reserve(peer, nbytes)
        if refused is not None:
            self.refusals[refused] += 1
            raise ExpertBusyError(
                f"request bytes in flight are at their limit ({refused}: {self.budget.held_by(peer)} held for you, "
                f"{self.budget.total} in all)"
            )

    def _admit_trainer(self, peer, request: Request) -> None:
        """Refuse a backward (a forward too, if the swarm says so) from a peer the swarm does not
        admit as a trainer, or one refused for its gradients, before a payload byte is read."""
        wall = self.wall_clock()
        if request.op == "backward":
            why = self.admission.refusal(peer, request.credential, wall=wall)
        else:
            why = self.admission.may_forward(peer, request.credential, wall=wall)
        if why is not None:
            self._refuse(peer, NOT_ADMITTED, f"not an admitted trainer of this swarm: {why}")
        if request.op == "backward":
            try:
                self.runtime.check_trainer(request.uid, peer)
            except TrainerRefusedError as exc:
                self._refuse(peer, TRAINER_REFUSED, str(exc))

    def _refuse(self, peer, reason: str, message: str) -> None:
        self.refusals[reason] += 1
        if (peer, reason) not in self._told and len(self._told) < 4096:
            self._told.add((peer, reason))  # one line per trainer and reason; the rest are counted
            log.warning("refused %s: %s", peer.short(), message)
        raise TrainerRefusedError(message)

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


__all__ = ["ExpertServer", "OutcomeHook", "ServedHook"]
