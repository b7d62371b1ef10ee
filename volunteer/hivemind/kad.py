"""Peer routing over ``/ipfs/kad/1.0.0``, as a Host service: hivemind's daemons (go-libp2p-kad-dht
inside p2pd) find our node by peer id through peers we share, and we find theirs.

    kad = KadPeerRouting()
    await host.add_service(kad)
    addrs = await kad.find_peer(peer)   # asks connected peers FIND_NODE(peer), nearest first

Answering: each inbound stream carries up to ``max_requests_per_stream`` requests (go reuses its
streams), each answered from the peers we know with addresses (connected ones and the peerstore),
behind the ``hivemind-kad`` door (``door.Door``: a request's bytes reserved as announced, at most
``KadLimits.door.max_request``, and due at its pace once it has started).
Asking: an iterative lookup, ``alpha`` peers a round for at most ``max_rounds`` rounds, every
answer's addresses kept in the peerstore. Wire formats are in ``kad_wire`` (pure).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import trio

from ..errors import VolunteerError, describe
from ..net.connection import NetStream
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.service import BaseService, Handler, HostAPI
from ..net.streams import close_quietly, reset_quietly
from . import kad_wire as wire
from .door import SLOW_BODY, Door, Reservation, door_for
from .errors import HivemindError, HivemindTooSlow
from .framing import DelimitedDecoder
from .limits import DEFAULT_KAD_LIMITS, KadLimits
from .pb.hm_kad_pb2 import Message
from .rpc import receive_paced

log = logging.getLogger(__name__)
DOOR = "hivemind-kad"  # the scope kind of what kad callers hold, and of its refusals
# how many peerstore entries an answer is chosen from (the peerstore is bounded; this bounds the work)
MAX_CANDIDATES = 4096

_NETWORK_ERRORS = (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError)


class _MessageReader:
    """Reads uvarint-delimited kad messages off one stream, keeping bytes that follow a message.
    With a ``door`` (serving), a message is bounded by its ``max_request``, its announced length
    is reserved before its body is read (``held``; released by the caller once it is answered),
    and once it has started its bytes must keep the door's pace."""

    def __init__(self, stream: NetStream, limits: KadLimits, door: Door | None = None) -> None:
        self.stream = stream
        self.limits = limits
        self.door = door
        self.held: Reservation | None = None
        self._pending = b""

    async def next(self) -> Message | None:
        """The next message, or None at a clean end of stream."""
        door = self.door
        decoder = DelimitedDecoder(door.max_request if door is not None else self.limits.max_message)
        pace = None
        data: bytes | bytearray
        data, self._pending = self._pending, b""
        while True:
            if data:
                if door is not None and pace is None:
                    pace = door.pace(trio.current_time())  # the message has started
                body = decoder.receive_data(data)
                if door is not None and self.held is None and decoder.announced is not None:
                    self.held = door.open(self.stream.remote_peer, self.stream.connection.remote_addr)
                    self.held.grow(decoder.announced, trio.current_time())  # HivemindBusy: the stream is reset
                if body is not None:
                    self._pending = decoder.trailing
                    return wire.parse_message(body)
            data = await receive_paced(self.stream, pace)  # no pace between messages: idle_timeout
            if not data:
                if decoder.started:
                    raise HivemindError("stream ended inside a kad message")
                return None

    def release(self) -> None:
        """Give back what the last message held."""
        if self.held is not None:
            self.held.release()
            self.held = None


class KadPeerRouting(BaseService):
    """Answers and asks ``/ipfs/kad/1.0.0`` FIND_NODE and PING."""

    def __init__(self, limits: KadLimits = DEFAULT_KAD_LIMITS) -> None:
        self.limits = limits
        self._door: Door | None = None  # the Host's resource manager is known once we run
        self.answered = 0

    def handlers(self) -> Mapping[str, Handler]:
        return {wire.PROTOCOL: self._serve}

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        self._door = door_for(host, DOOR, self.limits.door)
        task_status.started()

    # --- answering -------------------------------------------------------------------------------

    def known_peers(self) -> list[wire.KnownPeer]:
        """The peers we can name in answers: those with addresses in the peerstore."""
        known = []
        for peer in self.host.peerstore.peers()[-MAX_CANDIDATES:]:
            if peer == self.host.peer_id:
                continue
            addrs = self.host.peerstore.addrs(peer)
            if addrs:
                known.append(wire.KnownPeer(peer, tuple(addrs), self.host.is_connected(peer)))
        return known

    @property
    def door(self) -> Door:
        """What kad callers may make us hold (their requests' bytes, reserved as announced)."""
        if self._door is None:
            raise HivemindError("kad peer routing is not running yet")
        return self._door

    async def _serve(self, stream: NetStream) -> None:
        reader = _MessageReader(stream, self.limits, self.door)
        try:
            for _ in range(self.limits.max_requests_per_stream):
                with trio.move_on_after(self.limits.idle_timeout):
                    request = await reader.next()
                    if request is None:
                        break
                    reply = wire.answer(request, self.known_peers(), stream.remote_peer, self.limits)
                    await stream.send_all(wire.delimited(reply, self.limits))
                    reader.release()
                    self.answered += 1
                    continue
                break  # idle past the timeout
        except HivemindTooSlow:
            self.door.refuse(SLOW_BODY, stream.remote_peer, now=trio.current_time())
            raise
        finally:
            reader.release()
        await close_quietly(stream)

    # --- asking ----------------------------------------------------------------------------------

    async def request(self, peer: PeerID, message: Message) -> Message:
        """Send ``message`` to ``peer`` on a fresh kad stream; its answer."""
        with trio.fail_after(self.limits.rpc_timeout):
            stream = await self.host.new_stream(peer, [wire.PROTOCOL])
            try:
                await stream.send_all(wire.delimited(message, self.limits))
                reply = await _MessageReader(stream, self.limits).next()
            except BaseException:
                await reset_quietly(stream)
                raise
        await close_quietly(stream)
        if reply is None:
            raise HivemindError(f"{peer.short()} closed the kad stream without an answer")
        return reply

    async def ping(self, peer: PeerID) -> bool:
        """Whether ``peer`` answers a kad PING."""
        try:
            reply = await self.request(peer, wire.ping_request())
        except _NETWORK_ERRORS as exc:
            log.debug("kad ping to %s failed: %s", peer.short(), describe(exc))
            return False
        return reply.type == Message.PING

    async def find_peer(self, target: PeerID) -> list[Multiaddr]:
        """``target``'s addresses: from the peerstore if known, else by asking the peers nearest
        it, starting from those we are connected to. Raises HivemindError when no one knows."""
        host = self.host
        known = host.peerstore.addrs(target)
        if known:
            return known
        connected = [wire.KnownPeer(c.remote_peer, (), True) for c in host.connections()]
        candidates = {known.peer: known for known in connected if known.peer != target}
        asked: set[PeerID] = set()
        found: list[Multiaddr] = []
        key = target.to_bytes()

        async def ask(peer: PeerID) -> None:
            try:
                reply = await self.request(peer, wire.find_node_request(target))
            except _NETWORK_ERRORS as exc:
                log.debug("kad FIND_NODE at %s failed: %s", peer.short(), describe(exc))
                return
            for closer in wire.closer_peers(reply, self.limits):
                if closer.peer == host.peer_id or not closer.addrs:
                    continue
                host.peerstore.add_addrs(closer.peer, list(closer.addrs))
                if closer.peer == target:
                    found.extend(closer.addrs)
                elif closer.peer not in candidates:
                    candidates[closer.peer] = closer

        for _ in range(self.limits.max_rounds):
            batch = [p.peer for p in wire.nearest(key, candidates.values(), len(candidates)) if p.peer not in asked]
            batch = batch[: self.limits.alpha]
            if not batch or found:
                break
            asked.update(batch)
            async with trio.open_nursery() as nursery:
                for peer in batch:
                    nursery.start_soon(ask, peer)
        if not found:
            raise HivemindError(f"no peer we asked knows where {target.short()} is (kad FIND_NODE)")
        return host.peerstore.addrs(target)

    async def connect(self, target: PeerID) -> None:
        """A connection to ``target`` by peer id alone (its addresses found through kad)."""
        if not self.host.is_connected(target):
            await self.find_peer(target)
            await self.host.connect(target)


async def ensure_routable(host: HostAPI, peer: PeerID) -> None:
    """Make ``peer`` dialable by id: when we are not connected and know no address of it, find its
    addresses through kad (if the host runs ``KadPeerRouting``). Raises HivemindError if no one knows."""
    kad = host.service(KadPeerRouting)
    if kad is not None and not host.is_connected(peer) and not host.peerstore.addrs(peer):
        await kad.find_peer(peer)


__all__ = ["KadPeerRouting", "ensure_routable"]
