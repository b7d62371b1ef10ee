"""The circuit relay v2 hop service: reservations, and circuits spliced between two streams."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from volunteer.errors import RemoteProtocolError, VolunteerError, describe
from volunteer.net.events import PeerDisconnected
from volunteer.net.identity import PeerID
from volunteer.net.nat import circuit
from volunteer.net.nat.circuit import HopMessage, Limit, StopMessage
from volunteer.net.resources import ResourceManager
from volunteer.net.connection import NetStream
from volunteer.net.service import BaseService, Handler, HostAPI
from volunteer.net.streams import BufferedStream

from .limits import RelayLimits
from .resources import RelayResources

log = logging.getLogger(__name__)

def _ip_of(addr) -> str:
    for name in ("ip4", "ip6"):
        value = addr.value_for(name)
        if value:
            return value
    return str(addr)


class HopService(BaseService):
    """Serves `/libp2p/circuit/relay/0.2.0/hop` within RelayLimits, as a Host service:
    ``open_stack(..., services=[HopService(limits)])`` or ``await host.add_service(...)``.

    ``wall_clock`` gives UNIX time for the reservation's ``expire`` field on the wire; all
    accounting uses the trio clock (monotonic, MockClock in tests).
    """

    def __init__(self, limits: RelayLimits | None = None, *, wall_clock: Callable[[], float] = time.time) -> None:
        self.limits = limits or RelayLimits()
        self.resources = RelayResources(self.limits)
        self.wall_clock = wall_clock
        self.active: dict[int, tuple[PeerID, PeerID, list[int]]] = {}  # circuit id -> (src, dst, [up, down])
        self._circuit_ids = 0

    @property
    def limit(self) -> Limit:
        """The circuit limits every reservation and circuit announces."""
        return Limit(duration=int(self.limits.circuit_duration), data=self.limits.circuit_data)

    def handlers(self) -> dict[str, Handler]:
        return {circuit.HOP: self.handle}

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Drop the reservation of a peer once its last connection to us is gone."""
        self.host = host
        with host.events.subscribe(PeerDisconnected) as events:
            task_status.started()
            async for event in events:
                if isinstance(event, PeerDisconnected) and not host.connections(event.peer):
                    self.resources.drop_reservation(event.peer)

    async def handle(self, stream: NetStream) -> None:
        """Serve one hop stream: a RESERVE or a CONNECT (then splice the circuit until it ends)."""
        buffered = BufferedStream(stream)
        try:
            message = await circuit.read_message(buffered, HopMessage)
        except RemoteProtocolError as exc:
            log.info("malformed hop message from %s: %s", stream.remote_peer.short(), exc)
            self.resources.refused("MALFORMED_MESSAGE")
            await self._status(stream, circuit.MALFORMED_MESSAGE)
            return
        if message.type == HopMessage.RESERVE:
            await self._reserve(stream)
        elif message.type == HopMessage.CONNECT:
            await self._connect(stream, buffered, message)
        else:
            self.resources.refused("UNEXPECTED_MESSAGE")
            await self._status(stream, circuit.UNEXPECTED_MESSAGE)

    async def _status(self, stream, status: int, **fields) -> None:
        reply = HopMessage(type=HopMessage.STATUS, status=status, **fields)
        try:
            await circuit.write_message(stream, reply)
            await stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _reserve(self, stream) -> None:
        conn = stream.connection
        if conn.remote_addr.is_relayed():
            # A reservation over a relayed connection would make us a relay of relays: refuse.
            self.resources.refused("PERMISSION_DENIED")
            await self._status(stream, circuit.PERMISSION_DENIED)
            return
        peer = stream.remote_peer
        status, expires = self.resources.reserve(peer, _ip_of(conn.remote_addr), trio.current_time())
        if status != circuit.OK:
            await self._status(stream, status)
            return
        expire_unix = int(self.wall_clock() + (expires - trio.current_time()))
        reservation = circuit.circuit_pb2.Reservation(
            expire=expire_unix,
            addrs=[addr.to_bytes() for addr in self.host.full_addrs()],
            voucher=circuit.make_voucher(self.host.keypair, peer, expire_unix),
        )
        log.info("reservation for %s until %d", peer.short(), expire_unix)
        await self._status(stream, circuit.OK, reservation=reservation, limit=self.limit.to_pb())

    async def _connect(self, stream, buffered: BufferedStream, message) -> None:
        source = stream.remote_peer
        try:
            target = circuit.peer_of(message)
        except RemoteProtocolError:
            self.resources.refused("MALFORMED_MESSAGE")
            await self._status(stream, circuit.MALFORMED_MESSAGE)
            return
        if stream.connection.remote_addr.is_relayed():
            self.resources.refused("PERMISSION_DENIED")
            await self._status(stream, circuit.PERMISSION_DENIED)
            return
        status = self.resources.open_circuit(source, target, trio.current_time())
        if status != circuit.OK:
            await self._status(stream, status)
            return
        # The splice holds up to one buffer per direction: reserve both from the source peer's
        # memory first, so a circuit flood is bounded by that peer's budget, not by the relay's RAM.
        manager = self.host.service(ResourceManager)
        buffers = None
        if manager is not None:
            buffers = manager.reserve_for_peer(source, 2 * self.limits.buffer_size, kind="circuit", now=trio.current_time())
            if buffers is None:
                self.resources.close_circuit(source, target)
                self.resources.refused("RESOURCE_LIMIT_EXCEEDED")
                await self._status(stream, circuit.RESOURCE_LIMIT_EXCEEDED)
                return
        try:
            stop = await self._open_stop(source, target)
            if stop is None:
                self.resources.refused("CONNECTION_FAILED")
                await self._status(stream, circuit.CONNECTION_FAILED)
                return
            await circuit.write_message(stream, HopMessage(type=HopMessage.STATUS, status=circuit.OK, limit=self.limit.to_pb()))
            await self._splice(source, target, buffered, stop)
        finally:
            self.resources.close_circuit(source, target)
            if buffers is not None:
                buffers.close()

    async def _open_stop(self, source: PeerID, target: PeerID) -> BufferedStream | None:
        conn = self.host.connection_to(target)
        if conn is None:
            return None
        try:
            with trio.fail_after(self.limits.stop_timeout):
                stop = BufferedStream(await conn.new_stream([circuit.STOP]))
                request = StopMessage(type=StopMessage.CONNECT, limit=self.limit.to_pb())
                request.peer.id = source.to_bytes()
                await circuit.write_message(stop, request)
                reply = await circuit.read_message(stop, StopMessage)
        except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.info("stop CONNECT to %s failed: %s", target.short(), describe(exc))
            return None
        if reply.type != StopMessage.STATUS or reply.status != circuit.OK:
            await stop.reset()
            return None
        return stop

    async def _splice(self, source: PeerID, target: PeerID, a: BufferedStream, b: BufferedStream) -> None:
        """Copy both ways until both sides finish, a limit is hit (then reset both), or an error."""
        self._circuit_ids += 1
        circuit_id = self._circuit_ids
        counts = [0, 0]
        self.active[circuit_id] = (source, target, counts)
        over_limit = False

        async def pump(reader: BufferedStream, writer: BufferedStream, index: int) -> None:
            nonlocal over_limit
            while True:
                data = await reader.receive_some(self.limits.buffer_size)
                if not data:
                    await writer.send_eof()
                    return
                counts[index] += len(data)
                self.resources.bytes_relayed += len(data)
                self.resources.bytes_by_direction[index] += len(data)
                if self.limits.circuit_data and counts[index] > self.limits.circuit_data:
                    over_limit = True
                    raise RemoteProtocolError("circuit data limit exceeded")
                await writer.send_all(data)

        try:
            with trio.move_on_after(self.limits.circuit_duration) as deadline:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pump, a, b, 0)
                    nursery.start_soon(pump, b, a, 1)
            if deadline.cancelled_caught:
                over_limit = True
        except* (RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, VolunteerError):
            pass
        finally:
            del self.active[circuit_id]
            if over_limit:
                self.resources.refused("circuit_limit")
                log.info("circuit %s -> %s hit its limit: reset", source.short(), target.short())
            with trio.CancelScope(shield=True):
                for stream in (a, b):
                    try:
                        await (stream.reset() if over_limit else stream.aclose())
                    except (trio.BrokenResourceError, trio.ClosedResourceError, VolunteerError):
                        pass
