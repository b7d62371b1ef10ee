"""State transfer ``/volunteer/<swarm>/expert-state/1.0.0``: the trio driver (messages.py holds
the wire format, state.py the adapter, store.py what is served).

``StateService`` is a Host service serving a ``BackendStore``: fetches of hosted experts' states
and pushes (hand-off) into it. A push is a claim: it is taken only for a uid not hosted here,
and, when a ``vouch`` is given (the replica manager's DHT lookup), only from a peer that declares
the uid as its sole live host (a leaver handing off the last copy); a full volunteer then asks
``make_room`` to free a slot, and ``on_accepted`` hears of every expert a push made it host (the
replica manager declares it). ``refusals`` counts refused pushes by reason.
``fetch_state`` downloads a state, ``catch_up`` loads one into a backend before it is declared,
``push_state`` hands a state to another volunteer. Every exchange is bounded: the request by
``request_timeout``, the whole transfer by ``transfer_timeout``, payloads by ``max_state_bytes``,
concurrent transfers served by ``max_concurrent_transfers``.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import trio

from ..errors import RemoteProtocolError, describe
from ..experts.backend import ExpertBackend
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.service import BaseService, Handler, HostAPI
from ..net.streams import BufferedStream, close_quietly
from ..net.upload import CATCH_UP, HAND_OFF, UploadMeter, send_metered
from .config import DEFAULT_CONFIG, ReplicasConfig
from .errors import StateMismatchError, StateProtocolError, StateRefusedError, StateTimeoutError
from .messages import (
    FetchRequest,
    StateHeader,
    check_reply,
    pack,
    parse_request,
    refusal,
    state_protocol,
    unpack,
)
from .placement import VERSION_CLAIM, claim_is_suspect
from .state import ExportedState, check_plausible, import_state, module_layout, verify_payload
from .store import AcceptedHook, BackendStore, HostingRuntime, MakeRoomHook

log = logging.getLogger(__name__)

Target = PeerID | Multiaddr | str  # whom a transfer dials: a peer the Host knows, or an address
UNSOLICITED_PUSH = "unsolicited_push"  # a push refused: hosted here, not declared, or replicated


@dataclass(frozen=True)
class PushClaim:
    """What the DHT says of a pusher and the uid it pushes: whether it declares the uid, and
    whether it is the uid's only live host (a hand-off is for sole copies)."""

    declared: bool
    sole: bool
    version: int | None = None  # what the pusher last declared for the uid, if the DHT showed it


def handed_off_version(pushed: int, claim: PushClaim | None, *, factor: float, margin: int) -> int:
    """The version a receiver hosts a handed-off state at. A header's version is the pusher's
    bare word: it stands only while it is not a suspect claim (``placement.claim_is_suspect``)
    beside what the pusher declared for the uid in its signed record (``claim.version``; 0 when
    no declaration of it was seen, only its tombstone), else the declared version is taken. A
    declaration lags a heartbeat behind training, hence the margin rather than a plain minimum.
    Without a ``vouch`` (no DHT to ask) the header is all there is."""
    if claim is None:
        return pushed
    declared = claim.version or 0
    return declared if claim_is_suspect(pushed, [declared], factor=factor, margin=margin) else pushed


# asked of every push (pusher's peer id, uid): the replica manager looks the uid up in the DHT
PushVouch = Callable[[str, str], Awaitable[PushClaim]]


async def receive_message(reader: BufferedStream, config: ReplicasConfig, what: str) -> dict:
    """One framed msgpack message (bounded by ``max_message``)."""
    try:
        return unpack(await reader.receive_length_prefixed(config.max_message, what))
    except RemoteProtocolError as exc:
        if isinstance(exc, StateProtocolError):
            raise
        raise StateProtocolError(str(exc)) from None


async def receive_payload(reader: BufferedStream, total: int, config: ReplicasConfig) -> bytearray:
    """Exactly ``total`` payload bytes (already bounded by the validated header)."""
    payload = bytearray()
    while len(payload) < total:
        chunk = await reader.receive_some(min(total - len(payload), config.chunk_size))
        if not chunk:
            raise StateProtocolError(f"payload truncated: {len(payload)} of {total} bytes arrived")
        payload += chunk
    return payload


async def send_chunks(stream: Any, chunks: Any, upload: UploadMeter | None = None, purpose: str = CATCH_UP) -> None:
    """Write a payload's chunks in order, through the volunteer's upload meter when given."""
    await send_metered(stream, chunks, upload, purpose)


class StateService(BaseService):
    """Serves a store's expert states over the swarm's state-transfer protocol."""

    def __init__(
        self,
        swarm_id: str,
        store: BackendStore,
        config: ReplicasConfig = DEFAULT_CONFIG,
        *,
        make_room: MakeRoomHook | None = None,
        on_accepted: AcceptedHook | None = None,
        vouch: PushVouch | None = None,
        upload: UploadMeter | None = None,
    ) -> None:
        self.protocol = state_protocol(swarm_id)
        self.upload = upload  # the volunteer's shared upload cap: states served count against it
        self.store = store
        self.config = config
        self.make_room = make_room
        self.on_accepted = on_accepted
        self.vouch = vouch
        self.refusals: Counter[str] = Counter()  # pushes refused as claims, by reason
        self.active = 0
        self.served = 0  # fetches answered with a state
        self.received = 0  # pushes taken
        self.refused = 0

    def handlers(self) -> dict[str, Handler]:
        return {self.protocol: self._serve}

    async def _serve(self, stream: Any) -> None:
        reader = BufferedStream(stream)
        self.active += 1
        try:
            with trio.fail_after(self.config.request_timeout):
                request = parse_request(await receive_message(reader, self.config, "state request"), self.config)
            if self.active > self.config.max_concurrent_transfers:
                raise StateRefusedError("too many state transfers at once; try again later", "busy")
            with trio.fail_after(self.config.transfer_timeout):
                if isinstance(request, FetchRequest):
                    exported = await self.store.export(request)
                    await reader.send_all(pack({"ok": True, "h": exported.header.to_wire()}, self.config))
                    await send_chunks(reader, exported.chunks, self.upload, CATCH_UP)
                    self.served += 1
                else:
                    await self._take_push(reader, request, str(stream.remote_peer))
        except StateRefusedError as exc:
            self.refused += 1
            await self._try_send(reader, refusal(exc.code, str(exc)))
        except StateProtocolError as exc:
            log.debug("bad state request from %s: %s", stream.remote_peer.short(), describe(exc))
            await self._try_send(reader, refusal("error", str(exc)))
        except trio.TooSlowError:
            log.debug("state transfer with %s timed out", stream.remote_peer.short())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away: nobody to tell
        finally:
            self.active -= 1
            await close_quietly(reader)

    async def _take_push(self, reader: BufferedStream, header: StateHeader, pusher: str) -> None:
        claim = await self._admit(header, pusher)  # refusal before the payload is sent
        await reader.send_all(pack({"ok": True}, self.config))
        payload = await receive_payload(reader, header.total, self.config)
        verify_payload(header, payload)
        hosted_before = header.uid in self.store.backends
        version = handed_off_version(
            header.version, claim, factor=self.config.version_claim_factor, margin=self.config.version_claim_margin
        )
        if version != header.version:
            self.refusals[VERSION_CLAIM] += 1
            log.warning("%s pushed %s claiming version %d; hosting it at %d, what it declared",
                        pusher, header.uid, header.version, version)
        version = await self.store.receive(header, payload, version=version)
        self.received += 1
        backend = self.store.backends.get(header.uid)
        if not hosted_before and backend is not None and self.on_accepted is not None:
            result = self.on_accepted(backend)
            if inspect.isawaitable(result):
                await result
        await reader.send_all(pack({"ok": True, "v": version}, self.config))

    async def _admit(self, header: StateHeader, pusher: str) -> PushClaim | None:
        """Refuse a push that is not a hand-off of a sole copy (see the module docstring); then
        the store's ``offer``, except that a full volunteer first asks ``make_room`` to free a slot
        (a leaver's sole copy is worth more here than a second copy of an expert others hold), and
        only for a claim the ``vouch`` verified."""
        if header.uid in self.store.backends:
            self.refusals[UNSOLICITED_PUSH] += 1
            self.store.offer(header)  # raises "hosted"
        claim = None
        if self.vouch is not None:
            claim = await self.vouch(pusher, header.uid)
            if not claim.declared or not claim.sole:
                self.refusals[UNSOLICITED_PUSH] += 1
                if not claim.declared:
                    raise StateRefusedError(f"{pusher} does not declare {header.uid!r}: nothing to hand off", "unknown")
                raise StateRefusedError(f"other live hosts hold {header.uid!r}: a hand-off is for sole copies", "replicated")
        try:
            self.store.offer(header)
        except StateRefusedError as exc:
            if exc.code != "full" or claim is None or self.make_room is None or not await self.make_room(header.uid):
                raise
            self.store.offer(header)
        return claim

    async def _try_send(self, reader: BufferedStream, message: dict) -> None:
        try:
            await reader.send_all(pack(message, self.config))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def request_for(backend: ExpertBackend) -> FetchRequest:
    """The fetch request for the state of ``backend``'s uid, class and tensors."""
    return FetchRequest(backend.uid, backend.expert_class, backend.hidden_dim, module_layout(backend))


async def _open(host: HostAPI, peer: Target, swarm_id: str) -> BufferedStream:
    return BufferedStream(await host.new_stream(peer, [state_protocol(swarm_id)]))


async def fetch_state(
    host: HostAPI,
    peer: Target,
    request: FetchRequest,
    *,
    swarm_id: str,
    config: ReplicasConfig = DEFAULT_CONFIG,
    paced: bool = False,
) -> tuple[StateHeader, bytearray]:
    """Download the state ``request`` names from ``peer`` (a PeerID or a multiaddr): its header
    and verified payload. StateRefusedError / StateMismatchError when the peer refuses or sends
    another expert's state, StateProtocolError for bad bytes or hash, StateTimeoutError.
    ``paced`` (catch-up): the header must come within ``catch_up_header_timeout`` and the payload
    at ``catch_up_min_rate`` at least, so a source that stalls is dropped in seconds."""
    try:
        with trio.fail_after(config.transfer_timeout):
            with trio.fail_after(config.catch_up_header_timeout) if paced else _unbounded():
                reader = await _open(host, peer, swarm_id)
            try:
                with trio.fail_after(config.catch_up_header_timeout) if paced else _unbounded():
                    await reader.send_all(pack(request.to_wire(), config))
                    reply = check_reply(await receive_message(reader, config, "state reply"))
                header = StateHeader.from_wire(reply.get("h"), config)
                module = {m for m in header.tensors if m.name.startswith("m:")}
                if (header.uid, header.expert_class, header.hidden_dim, module) != (
                    request.uid, request.expert_class, request.hidden_dim, set(request.tensors)
                ):
                    raise StateMismatchError(f"{peer} sent a state that is not {request.uid!r} as this volunteer builds it")
                payload_time = config.catch_up_header_timeout + header.total / config.catch_up_min_rate
                with trio.fail_after(payload_time) if paced else _unbounded():
                    payload = await receive_payload(reader, header.total, config)
                verify_payload(header, payload)
                return header, payload
            finally:
                await close_quietly(reader)
    except trio.TooSlowError:
        raise StateTimeoutError(f"state of {request.uid!r} from {peer} did not arrive in time") from None


def _unbounded() -> trio.CancelScope:
    return trio.CancelScope()


async def catch_up(
    host: HostAPI,
    peer: Target,
    backend: ExpertBackend,
    *,
    swarm_id: str,
    runtime: HostingRuntime | None = None,
    config: ReplicasConfig = DEFAULT_CONFIG,
) -> StateHeader:
    """Load a replica's state (``peer``) into ``backend`` before declaring it: the joiner then
    serves trained weights, never random ones. Paced (``fetch_state``), and checked before it is
    loaded (``check_plausible``: finite, at a trained expert's scale). Through
    ``runtime.run_sync`` when a runtime already serves the backend."""
    header, payload = await fetch_state(host, peer, request_for(backend), swarm_id=swarm_id, config=config, paced=True)
    return await load_caught_up(backend, header, payload, runtime=runtime, config=config)


async def load_caught_up(
    backend: ExpertBackend,
    header: StateHeader,
    payload: bytes | bytearray,
    *,
    runtime: HostingRuntime | None = None,
    config: ReplicasConfig = DEFAULT_CONFIG,
) -> StateHeader:
    """Check a fetched state (``check_plausible``) and load it into ``backend``; its header."""
    if runtime is not None:
        await runtime.run_sync(check_plausible, backend, header, payload, config.plausible_norm_ratio)
        await runtime.run_sync(import_state, backend, header, payload)
    else:  # tensor work on up to max_state_bytes: in a thread, off the event loop
        await trio.to_thread.run_sync(check_plausible, backend, header, payload, config.plausible_norm_ratio)
        await trio.to_thread.run_sync(import_state, backend, header, payload)
    return header


async def push_state(
    host: HostAPI,
    peer: Target,
    exported: ExportedState,
    *,
    swarm_id: str,
    config: ReplicasConfig = DEFAULT_CONFIG,
    upload: UploadMeter | None = None,
) -> int:
    """Hand a state to ``peer``, which hosts it from then on; returns the version it hosts.
    StateRefusedError (``full``, ``unknown``, ``mismatch``, ``busy``) when it will not take it."""
    try:
        with trio.fail_after(config.transfer_timeout):
            reader = await _open(host, peer, swarm_id)
            try:
                await reader.send_all(pack({"op": "push", "h": exported.header.to_wire()}, config))
                check_reply(await receive_message(reader, config, "push reply"))
                await send_chunks(reader, exported.chunks, upload, HAND_OFF)
                done = check_reply(await receive_message(reader, config, "push result"))
                version = done.get("v")
                if type(version) is not int:
                    raise StateProtocolError("push result carries no version")
                return version
            finally:
                await close_quietly(reader)
    except trio.TooSlowError:
        raise StateTimeoutError(f"push of {exported.header.uid!r} to {peer} took over {config.transfer_timeout:.0f} s") from None


__all__ = ["PushClaim", "PushVouch", "StateService", "UNSOLICITED_PUSH", "catch_up", "load_caught_up", "fetch_state", "push_state", "request_for"]
