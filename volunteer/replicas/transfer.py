"""State transfer ``/volunteer/<swarm>/expert-state/1.0.0``: the trio driver (messages.py holds
the wire format, state.py the adapter, store.py what is served).

``StateService`` is a Host service serving a ``BackendStore``: fetches of hosted experts' states
and pushes (hand-off) into it; a full volunteer asks ``make_room`` to free a slot for a push, and
``on_accepted`` hears of every expert a push made it host (the replica manager declares it).
``fetch_state`` downloads a state, ``catch_up`` loads one into a backend before it is declared,
``push_state`` hands a state to another volunteer. Every exchange is bounded: the request by
``request_timeout``, the whole transfer by ``transfer_timeout``, payloads by ``max_state_bytes``,
concurrent transfers served by ``max_concurrent_transfers``.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import trio

from ..errors import RemoteProtocolError, describe
from ..experts.backend import ExpertBackend
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.service import BaseService, Handler, HostAPI
from ..net.streams import BufferedStream, close_quietly
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
from .state import ExportedState, import_state, module_layout, verify_payload
from .store import AcceptedHook, BackendStore, HostingRuntime, MakeRoomHook

log = logging.getLogger(__name__)

Target = PeerID | Multiaddr | str  # whom a transfer dials: a peer the Host knows, or an address


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


async def send_chunks(stream: Any, chunks: Any) -> None:
    """Write a payload's chunks in order."""
    for chunk in chunks:
        await stream.send_all(chunk)


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
    ) -> None:
        self.protocol = state_protocol(swarm_id)
        self.store = store
        self.config = config
        self.make_room = make_room
        self.on_accepted = on_accepted
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
                    await send_chunks(reader, exported.chunks)
                    self.served += 1
                else:
                    await self._take_push(reader, request)
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

    async def _take_push(self, reader: BufferedStream, header: StateHeader) -> None:
        await self._admit(header)  # refusal before the payload is sent
        await reader.send_all(pack({"ok": True}, self.config))
        payload = await receive_payload(reader, header.total, self.config)
        verify_payload(header, payload)
        hosted_before = header.uid in self.store.backends
        version = await self.store.receive(header, payload)
        self.received += 1
        backend = self.store.backends.get(header.uid)
        if not hosted_before and backend is not None and self.on_accepted is not None:
            result = self.on_accepted(backend)
            if inspect.isawaitable(result):
                await result
        await reader.send_all(pack({"ok": True, "v": version}, self.config))

    async def _admit(self, header: StateHeader) -> None:
        """The store's ``offer``, except that a full volunteer first asks ``make_room`` to free a
        slot (a leaver's sole copy is worth more here than a second copy of an expert others hold)."""
        try:
            self.store.offer(header)
        except StateRefusedError as exc:
            if exc.code != "full" or self.make_room is None or not await self.make_room(header.uid):
                raise
            self.store.offer(header)

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
    host: HostAPI, peer: Target, request: FetchRequest, *, swarm_id: str, config: ReplicasConfig = DEFAULT_CONFIG
) -> tuple[StateHeader, bytearray]:
    """Download the state ``request`` names from ``peer`` (a PeerID or a multiaddr): its header
    and verified payload. StateRefusedError / StateMismatchError when the peer refuses or sends
    another expert's state, StateProtocolError for bad bytes or hash, StateTimeoutError."""
    try:
        with trio.fail_after(config.transfer_timeout):
            reader = await _open(host, peer, swarm_id)
            try:
                await reader.send_all(pack(request.to_wire(), config))
                reply = check_reply(await receive_message(reader, config, "state reply"))
                header = StateHeader.from_wire(reply.get("h"), config)
                module = {m for m in header.tensors if m.name.startswith("m:")}
                if (header.uid, header.expert_class, header.hidden_dim, module) != (
                    request.uid, request.expert_class, request.hidden_dim, set(request.tensors)
                ):
                    raise StateMismatchError(f"{peer} sent a state that is not {request.uid!r} as this volunteer builds it")
                payload = await receive_payload(reader, header.total, config)
                verify_payload(header, payload)
                return header, payload
            finally:
                await close_quietly(reader)
    except trio.TooSlowError:
        raise StateTimeoutError(f"state of {request.uid!r} from {peer} took over {config.transfer_timeout:.0f} s") from None


async def catch_up(
    host: HostAPI,
    peer: Target,
    backend: ExpertBackend,
    *,
    swarm_id: str,
    runtime: HostingRuntime | None = None,
    config: ReplicasConfig = DEFAULT_CONFIG,
) -> StateHeader:
    """Load the freshest replica's state (``peer``) into ``backend`` before declaring it: the
    joiner then serves the current weights, never random ones. Through ``runtime.run_sync`` when
    a runtime already serves the backend."""
    header, payload = await fetch_state(host, peer, request_for(backend), swarm_id=swarm_id, config=config)
    if runtime is not None:
        await runtime.run_sync(import_state, backend, header, payload)
    else:
        import_state(backend, header, payload)
    return header


async def push_state(
    host: HostAPI, peer: Target, exported: ExportedState, *, swarm_id: str, config: ReplicasConfig = DEFAULT_CONFIG
) -> int:
    """Hand a state to ``peer``, which hosts it from then on; returns the version it hosts.
    StateRefusedError (``full``, ``unknown``, ``mismatch``, ``busy``) when it will not take it."""
    try:
        with trio.fail_after(config.transfer_timeout):
            reader = await _open(host, peer, swarm_id)
            try:
                await reader.send_all(pack({"op": "push", "h": exported.header.to_wire()}, config))
                check_reply(await receive_message(reader, config, "push reply"))
                await send_chunks(reader, exported.chunks)
                done = check_reply(await receive_message(reader, config, "push result"))
                version = done.get("v")
                if type(version) is not int:
                    raise StateProtocolError("push result carries no version")
                return version
            finally:
                await close_quietly(reader)
    except trio.TooSlowError:
        raise StateTimeoutError(f"push of {exported.header.uid!r} to {peer} took over {config.transfer_timeout:.0f} s") from None


__all__ = ["StateService", "catch_up", "fetch_state", "push_state", "request_for"]
