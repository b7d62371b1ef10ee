"""Calling experts: ``call_expert`` (async, one call) and ``RemoteExpert`` (an nn.Module whose
forward and backward run on a volunteer).

Errors a trainer can act on, all ``ExpertError``s:
- ``RemoteExpertError``: the expert raised on the server; its message carries the remote
  traceback, printed under the local one.
- ``ExpertTimeoutError``: no answer within the forward / backward timeout.
- ``ExpertUnavailableError``: the peer cannot be reached, the connection died mid-call, or the
  server refused (``ExpertBusyError`` when its queue is full, paused, or not serving that uid).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterable, Sequence

import torch
import trio
from torch import nn

from ..errors import (
    ExpertError,
    ExpertExcludedError,
    ExpertInputError,
    ExpertInputsForgottenError,
    ExpertPeerUnreachableError,
    ExpertProtocolError,
    ExpertTimeoutError,
    ExpertUnavailableError,
    VolunteerError,
    describe,
)
from ..dht.grid import grid_experts
from ..dht.node import DHTNode
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.pool import pool_of
from ..net.service import HostAPI

from .callstats import AUTO, CallReport, CallStats, choose_compression, is_local_path
from .config import DEFAULT_BACKWARD_TIMEOUT, DEFAULT_CONFIG, DEFAULT_FORWARD_TIMEOUT, ExpertsConfig
from .directory import ExpertDirectory, ExpertHost, TrainerSwarm
from .faults import FaultInjection
from .failures import raise_remote
from .guard import ReplyGuard
from .trust import TrustLedger
from .protocol import MAX_HEADER, Reply, Request, protocol_id
from .receipts import PayloadDigest, Receipt, StateBinding, check_reply
from .snapshots import state_digest
from ..dht.vouches import VouchBook
from .tensors import TensorReader, serialize, writes
RECEIVE_CHUNK = 1024 * 1024
PEER_IDS_REMEMBERED = 1024  # multiaddrs whose parsed PeerID call_expert keeps


@lru_cache(maxsize=PEER_IDS_REMEMBERED)
def _peer_id_in(addr: Multiaddr) -> PeerID | None:
    # a multiaddr's /p2p part is parsed (base58, multihash checks) on every access: a trainer
    # calling the same expert thousands of times parses it once
    return addr.peer_id


def as_peer(peer: PeerID | Multiaddr | str) -> PeerID | Multiaddr:
    """A PeerID, a PeerID string, or a multiaddr ending in /p2p/ID."""
    if isinstance(peer, (PeerID, Multiaddr)):
        return peer
    return Multiaddr(peer) if peer.startswith("/") else PeerID.from_string(peer)


async def call_expert(
    host: HostAPI,
    peer: PeerID | Multiaddr,
    uid: str,
    op: str,
    tensors: Sequence[torch.Tensor] = (),
    *,
    swarm_id: str,
    n_inputs: int | None = None,
    compression: str = "none",
    timeout: float = DEFAULT_FORWARD_TIMEOUT,
    faults: FaultInjection | None = None,
    config: ExpertsConfig = DEFAULT_CONFIG,
    backward_follows: bool = False,
    kept: int | None = None,
    report: CallReport | None = None,
    credential: bytes | None = None,
    digest: bytes | None = None,
):
    """One ``info`` / ``forward`` / ``backward`` / ``snapshot`` call; returns the info dict, the
    output tensors, or (snapshot, by the state ``digest`` a receipt named) the reply's ``sn`` map
    and the state's tensors. A forward's or backward's reply must carry a receipt that names this
    call and what arrived (``receipts.check_reply``), kept in ``report.receipt``; else the call
    fails (ExpertProtocolError).
    ``backward_follows`` (forward): we will call backward with these inputs, so the server may
    keep the forward's graph (and the inputs) for it. ``kept`` (backward): the key under which
    the forward's reply said the inputs are kept (``CallReport.kept``): only the gradients go,
    unless the volunteer has forgotten them (then the inputs too). ``report``: filled in with
    what the call cost (times, payload bytes, the volunteer's time). ``credential``: our trainer
    certificate (``trainers.TrainerCertificate.encode``), for swarms whose organiser admits
    trainers by certificate."""
    peer_id = _peer_id_in(peer) if isinstance(peer, Multiaddr) else peer
    peer_name = str(peer_id)
    protocol = protocol_id(swarm_id)
    report = report if report is not None else CallReport()
    now = trio.lowlevel.current_clock().current_time  # trio.current_time without its two wrappers
    report.op, report.compression, report.started = op, compression, now()
    request = Request(op, uid, compression, None, n_inputs or 0, backward_follows and op == "forward",
                      credential=credential, digest=digest)
    sending = list(tensors)
    if op == "backward" and kept is not None and n_inputs:
        request, sending = replace(request, kept=kept, n_inputs=0), sending[n_inputs:]
    with trio.move_on_after(timeout) as scope:
        if faults is not None:
            await faults.before_call(uid)
        try:
            # connected already: by PeerID, so the multiaddr is not parsed again (one lookup)
            conn = host.connection_to(peer_id) if peer_id is not None else None
            if conn is None:
                conn = await host.connect(peer)
        except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
            raise ExpertPeerUnreachableError(f"cannot reach {peer_name} for expert {uid!r}: {describe(exc)}") from None
        pool = pool_of(host)
        stale_retried = False
        while True:
            try:
                lease = await pool.lend(conn.remote_peer, protocol)
            except (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ExpertUnavailableError(f"{peer_name} does not take expert calls: {describe(exc)}") from None
            try:
                async with lease:
                    return await _exchange(lease, request, sending, peer_name, config, report, peer_id, now)
            except _StaleStream as exc:
                if lease.reused and not stale_retried:
                    stale_retried = True
                    continue  # the server had dropped that idle stream: once more on a fresh one
                raise ExpertUnavailableError(str(exc)) from None
            except ExpertInputsForgottenError:
                if request.kept is None:
                    raise
                # evicted or too old on the volunteer: the inputs go again, with the gradients
                request, sending = replace(request, kept=None, n_inputs=n_inputs or 0), list(tensors)
                report.resent_inputs = True
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ExpertUnavailableError(f"connection to {peer_name} broke during a call to {uid!r}: {describe(exc)}") from None
    if scope.cancelled_caught:
        raise ExpertTimeoutError(f"expert {uid!r} on {peer_name} did not answer {op} within {timeout:g} s")


class _StaleStream(ExpertUnavailableError):
    """The stream ended before any reply byte: on a reused stream, worth one retry."""


async def _exchange(lease, request: Request, tensors, peer_name, config, report: CallReport, peer_id, now):
    reader = lease.stream
    op, uid = request.op, request.uid
    chunks: Iterable[memoryview] = ()
    if op in ("forward", "backward"):
        header, chunks = serialize(list(tensors), request.compression, config=config)
        request = request.with_tensors(header)
        report.bytes_out += header["n"]
    reply: Reply | None = None
    buffers = list(writes(request.encode(), chunks))

    async def send() -> None:
        try:
            for buffer in buffers:
                await reader.send_all(buffer)
            report.sent = now()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the server stopped reading: its reply (an error, surely) tells why

    async def receive_reply(cancel_sending) -> tuple[Reply | None, BaseException | None]:
        try:
            body = await reader.receive_length_prefixed(MAX_HEADER, "expert reply header")
            report.first_reply = now()
        except (VolunteerError, trio.BrokenResourceError) as exc:
            cancel_sending()
            return None, _StaleStream(f"{peer_name} closed the call to {uid!r} without a reply: {describe(exc)}")
        try:
            reply = Reply.decode(body, op)
        except ExpertProtocolError as exc:
            cancel_sending()
            return None, ExpertProtocolError(f"{peer_name} sent a bad reply to {uid!r}: {exc}")
        if not reply.ok:
            cancel_sending()  # stop sending: the call failed
        return reply, None

    if len(buffers) == 1:
        # A small call goes out in one write, before we listen: no task and no nursery (tens of
        # microseconds a call). Safe even if the server answers early with an error: it drains
        # up to DRAIN_LIMIT (8 MiB).
        await send()
        reply, failed = await receive_reply(lambda: None)
    else:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            reply, failed = await receive_reply(nursery.cancel_scope.cancel)
    if failed is not None:  # raised out here, not as an ExceptionGroup from the nursery
        if not isinstance(failed, _StaleStream):
            lease.discard()
        raise failed
    assert reply is not None
    if not reply.ok:
        lease.discard()  # the server ends the stream after an error reply
        raise_remote(reply.failure, expert_uid=uid, peer_id=peer_name, config=config)
    report.server_s, report.kept = reply.server_s, reply.kept
    if op == "info":
        report.done = now()
        return reply.info
    receipted = op in ("forward", "backward")
    receipt = None
    if receipted:
        try:
            receipt = Receipt.from_wire(reply.receipt) if reply.receipt is not None else None
        except ExpertProtocolError as exc:
            lease.discard()
            raise ExpertProtocolError(f"{peer_name} sent a bad receipt for {uid!r}: {exc}") from None
    outputs = TensorReader(reply.tensors, config=config)
    hashed = PayloadDigest(reply.tensors) if receipt is not None and reply.tensors is not None else None
    while not outputs.done:
        chunk = await reader.receive_some(min(outputs.remaining, RECEIVE_CHUNK))
        if not chunk:
            raise ExpertUnavailableError(f"{peer_name} closed the call to {uid!r} mid-reply")
        outputs.feed(chunk)
        if hashed is not None:
            hashed.update(chunk)
    report.bytes_in += outputs.expected
    report.done = now()
    if receipted and (receipt is not None or config.receipts):  # unreceipted: audited by comparison
        report.receipt = check_reply(receipt, uid=uid, op=op, outputs=hashed.digest() if hashed else b"",
                                     peer=peer_id if peer_id is not None else peer_name)
    if op == "snapshot":
        return reply.snapshot, outputs.finish()
    return outputs.finish()


class DHTDirectory:
    """Our swarm kind's ``ExpertDirectory``: grids from the DHT's prefix records (``dht.grid``),
    calls over the swarm's expert protocol (``call_expert``). Without a DHT node it calls peers
    named by address only (``RemoteExpert``), and ``find_grid`` raises."""

    def __init__(
        self, host: HostAPI, dht: DHTNode | None, swarm_id: str, config: ExpertsConfig = DEFAULT_CONFIG,
        *, credential: bytes | None = None,
    ) -> None:
        self.host = host
        self.dht = dht
        self.swarm_id = swarm_id
        self.config = config
        self.credential = credential  # our trainer certificate, presented on every call

    async def find_grid(self, uid_prefix: str, grid_size: Sequence[int]) -> dict[str, list[ExpertHost]]:
        if self.dht is None:
            raise ExpertUnavailableError(f"no DHT to look up the grid {uid_prefix!r} in (this directory calls known peers only)")
        found = await grid_experts(self.dht, uid_prefix, len(grid_size))
        return {uid: list(hosts) for uid, hosts in found.items()}

    async def call_expert(
        self,
        peer: PeerID | Multiaddr,
        uid: str,
        op: str,
        tensors: Sequence[torch.Tensor] = (),
        *,
        n_inputs: int | None = None,
        compression: str = "none",
        timeout: float = DEFAULT_FORWARD_TIMEOUT,
        faults: FaultInjection | None = None,
        backward_follows: bool = False,
        kept: int | None = None,
        report: CallReport | None = None,
        digest: bytes | None = None,
    ) -> list[torch.Tensor] | dict:
        return await call_expert(
            self.host, peer, uid, op, tensors, swarm_id=self.swarm_id, n_inputs=n_inputs, compression=compression,
            timeout=timeout, faults=faults, config=self.config, backward_follows=backward_follows, kept=kept,
            report=report, credential=self.credential, digest=digest,
        )


@dataclass(frozen=True)
class FetchedState:
    """A snapshot as an auditor fetched it: its tensors by name, and its host's signed binding of
    the id a receipt named to their digest (checked: the evidence a proof can carry)."""

    names: list[str]
    tensors: list[torch.Tensor]
    binding: StateBinding


async def fetch_state(directory: ExpertDirectory, peer: PeerID | Multiaddr, uid: str, state: bytes,
                      timeout: float = DEFAULT_FORWARD_TIMEOUT, *, check_digest: bool = True) -> FetchedState:
    """The snapshot of ``uid`` with id ``state`` (a receipt named it) from the host that signed
    it, with its binding checked: signed by that host, for this id and uid, and (``check_digest``)
    the digest of the tensors that came (taken on a thread). ExpertError when it is not served
    (``forgotten``: gone) or does not check out (ExpertProtocolError)."""
    meta, tensors = await directory.call_expert(peer, uid, "snapshot", timeout=timeout, digest=state)
    names = list(meta["n"])
    if len(names) != len(tensors):
        raise ExpertProtocolError(f"{peer} named {len(names)} tensors of a snapshot of {uid!r} and sent {len(tensors)}")
    binding = StateBinding.from_wire(meta.get("b"))
    signer = peer.peer_id if isinstance(peer, Multiaddr) else peer  # None: a test's bare address
    if not binding.verify(signer) or binding.uid != uid or binding.state != state or binding.version != meta["v"]:
        raise ExpertProtocolError(f"{peer} sent a snapshot of {uid!r} whose binding is not its own for that id")
    if check_digest and await trio.to_thread.run_sync(state_digest, list(zip(names, tensors))) != binding.digest:
        raise ExpertProtocolError(f"{peer} sent a snapshot of {uid!r} that is not the state it signed for that id")
    return FetchedState(names, tensors, binding)


async def fetch_snapshot(directory: ExpertDirectory, peer: PeerID | Multiaddr, uid: str, state: bytes,
                         timeout: float = DEFAULT_FORWARD_TIMEOUT) -> tuple[list[str], list[torch.Tensor]]:
    """An auditor's fetch: ``fetch_state``'s (tensor names, tensors), without hashing them. Over
    the host's own stream, what it sent under that id is what it stands by: a reply those tensors
    do not reproduce excludes it, a reply they do passes whatever their digest. The digest is
    what lets a third party believe it (``fetch_state``, or ``Recomputer.check(binding=)``
    before a proof is passed on): a 32 MB hash would cost an audit half again its recompute."""
    fetched = await fetch_state(directory, peer, uid, state, timeout, check_digest=False)
    return fetched.names, fetched.tensors


class _Call:
    """What an autograd Function needs to reach one expert from a synchronous thread: the call
    goes through the swarm's directory (its kind's protocol), on the swarm's trio loop. ``addrs``
    (the host's declared addresses) go to the peerstore at the first call, on the trio thread
    (the peerstore is not thread-safe): no thread hop of their own. Each call is recorded in
    ``stats`` (the trainer's ``CallStats``), whose measured throughput of the host also picks the
    wire encoding when ``compression`` is ``auto``. With a ``guard``, a reply that fails the
    trainer's checks raises ``ExpertReplyRejected`` (recorded as a failed call) and a host the
    trainer excluded is not called (``ExpertExcludedError``)."""

    def __init__(
        self, swarm: TrainerSwarm, uid: str, peer: PeerID | Multiaddr, forward_timeout: float, backward_timeout: float,
        compression: str, backward_follows: bool = False, addrs: Sequence[bytes | str | Multiaddr] = (),
        stats: CallStats | None = None,
        guard: ReplyGuard | None = None,
        vouches: VouchBook | None = None,
    ) -> None:
        self.swarm, self.uid, self.peer = swarm, uid, peer
        self.vouches = vouches  # the trainer's tally of accepted replies (vouches.py): the hosts' credit
        self.forward_timeout, self.backward_timeout, self.compression = forward_timeout, backward_timeout, compression
        self.backward_follows = backward_follows  # forward under autograd: its backward will be called
        self._addrs = tuple(addrs) if isinstance(peer, PeerID) else ()  # a multiaddr peer carries its own
        self.stats = stats
        self.guard = guard
        self.peer_key = peer_key(peer)

    def _remember_host(self) -> None:
        if self._addrs and isinstance(self.peer, PeerID):
            self.swarm.host.peerstore.remember_addrs(self.peer, self._addrs)
            self._addrs = ()

    async def info(self) -> dict:
        self._remember_host()
        return await self.swarm.directory.call_expert(self.peer, self.uid, "info", timeout=self.forward_timeout)

    async def forward(self, inputs: Sequence[torch.Tensor], report: CallReport | None = None) -> list[torch.Tensor]:
        """The expert's outputs, past the guard; ``report`` (filled in) keeps the key of the
        inputs the volunteer kept for the backward."""
        _refuse_excluded(self)
        self._remember_host()
        report = report if report is not None else CallReport()

        def check(outputs: list[torch.Tensor]) -> None:
            if self.guard is not None:
                _refuse_excluded(self)  # caught while this call was in flight: its reply is not taken
                self.guard.check_outputs(self.uid, self.peer_key, outputs, inputs, receipted=report.receipt is not None)

        return await self._recorded(report, self.swarm.directory.call_expert(
            self.peer, self.uid, "forward", inputs, compression=self._encoding(), timeout=self.forward_timeout,
            faults=self.swarm.faults, backward_follows=self.backward_follows, report=report,
        ), check, _rows(inputs))

    async def backward(
        self, inputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], kept: int | None = None,
        report: CallReport | None = None,
    ) -> list[torch.Tensor]:
        """The gradients of the inputs, past the guard; ``kept``: the forward's ``CallReport.kept``
        (the inputs then stay here unless the volunteer has forgotten them)."""
        _refuse_excluded(self)
        self._remember_host()
        report = report if report is not None else CallReport()

        def check(grad_inputs: list[torch.Tensor]) -> None:
            if self.guard is not None:
                _refuse_excluded(self)
                self.guard.check_gradients(self.uid, self.peer_key, grad_inputs, grads,
                                           receipted=report.receipt is not None)

        return await self._recorded(report, self.swarm.directory.call_expert(
            self.peer, self.uid, "backward", [*inputs, *grads], n_inputs=len(inputs), compression=self._encoding(),
            timeout=self.backward_timeout, faults=self.swarm.faults, kept=kept, report=report,
        ), check, _rows(inputs))

    def _encoding(self) -> str:
        if self.compression != AUTO:
            return self.compression
        if self._on_local_path():
            return choose_compression(AUTO, None, local=True)  # before any figure: none is read
        if self.stats is None:
            return choose_compression(AUTO, None)
        return choose_compression(
            AUTO, self.stats.bytes_cost(self.peer_key), self.stats.wire_seconds(self.peer_key),
            self.stats.rtt(self.peer_key))

    def _on_local_path(self) -> bool:
        """Whether the call goes directly to this machine or its LAN (``is_local_path``): over
        our connection to the host, or, not connected yet, to where we will dial (every address
        known of it local). What a path is, not how fast a loaded machine made it look: auto
        never goes lossy there."""
        peer = _peer_id_in(self.peer) if isinstance(self.peer, Multiaddr) else self.peer
        host = self.swarm.host
        conn = host.connection_to(peer) if peer is not None else None
        if conn is not None:
            return is_local_path(conn.remote_addr)
        if isinstance(self.peer, Multiaddr):
            return is_local_path(self.peer)
        dial = host.peerstore.addrs(self.peer)  # the host's declared addresses are there (_remember_host)
        return bool(dial) and all(is_local_path(addr) for addr in dial)

    async def _recorded(self, report: CallReport, call, check, rows: int) -> list[torch.Tensor]:
        # a reply the guard rejects counts as a failed call in the host's record
        try:
            result = await call
            check(result)
        except ExpertError:
            if self.stats is not None:
                self.stats.failed(self.uid, self.peer_key)
            raise
        if self.vouches is not None:
            # accepted (past the guard, over a stream only that host could answer on): its credit
            host = _peer_id_in(self.peer) if isinstance(self.peer, Multiaddr) else self.peer
            if host is not None:
                self.vouches.accept(host.to_bytes(), rows)
        if self.stats is None:
            return result
        peer_id = _peer_id_in(self.peer) if isinstance(self.peer, Multiaddr) else self.peer
        conn = self.swarm.host.connection_to(peer_id) if peer_id is not None else None
        if conn is None:
            self.stats.record(self.uid, self.peer_key, report)
        else:
            # the transport too: a lossy TCP path moves to QUIC
            self.stats.record(self.uid, self.peer_key, report, conn.describe_path(with_transport=True), conn.rtt)
        return result


def _rows(inputs: Sequence[torch.Tensor]) -> int:
    return int(inputs[0].shape[0]) if inputs and inputs[0].dim() else 0


def peer_key(peer: PeerID | Multiaddr) -> str:
    """How the trust ledger and the call records name a host: its PeerID string (a multiaddr's
    /p2p part)."""
    if isinstance(peer, Multiaddr):
        found = _peer_id_in(peer)
        return str(found) if found is not None else str(peer)
    return str(peer)


def _refuse_excluded(call: _Call) -> None:
    if call.guard is not None and call.guard.ledger.excluded(call.peer_key):
        why = call.guard.ledger.exclusion_reason(call.peer_key)
        raise ExpertExcludedError(f"expert {call.uid!r} on {call.peer_key}: this trainer excluded that host ({why})")


def detached_cpu(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().to("cpu").contiguous() for t in tensors]


# Passed into every remote autograd Function: with it, backward runs (and the experts learn)
# even when no input requires grad, e.g. a mixture right after the data (hivemind does the same).
DUMMY = torch.empty(0, requires_grad=True)


class _RemoteFunction(torch.autograd.Function):
    """Forward and backward of one remote expert (the server applies its optimizer on backward)."""

    @staticmethod
    def forward(ctx, dummy: torch.Tensor, call: _Call, *inputs: torch.Tensor):
        device = inputs[0].device
        report = CallReport()
        outputs = call.swarm.loop.run(call.forward, detached_cpu(inputs), report)
        ctx.call, ctx.device, ctx.kept = call, device, report.kept
        ctx.output_meta = [(o.shape, o.dtype) for o in outputs]
        ctx.save_for_backward(*inputs)
        return tuple(o.to(device) for o in outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        inputs = ctx.saved_tensors
        grads = [g if g is not None else torch.zeros(shape, dtype=dtype) for g, (shape, dtype) in zip(grad_outputs, ctx.output_meta)]
        grad_inputs = ctx.call.swarm.loop.run(ctx.call.backward, detached_cpu(inputs), detached_cpu(grads), ctx.kept)
        return (None, None, *(g.to(ctx.device) for g in grad_inputs))


class RemoteExpert(nn.Module):
    """An expert on a volunteer, used like a local module: ``RemoteExpert("expert.0.3", peer, swarm)``.

    ``peer`` is a PeerID (with addresses the swarm knows, e.g. from ``swarm.get_experts``), a PeerID
    string, or a multiaddr ending in /p2p/ID. Forward and backward are remote calls; gradients flow
    back to the inputs, and the server updates the expert's parameters on backward.

    Every reply passes ``guard`` (``experts/guard.py``) before it reaches autograd: NaN or
    infinity, or a scale far from this expert's recent replies, raises ``ExpertReplyRejected``.
    By default the expert has a guard of its own; ``guard=swarm.guard`` shares the swarm's
    (its trust ledger, which ``Swarm.trust_report`` shows, and its learned ranges);
    ``check_replies=False`` takes every reply as it comes (to measure what the checks cost).
    """

    def __init__(
        self,
        uid: str,
        peer: PeerID | Multiaddr | str,
        swarm: TrainerSwarm,
        *,
        forward_timeout: float = DEFAULT_FORWARD_TIMEOUT,
        backward_timeout: float = DEFAULT_BACKWARD_TIMEOUT,
        compression: str = AUTO,
        addrs: Sequence[bytes | str] = (),
        guard: ReplyGuard | None = None,
        check_replies: bool = True,
    ) -> None:
        super().__init__()
        self.uid = uid
        self.peer = as_peer(peer)
        self.swarm = swarm
        self.guard = (guard if guard is not None else ReplyGuard(TrustLedger())) if check_replies else None
        self._call = _Call(swarm, uid, self.peer, forward_timeout, backward_timeout, compression, backward_follows=True,
                           addrs=addrs, stats=swarm.calls, guard=self.guard, vouches=swarm.vouches)
        # for forwards without autograd (inference): no backward follows, the server keeps nothing
        self._inference_call = _Call(swarm, uid, self.peer, forward_timeout, backward_timeout, compression, addrs=addrs,
                                     stats=swarm.calls, guard=self.guard, vouches=swarm.vouches)
        self._info: dict | None = None
        self._input_specs: list | None = None  # parsed from the cached info, for the local check

    @property
    def info(self) -> dict:
        """The expert's schema and metadata, asked of the server once."""
        if self._info is None:
            self._info = self.swarm.loop.run(self._call.info)
        return self._info

    def check_inputs(self, inputs: Sequence[torch.Tensor]) -> None:
        """Refuse inputs that cannot fit the expert's schema before any round trip, once the schema
        is cached (``info`` was asked): ExpertInputError naming the expert. Without a cached schema
        the server checks them as always. Values (NaN/inf) are left to the server: a pass over the
        data is its worker thread's job, not the caller's."""
        if self._info is None:
            return
        if self._input_specs is None:
            from .schema import TensorSpec

            try:
                self._input_specs = [TensorSpec.from_dict(spec) for spec in self._info.get("inputs", [])]
            except (ExpertProtocolError, TypeError, ValueError):
                self._input_specs = []  # an info reply we cannot read: leave the check to the server
        if not self._input_specs:
            return
        from .schema import check_tensors

        try:
            check_tensors(self._input_specs, inputs, nan_check=False)
        except ExpertInputError as exc:
            raise ExpertInputError(f"expert {self.uid!r} on {self.peer}: {exc} (its cached schema; nothing was sent)") from None

    def forward(self, *inputs: torch.Tensor):
        self.check_inputs(inputs)
        call = self._call if torch.is_grad_enabled() else self._inference_call
        outputs = _RemoteFunction.apply(DUMMY, call, *inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def extra_repr(self) -> str:
        return f"uid={self.uid!r}, peer={self.peer}"


__all__ = ["DHTDirectory", "FetchedState", "RemoteExpert", "as_peer", "call_expert", "fetch_snapshot", "fetch_state",
           "peer_key"]
